// `polychip devices [--json]`: the loaded plugins (name, path, version, ABI, origin) and every
// visible device with its properties. With a backend named by POLYCHIP_DEVICE_BACKEND, --config
// or --device, only that one is loaded (and failing to load it is an error, exit 1); otherwise
// every discovered plugin is. JSON goes to stdout, logs to stderr. The listing is the embedding
// library's (api/plugin_listing.h), the one polychip_list_plugins returns.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "api/plugin_listing.h"
#include "cli/command.h"
#include "runtime/config.h"

namespace polychip::cli {
namespace {

int RunDevices(bool as_json) {
  auto config = runtime::ResolveRuntimeConfig(Globals().config_path, Globals().device);
  if (!config.ok()) {
    std::fprintf(stderr, "polychip devices: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const bool load_all = !config->backend && !config->comm;
  auto listing = api::ListPlugins(
      *config, load_all ? api::ListingScope::kDiscovered : api::ListingScope::kSelected);
  if (!listing.ok()) {
    std::fprintf(stderr, "polychip devices: %s\n", listing.status().ToString().c_str());
    return 1;
  }
  if (as_json) {
    std::cout << listing->dump(2) << std::endl;
  } else {
    std::cout << api::RenderPluginListing(*listing);
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
