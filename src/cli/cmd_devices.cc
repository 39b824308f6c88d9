// `polychip devices [--json]`: the loaded plugins (name, path, version, ABI) and every visible
// device with its properties. With a backend named by POLYCHIP_DEVICE_BACKEND, --config or
// --device, only that one is loaded (and failing to load it is an error, exit 1); otherwise
// every discovered plugin is. JSON goes to stdout, logs to stderr.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "runtime/comm.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/plugin_loader.h"

namespace polychip::cli {
namespace {

using nlohmann::json;
using runtime::PluginKind;

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

int RunDevices(bool as_json) {
  auto config = runtime::ResolveRuntimeConfig(Globals().config_path, Globals().device);
  if (!config.ok()) {
    std::fprintf(stderr, "polychip devices: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const bool load_all = !config->backend && !config->comm;
  auto selection = runtime::SelectPlugins(*config, /*load_all_if_unset=*/load_all);
  if (!selection.ok()) {
    std::fprintf(stderr, "polychip devices: %s\n", selection.status().ToString().c_str());
    return 1;
  }
  std::vector<std::shared_ptr<runtime::Backend>> backends;
  std::vector<std::shared_ptr<runtime::CommPlugin>> comms;
  json failed = json::array();
  if (load_all) {
    backends = runtime::PluginRegistry::Global().Backends();
    for (const auto& f : runtime::DiscoverPlugins(runtime::PluginSearchPath(
             config->extra_search_path))) {
      if (f.kind != PluginKind::kComm || f.shadowed) continue;
      runtime::LoadReport report;
      auto c = runtime::LoadCommFromPath(f.path, {}, &report);
      selection->reports.push_back(report);
    }
    comms = runtime::PluginRegistry::Global().Comms();
    for (const auto& r : selection->reports) {
      if (!r.usable) failed.push_back({{"path", r.path}, {"reason", r.reason}});
    }
  } else {
    if (selection->backend) backends.push_back(selection->backend);
    if (selection->comm) comms.push_back(selection->comm);
  }

  json out = {{"backends", json::array()}, {"comms", json::array()}, {"failed", failed}};
  for (const auto& b : backends) {
    json jb = {{"name", b->name()},         {"path", b->path()},
               {"version", b->version()},   {"abi", Abi(b->abi_major(), b->abi_minor())},
               {"abi_major", b->abi_major()}, {"abi_minor", b->abi_minor()},
               {"devices", json::array()}};
    const std::string env = b->visible_devices_env();
    jb["visible_devices_env"] = env.empty() ? json(nullptr) : json(env);
    auto count = b->DeviceCount();
    if (!count.ok()) {
      std::fprintf(stderr, "polychip devices: %s\n", count.status().ToString().c_str());
      return 1;
    }
    // Logical ids apply to the selected backend only.
    std::vector<int32_t> logical_of(*count, -1);
    if (b == selection->backend) {
      if (config->devices.empty()) {
        for (int32_t i = 0; i < *count; ++i) logical_of[i] = i;
      }
      for (size_t l = 0; l < config->devices.size(); ++l) {
        const int32_t phys = config->devices[l];
        if (phys < 0 || phys >= *count) {
          std::fprintf(stderr,
                       "polychip devices: backend '%s' has no device %d (%d visible)\n",
                       b->name().c_str(), phys, *count);
          return 1;
        }
        logical_of[phys] = static_cast<int32_t>(l);
      }
    }
    for (int32_t i = 0; i < *count; ++i) {
      auto props = b->GetProps(i);
      if (!props.ok()) {
        std::fprintf(stderr, "polychip devices: %s\n", props.status().ToString().c_str());
        return 1;
      }
      jb["devices"].push_back(DeviceJson(*props, i, logical_of[i]));
    }
    out["backends"].push_back(jb);
  }
  for (const auto& c : comms) {
    out["comms"].push_back({{"name", c->name()},
                            {"path", c->path()},
                            {"version", c->version()},
                            {"abi", Abi(c->abi_major(), c->abi_minor())},
                            {"memory", c->reads_device_memory() ? "device:" + c->device_plugin()
                                                                : std::string("host")}});
    // The configured comm plugin: where the choice came from and its parameters.
    if (config->comm && (config->comm->name == c->name() || config->comm->path == c->path())) {
      std::string params;
      for (const auto& [k, v] : config->comm->params) params += (params.empty() ? "" : ",") + k + "=" + v;
      out["comms"].back()["selected_by"] = config->comm_source;
      out["comms"].back()["params"] = params;
    }
  }

  if (as_json) {
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  if (out["backends"].empty()) std::cout << "no device backend found\n";
  for (const auto& jb : out["backends"]) {
    std::cout << "backend " << jb["name"].get<std::string>() << " "
              << jb["version"].get<std::string>() << " (ABI " << jb["abi"].get<std::string>()
              << ")  " << jb["path"].get<std::string>() << "\n";
    for (const auto& d : jb["devices"]) {
      std::string flags;
      for (const auto& f : d["flags"]) flags += (flags.empty() ? "" : ",") + f.get<std::string>();
      std::cout << "  [" << d["physical"].get<int>() << "]"
                << (d["logical"].is_null() ? std::string()
                                           : " -> logical " + std::to_string(d["logical"].get<int>()))
                << "  " << d["name"].get<std::string>() << "  id=" << d["physical_id"].get<std::string>()
                << "\n      memory " << Bytes(d["free_memory"]) << " free / "
                << Bytes(d["total_memory"]) << ", alignment " << d["alignment"].get<uint64_t>()
                << ", max alloc " << Bytes(d["max_alloc_size"]) << ", priorities ["
                << d["priority_low"].get<int>() << ", " << d["priority_high"].get<int>()
                << "], units " << d["compute_units"].get<int>() << "\n      flags "
                << (flags.empty() ? "-" : flags) << "\n";
    }
  }
  for (const auto& c : out["comms"]) {
    std::cout << "comm " << c["name"].get<std::string>() << " " << c["version"].get<std::string>()
              << " (ABI " << c["abi"].get<std::string>() << ", memory "
              << c["memory"].get<std::string>() << ")  " << c["path"].get<std::string>() << "\n";
    if (c.contains("selected_by")) {
      std::cout << "    selected by " << c["selected_by"].get<std::string>() << ", params: "
                << (c["params"].get<std::string>().empty() ? "(defaults)" : c["params"].get<std::string>())
                << "\n";
    }
  }
  for (const auto& f : out["failed"]) {
    std::cout << "unusable: " << f["path"].get<std::string>() << ": "
              << f["reason"].get<std::string>() << "\n";
  }
  return 0;
}

std::function<int()> SetupDevices(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  app.add_flag("--json", *as_json, "machine-readable output on stdout");
  return [as_json] { return RunDevices(*as_json); };
}

const bool kRegistered =
    RegisterCommand({"devices", "list loaded plugins and visible devices", SetupDevices});

}  // namespace
}  // namespace polychip::cli
