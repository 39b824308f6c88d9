// `polychip devices [--json]`: the loaded plugins (name, path, version, ABI, origin) and every
// visible device with its properties. With a backend named by POLYCHIP_DEVICE_BACKEND, --config
// or --device, only that one is loaded (and failing to load it is an error, exit 1); otherwise
// every discovered plugin is. JSON goes to stdout, logs to stderr. The listing is the embedding
// library's (api/plugin_listing.h), the one polychip_list_plugins returns. With --tp-size x
// --pp-size > 1 (and --nnodes, --comm-tp/--comm-pp, the config's comm: pins), it also shows the
// comm plugin each group of that job would get and why (dist::PlanComms), starting nothing.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <string>

#include "api/plugin_listing.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "dist/parallel.h"
#include "runtime/config.h"

namespace polychip::cli {
namespace {

struct DevicesOptions {
  bool as_json = false;
  int tp_size = 1;
  int pp_size = 1;
};

int RunDevices(const DevicesOptions& o) {
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
  std::vector<std::string> groups;
  if (o.tp_size * o.pp_size > 1) {
    auto plan = dist::PlanComms(Globals().config_path, Globals().device, o.tp_size, o.pp_size);
    if (!plan.ok()) {
      std::fprintf(stderr, "polychip devices: %s\n", plan.status().ToString().c_str());
      return 2;
    }
    groups = std::move(*plan);
  }
  if (o.as_json) {
    if (!groups.empty()) (*listing)["comm_groups"] = groups;
    std::cout << listing->dump(2) << std::endl;
    return 0;
  }
  std::cout << api::RenderPluginListing(*listing);
  if (!groups.empty()) {
    std::cout << "\ncomm per group (tp " << o.tp_size << " x pp " << o.pp_size << " over "
              << dist::GlobalLaunchFlags().nnodes << " node(s)):\n";
    for (const std::string& line : groups) std::cout << "  " << line << "\n";
  }
  return 0;
}

std::function<int()> SetupDevices(CLI::App& app) {
  auto o = std::make_shared<DevicesOptions>();
  app.add_flag("--json", o->as_json, "machine-readable output on stdout");
  // The job shape whose per-group comm choice is shown (the flags of run/serve).
  AddParallelOptions(app, &o->tp_size, &o->pp_size);
  return [o] { return RunDevices(*o); };
}

const bool kRegistered =
    RegisterCommand({"devices", "list loaded plugins and visible devices", SetupDevices});

}  // namespace
}  // namespace polychip::cli
