// The listing of plugins and devices that `polychip devices` prints and polychip_list_plugins
// returns: written once, so the command line and an embedding program see the same thing.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/config.h"
#include "runtime/plugin_loader.h"
#include "util/status.h"

namespace polychip::api {

// The origin shown for a plugin that the embedding API registered (by table or by path).
inline constexpr char kRegisteredByProgram[] = "registered by the program";

// Records that the program registered plugin `name` of `kind`, for the listing's origin.
void MarkRegisteredByProgram(runtime::PluginKind kind, const std::string& name);

enum class ListingScope {
  kSelected,    // the backend and comm plugin `config` names (loading them: an error if not)
  kDiscovered,  // every plugin file on the search path, loaded (failures listed, not fatal)
  kLoaded,      // what the registry holds now (loaded or registered), loading nothing
};

// {"backends": [{name, path, version, abi, abi_major, abi_minor, origin, visible_devices_env,
//   devices: [{physical, logical, name, physical_id, total_memory, free_memory, alignment,
//   max_alloc_size, flags, priority_low, priority_high, compute_units}]}],
//  "comms": [{name, path, version, abi, memory, origin[, selected_by, params]}],
//  "failed": [{path, reason}]}
// Logical ids follow config.devices for the selected backend. Errors are the messages of a
// failed load (every path tried) or of a device query.
StatusOr<nlohmann::json> ListPlugins(const runtime::RuntimeConfig& config, ListingScope scope);

// The human-readable form `polychip devices` prints.
std::string RenderPluginListing(const nlohmann::json& listing);

}  // namespace polychip::api
