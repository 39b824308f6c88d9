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
#include "cli/launch_flags.h"
#include "dist/parallel.h"
#include "runtime/config.h"

namespace polychip::cli {
namespace {

struct DevicesOptions {
  bool as_json = false;
  GivenFlags flags;  // the job shape: --tp-size, --pp-size, --nnodes, --comm-tp, ...
};

int RunDevices(const DevicesOptions& o, const GlobalOptions& globals) {
  auto spec = BuildSpec(globals, launch::kScopeParallel, o.flags, nullptr);
  if (!spec.ok()) {
    std::fprintf(stderr, "polychip devices: %s\n", spec.status().ToString().c_str());
    return 2;
  }
  auto config = runtime::ResolveRuntimeConfig(globals.config_path, globals.device);
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
  if (spec->tp_size * spec->pp_size > 1) {
    auto plan = dist::PlanComms(globals.config_path, globals.device, spec->tp_size,
                                spec->pp_size, spec->dist);
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
    std::cout << "\ncomm per group (tp " << spec->tp_size << " x pp " << spec->pp_size
              << " over " << spec->dist.nnodes << " node(s)):\n";
    for (const std::string& line : groups) std::cout << "  " << line << "\n";
  }
  return 0;
}

std::function<int()> SetupDevices(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<DevicesOptions>();
  app.add_flag("--json", o->as_json, "machine-readable output on stdout");
  // The job shape whose per-group comm choice is shown (the flags of run/serve).
  AddLaunchOptions(app, launch::kScopeParallel, &o->flags);
  return [o, &globals] { return RunDevices(*o, globals); };
}

const bool kRegistered =
    RegisterCommand({"devices", "list loaded plugins and visible devices", SetupDevices});

}  // namespace
}  // namespace polychip::cli
