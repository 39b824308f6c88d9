#include "api/plugin_listing.h"

#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "runtime/comm.h"
#include "runtime/device.h"

namespace polychip::api {
namespace {

using nlohmann::json;
using runtime::PluginKind;

std::mutex& RegisteredMutex() {
  static std::mutex mu;
  return mu;
}
std::set<std::pair<PluginKind, std::string>>& Registered() {
  static auto* names = new std::set<std::pair<PluginKind, std::string>>();
  return *names;
}
bool IsRegisteredByProgram(PluginKind kind, const std::string& name) {
  std::lock_guard<std::mutex> lock(RegisteredMutex());
  return Registered().count({kind, name}) > 0;
}

std::string Abi(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

json DeviceJson(const runtime::DeviceProps& p, int32_t physical, int32_t logical) {
  json d = {
      {"physical", physical},
      {"name", p.name},
      {"physical_id", p.physical_id},
      {"total_memory", p.total_memory},
      {"free_memory", p.free_memory},
      {"alignment", p.alignment},
      {"max_alloc_size", p.max_alloc_size},
      {"flags", p.FlagNames()},
      {"priority_low", p.priority_low},
      {"priority_high", p.priority_high},
      {"compute_units", p.compute_units},
  };
  d["logical"] = logical >= 0 ? json(logical) : json(nullptr);
  return d;
}

std::string Bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(b) / (1ull << 30));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(b) / (1ull << 20));
  }
  return buf;
}

// Where a plugin in the listing came from.
std::string Origin(PluginKind kind, const std::string& name, bool selected,
                   const std::string& selected_by) {
  if (IsRegisteredByProgram(kind, name)) return kRegisteredByProgram;
  if (selected) return "selected by " + (selected_by.empty() ? std::string("code") : selected_by);
  return "discovered";
}

// `selected`: the backend the configuration chose (or, with none configured, the best one
// discovered); logical device ids apply to it only.
StatusOr<json> BackendJson(const std::shared_ptr<runtime::Backend>& b, bool selected,
                           const runtime::RuntimeConfig& config) {
  const bool configured = selected && config.backend.has_value();
  json jb = {{"name", b->name()},           {"path", b->path()},
             {"version", b->version()},     {"abi", Abi(b->abi_major(), b->abi_minor())},
             {"abi_major", b->abi_major()}, {"abi_minor", b->abi_minor()},
             {"origin", Origin(PluginKind::kBackend, b->name(), configured, config.backend_source)},
             {"devices", json::array()}};
  const std::string env = b->visible_devices_env();
  jb["visible_devices_env"] = env.empty() ? json(nullptr) : json(env);
  PC_ASSIGN_OR_RETURN(int32_t count, b->DeviceCount());
  // Logical ids apply to the selected backend only.
  std::vector<int32_t> logical_of(count, -1);
  if (selected) {
    if (config.devices.empty()) {
      for (int32_t i = 0; i < count; ++i) logical_of[i] = i;
    }
    for (size_t l = 0; l < config.devices.size(); ++l) {
      const int32_t phys = config.devices[l];
      if (phys < 0 || phys >= count) {
        return InvalidArgument("backend '" + b->name() + "' has no device " +
                               std::to_string(phys) + " (" + std::to_string(count) +
                               " visible)");
      }
      logical_of[phys] = static_cast<int32_t>(l);
    }
  }
  for (int32_t i = 0; i < count; ++i) {
    PC_ASSIGN_OR_RETURN(runtime::DeviceProps props, b->GetProps(i));
    jb["devices"].push_back(DeviceJson(props, i, logical_of[i]));
  }
  return jb;
}

}  // namespace

void MarkRegisteredByProgram(PluginKind kind, const std::string& name) {
  std::lock_guard<std::mutex> lock(RegisteredMutex());
  Registered().insert({kind, name});
}

