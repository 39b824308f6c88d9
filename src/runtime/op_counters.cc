#include "runtime/op_counters.h"

#include <fmt/format.h>

#include <map>

#include "runtime/ops.h"

namespace polychip::runtime {

std::vector<OpCounters> OpCountersDelta(const std::vector<OpCounters>& before,
                                        const std::vector<OpCounters>& after) {
  std::map<int32_t, const OpCounters*> old;
  for (const OpCounters& c : before) old[c.op] = &c;
  std::vector<OpCounters> out;
  for (const OpCounters& c : after) {
    OpCounters d = c;
    if (auto it = old.find(c.op); it != old.end()) {
      const OpCounters& b = *it->second;
      d.launches -= b.launches;
      d.device_ns -= b.device_ns;
      d.bytes_read -= b.bytes_read;
      d.bytes_written -= b.bytes_written;
      d.flops -= b.flops;
    }
    if (d.launches > 0) out.push_back(d);
  }
  return out;
}

std::optional<double> DeviceSeconds(const std::vector<OpCounters>& ops) {
  uint64_t ns = 0;
  bool timed = false;
  for (const OpCounters& c : ops) {
    if (!c.has_time) continue;
    timed = true;
    ns += c.device_ns;
  }
  if (!timed) return std::nullopt;
  return ns / 1e9;
}

namespace {

struct Family {
  const char* name;
  const char* help;
  bool (*present)(const OpCounters&);
  double (*value)(const OpCounters&);
};

const Family kFamilies[] = {
    {"polychip_op_launches_total", "Op launches the device ran (plugin counter).",
     [](const OpCounters&) { return true; },
     [](const OpCounters& c) { return static_cast<double>(c.launches); }},
    {"polychip_op_device_seconds_total",
     "Time the device spent in the op, as the plugin measures it.",
     [](const OpCounters& c) { return c.has_time; },
     [](const OpCounters& c) { return c.device_ns / 1e9; }},
    {"polychip_op_read_bytes_total", "Operand bytes the op read (plugin counter).",
     [](const OpCounters& c) { return c.has_bytes; },
     [](const OpCounters& c) { return static_cast<double>(c.bytes_read); }},
    {"polychip_op_written_bytes_total", "Operand bytes the op wrote (plugin counter).",
     [](const OpCounters& c) { return c.has_bytes; },
     [](const OpCounters& c) { return static_cast<double>(c.bytes_written); }},
    {"polychip_op_flops_total", "Arithmetic operations of the op (plugin counter).",
     [](const OpCounters& c) { return c.has_flops; },
     [](const OpCounters& c) { return static_cast<double>(c.flops); }},
};

std::string OpLabel(int32_t op) {
  const char* name = OpName(static_cast<Op>(op));
  return name != nullptr && std::string(name) != "unknown" ? name : "op" + std::to_string(op);
}

}  // namespace

void AppendOpCounterMetrics(const std::vector<const Device*>& devices, std::string* out) {
  struct Sample {
    const Device* device;
    std::vector<OpCounters> ops;
  };
  std::vector<Sample> samples;
  for (const Device* d : devices) {
    if (auto ops = d->backend()->ReadOpCounters(*d)) samples.push_back({d, std::move(*ops)});
  }
  auto labels = [](const Device& d) {
    return fmt::format("backend=\"{}\",device=\"{}\",generation=\"{}\"", d.backend()->name(),
                       d.logical_id(), d.backend()->generation());
  };
  for (const Family& f : kFamilies) {
    std::string lines;
    for (const Sample& s : samples) {
      for (const OpCounters& c : s.ops) {
        if (!f.present(c)) continue;
        lines += fmt::format("{}{{{},op=\"{}\"}} {}\n", f.name, labels(*s.device), OpLabel(c.op),
                             f.value(c));
      }
    }
    if (lines.empty()) continue;
    *out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", f.name, f.help, f.name);
    *out += lines;
  }
  // The plugin's own extras (counter_count/counter_get): gauges, as the plugin defines them.
  std::string extras;
  for (const Device* d : devices) {
    for (const auto& [name, value] : d->backend()->ReadCounters(*d)) {
      extras +=
          fmt::format("polychip_plugin_counter{{{},name=\"{}\"}} {}\n", labels(*d), name, value);
    }
  }
  if (!extras.empty()) {
    *out +=
        "# HELP polychip_plugin_counter A counter the device plugin defines (counter_get).\n"
        "# TYPE polychip_plugin_counter gauge\n";
    *out += extras;
  }
}

}  // namespace polychip::runtime
