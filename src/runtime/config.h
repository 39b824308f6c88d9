// Runtime configuration: which backend/comm plugin to load, from where, with which parameters.
// Three sources, all first-class and all logged: a YAML config file, the environment
// (POLYCHIP_DEVICE_BACKEND, POLYCHIP_PLUGIN_PATH) and the --device flag. No ABI types here.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace polychip::runtime {

// Key/value string parameters handed to a plugin's initialize(), e.g. {"devices", "0,1"}.
using PluginParams = std::vector<std::pair<std::string, std::string>>;

struct PluginSpec {
  std::string name;     // "emu"; may be empty when `path` is given
  std::string path;     // explicit .so path; empty: discovered by name on the search path
  PluginParams params;  // passed to initialize()
};

// `--device emu:0,2` : backend "emu", logical device 0 -> physical 0, logical 1 -> physical 2.
struct DeviceSelection {
  std::string backend;
  std::vector<int32_t> physical;  // indexed by logical id; empty = every visible device
};
StatusOr<DeviceSelection> ParseDeviceFlag(std::string_view flag);

struct RuntimeConfig {
  std::optional<PluginSpec> backend;
  std::optional<PluginSpec> comm;
  std::vector<std::string> extra_search_path;  // config `plugin_path:` entries, searched first
  std::vector<int32_t> devices;                // physical ids by logical id; empty = all
  uint64_t arena_bytes = 256ull << 20;         // memory pool arena size (config memory.arena_mb)
  std::string backend_source;  // where the backend choice came from: "env", "config FILE", ...
  std::string comm_source;     // where the comm choice came from (as backend_source)
  // Per-group pins (`comm: {tp: shm, pp: {name: gloo, params: {...}}}`): "world", "tp" or "pp"
  // -> plugin. A group not named here takes `comm` if set, else the topology's choice.
  std::map<std::string, PluginSpec> comm_groups;
  // Backend whose first device runs the ops the backend's device lacks (op_fallback.h);
  // empty: none, a gap in op coverage is an error.
  std::string op_fallback;
  std::string op_fallback_source;
};

// Parses the runtime part of a YAML config (other sections are ignored):
//   plugin_path: [/opt/polychip/lib]          # or a colon-separated string
//   backend: {name: emu, path: /x/libpolychip_backend_emu.so, params: {devices: "0,1"}}
//   comm:    {name: shm, params: {buffer_bytes: 4194304}}
//            or per group: {tp: shm, pp: {name: gloo, params: {timeout_ms: 30000}}, world: gloo}
//   devices: [0, 2]                            # logical -> physical
//   memory:  {arena_mb: 256}
//   op_fallback: cpu                           # run ops the device lacks on this backend
StatusOr<RuntimeConfig> ParseConfigYaml(const std::string& yaml_text, const std::string& origin);
StatusOr<RuntimeConfig> LoadConfigFile(const std::string& path);

// The effective configuration: the config file (if config_path is non-empty), then the
// environment for what the file leaves unset (POLYCHIP_DEVICE_BACKEND; POLYCHIP_COMM_BACKEND
// with POLYCHIP_COMM_PARAMS="key=value,key=value"), then --device (if non-empty), which overrides
// the backend name and the device list. A --device backend that differs from the config file's
// drops the file's path and params for that backend. POLYCHIP_OP_FALLBACK (which --op-fallback
// sets) overrides the file's op_fallback; "none" turns it off.
StatusOr<RuntimeConfig> ResolveRuntimeConfig(const std::string& config_path,
                                             const std::string& device_flag);

}  // namespace polychip::runtime