StatusOr<json> ListPlugins(const runtime::RuntimeConfig& config, ListingScope scope) {
  runtime::PluginRegistry& registry = runtime::PluginRegistry::Global();
  runtime::Selection selection;
  json failed = json::array();
  std::vector<std::shared_ptr<runtime::Backend>> backends;
  std::vector<std::shared_ptr<runtime::CommPlugin>> comms;
  if (scope == ListingScope::kSelected) {
    PC_ASSIGN_OR_RETURN(selection, runtime::SelectPlugins(config));
    if (selection.backend) backends.push_back(selection.backend);
    if (selection.comm) comms.push_back(selection.comm);
  } else {
    if (scope == ListingScope::kDiscovered) {
      PC_ASSIGN_OR_RETURN(selection, runtime::SelectPlugins(config, runtime::Discovery::kAll));
      std::vector<runtime::PluginFile> comm_files;
      for (const auto& f :
           runtime::DiscoverPlugins(runtime::PluginSearchPath(config.extra_search_path))) {
        if (f.kind == PluginKind::kComm && !f.shadowed) comm_files.push_back(f);
      }
      for (const auto& f : runtime::ProbedSafely(comm_files, &selection.reports)) {
        runtime::LoadReport report;
        (void)runtime::LoadCommFromPath(f.path, {}, &report);
        selection.reports.push_back(report);
      }
      for (const auto& r : selection.reports) {
        if (!r.usable) failed.push_back({{"path", r.path}, {"reason", r.reason}});
      }
    }
    backends = registry.Backends();
    comms = registry.Comms();
  }

  json out = {{"backends", json::array()}, {"comms", json::array()}, {"failed", failed}};
  for (const auto& b : backends) {
    PC_ASSIGN_OR_RETURN(json jb, BackendJson(b, b == selection.backend, config));
    out["backends"].push_back(std::move(jb));
  }
  for (const auto& c : comms) {
    const bool selected =
        config.comm && (config.comm->name == c->name() || config.comm->path == c->path());
    json jc = {{"name", c->name()},
               {"path", c->path()},
               {"version", c->version()},
               {"abi", Abi(c->abi_major(), c->abi_minor())},
               {"memory", c->reads_device_memory() ? "device:" + c->device_plugin()
                                                   : std::string("host")},
               {"origin", Origin(PluginKind::kComm, c->name(), selected, config.comm_source)}};
    // The configured comm plugin: where the choice came from and its parameters.
    if (selected) {
      std::string params;
      for (const auto& [k, v] : config.comm->params) {
        params += (params.empty() ? "" : ",") + k + "=" + v;
      }
      jc["selected_by"] = config.comm_source;
      jc["params"] = params;
    }
    out["comms"].push_back(std::move(jc));
  }
  return out;
}

std::string RenderPluginListing(const json& listing) {
  std::ostringstream os;
  if (listing["backends"].empty()) os << "no device backend found\n";
  for (const auto& jb : listing["backends"]) {
    os << "backend " << jb["name"].get<std::string>() << " " << jb["version"].get<std::string>()
       << " (ABI " << jb["abi"].get<std::string>() << ")  " << jb["path"].get<std::string>()
       << "\n    origin: " << jb["origin"].get<std::string>() << "\n";
    for (const auto& d : jb["devices"]) {
      std::string flags;
      for (const auto& f : d["flags"]) flags += (flags.empty() ? "" : ",") + f.get<std::string>();
      os << "  [" << d["physical"].get<int>() << "]"
         << (d["logical"].is_null() ? std::string()
                                    : " -> logical " + std::to_string(d["logical"].get<int>()))
         << "  " << d["name"].get<std::string>() << "  id=" << d["physical_id"].get<std::string>()
         << "\n      memory " << Bytes(d["free_memory"]) << " free / "
         << Bytes(d["total_memory"]) << ", alignment " << d["alignment"].get<uint64_t>()
         << ", max alloc " << Bytes(d["max_alloc_size"]) << ", priorities ["
         << d["priority_low"].get<int>() << ", " << d["priority_high"].get<int>() << "], units "
         << d["compute_units"].get<int>() << "\n      flags " << (flags.empty() ? "-" : flags)
         << "\n";
    }
  }
  for (const auto& c : listing["comms"]) {
    os << "comm " << c["name"].get<std::string>() << " " << c["version"].get<std::string>()
       << " (ABI " << c["abi"].get<std::string>() << ", memory " << c["memory"].get<std::string>()
       << ")  " << c["path"].get<std::string>() << "\n    origin: "
       << c["origin"].get<std::string>() << "\n";
    if (c.contains("selected_by")) {
      os << "    selected by " << c["selected_by"].get<std::string>() << ", params: "
         << (c["params"].get<std::string>().empty() ? "(defaults)"
                                                    : c["params"].get<std::string>())
         << "\n";
    }
  }
  for (const auto& f : listing["failed"]) {
    os << "unusable: " << f["path"].get<std::string>() << ": " << f["reason"].get<std::string>()
       << "\n";
  }
  return os.str();
}

}  // namespace polychip::api
