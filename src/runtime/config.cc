#include "runtime/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace polychip::runtime {
namespace {

std::vector<std::string> SplitColons(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ':')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

StatusOr<std::vector<int32_t>> ParseIdList(std::string_view list, std::string_view what) {
  std::vector<int32_t> ids;
  std::string item;
  std::istringstream in{std::string(list)};
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1 << 20) {
      return InvalidArgument(std::string(what) + ": '" + item + "' is not a device index");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

// A scalar as a string; params accept numbers and booleans as written in the file.
StatusOr<PluginSpec> ParseSpec(const YAML::Node& node, const std::string& where) {
  PluginSpec spec;
  if (node.IsScalar()) {  // `backend: emu`
    spec.name = node.as<std::string>();
    return spec;
  }
  if (!node.IsMap()) return InvalidArgument(where + ": expected a name or a map");
  if (node["name"]) spec.name = node["name"].as<std::string>();
  if (node["path"]) spec.path = node["path"].as<std::string>();
  if (const YAML::Node params = node["params"]) {
    if (!params.IsMap()) return InvalidArgument(where + ".params: expected a map");
    for (const auto& kv : params) {
      std::string value;
      if (kv.second.IsScalar()) {
        value = kv.second.as<std::string>();
      } else if (kv.second.IsSequence()) {  // devices: [0, 1] -> "0,1"
        for (const auto& item : kv.second) {
          if (!value.empty()) value += ",";
          value += item.as<std::string>();
        }
      } else {
        return InvalidArgument(where + ".params." + kv.first.as<std::string>() +
                               ": expected a scalar or a list");
      }
      spec.params.emplace_back(kv.first.as<std::string>(), value);
    }
  }
  if (spec.name.empty() && spec.path.empty()) {
    return InvalidArgument(where + ": needs a name or a path");
  }
  return spec;
}

}  // namespace

StatusOr<DeviceSelection> ParseDeviceFlag(std::string_view flag) {
  DeviceSelection sel;
  size_t colon = flag.find(':');
  sel.backend = std::string(flag.substr(0, colon));
  if (sel.backend.empty()) {
    return InvalidArgument("--device '" + std::string(flag) + "': expected backend[:i[,j...]]");
  }
  if (colon != std::string_view::npos) {
    PC_ASSIGN_OR_RETURN(sel.physical, ParseIdList(flag.substr(colon + 1), "--device"));
    if (sel.physical.empty()) {
      return InvalidArgument("--device '" + std::string(flag) + "': empty device list");
    }
  }
  return sel;
}

StatusOr<RuntimeConfig> ParseConfigYaml(const std::string& yaml_text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
  RuntimeConfig config;
  if (!root || root.IsNull()) return config;
  if (!root.IsMap()) return InvalidArgument(origin + ": expected a map at the top level");
  try {
    if (const YAML::Node p = root["plugin_path"]) {
      if (p.IsSequence()) {
        for (const auto& d : p) config.extra_search_path.push_back(d.as<std::string>());
      } else {
        config.extra_search_path = SplitColons(p.as<std::string>());
      }
    }
    if (const YAML::Node b = root["backend"]) {
      PC_ASSIGN_OR_RETURN(config.backend, ParseSpec(b, origin + ": backend"));
      config.backend_source = "config " + origin;
    }
    if (const YAML::Node c = root["comm"]) {
      bool per_group = false;
      for (const char* group : {"world", "tp", "pp"}) {
        if (!c.IsMap() || !c[group]) continue;
        per_group = true;
        PC_ASSIGN_OR_RETURN(config.comm_groups[group],
                            ParseSpec(c[group], origin + ": comm." + group));
      }
      if (!per_group || c["name"] || c["path"]) {
        PC_ASSIGN_OR_RETURN(config.comm, ParseSpec(c, origin + ": comm"));
      }
      config.comm_source = "config " + origin;
    }
    if (const YAML::Node d = root["devices"]) {
      if (d.IsSequence()) {
        for (const auto& id : d) config.devices.push_back(id.as<int32_t>());
      } else {
        PC_ASSIGN_OR_RETURN(config.devices, ParseIdList(d.as<std::string>(), origin + ": devices"));
      }
    }
    if (const YAML::Node f = root["op_fallback"]) {
      config.op_fallback = f.as<std::string>();
      config.op_fallback_source = "config " + origin;
    }
    if (const YAML::Node m = root["memory"]) {
      if (m["arena_mb"]) config.arena_bytes = m["arena_mb"].as<uint64_t>() << 20;
    }
  } catch (const YAML::Exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
  return config;
}

StatusOr<RuntimeConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("config file " + path + " cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfigYaml(text.str(), path);
}

StatusOr<RuntimeConfig> ResolveRuntimeConfig(const std::string& config_path,
                                             const std::string& device_flag) {
  RuntimeConfig config;
  if (!config_path.empty()) {
    PC_ASSIGN_OR_RETURN(config, LoadConfigFile(config_path));
  }
  if (!config.backend) {
    const char* env = std::getenv("POLYCHIP_DEVICE_BACKEND");
    if (env != nullptr && *env != '\0') {
      config.backend = PluginSpec{env, "", {}};
      config.backend_source = "env POLYCHIP_DEVICE_BACKEND";
    }
  }
  if (!config.comm) {
    const char* env = std::getenv("POLYCHIP_COMM_BACKEND");
    if (env != nullptr && *env != '\0') {
      config.comm = PluginSpec{env, "", {}};
      config.comm_source = "env POLYCHIP_COMM_BACKEND";
      std::string item;
      std::istringstream in(std::getenv("POLYCHIP_COMM_PARAMS") ? std::getenv("POLYCHIP_COMM_PARAMS")
                                                               : "");
      while (std::getline(in, item, ',')) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos) {
          return InvalidArgument("POLYCHIP_COMM_PARAMS: '" + item + "' is not key=value");
        }
        config.comm->params.emplace_back(item.substr(0, eq), item.substr(eq + 1));
      }
    }
  }
  if (const char* env = std::getenv("POLYCHIP_OP_FALLBACK"); env != nullptr && *env != '\0') {
    config.op_fallback = env;
    config.op_fallback_source = "--op-fallback / env POLYCHIP_OP_FALLBACK";
  }
  if (config.op_fallback == "none") config.op_fallback.clear();
  if (!device_flag.empty()) {
    PC_ASSIGN_OR_RETURN(DeviceSelection sel, ParseDeviceFlag(device_flag));
    if (!config.backend || config.backend->name != sel.backend) {
      config.backend = PluginSpec{sel.backend, "", {}};
    }
    config.backend_source = "--device " + device_flag;
    if (!sel.physical.empty()) config.devices = sel.physical;
  }
  return config;
}

}  // namespace polychip::runtime
