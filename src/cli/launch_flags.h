// The launch options on the command line: every row of the launch table (launch/launch_options.h)
// that belongs to a command becomes its flag, with the row's aliases and its default in --help;
// BuildSpec then makes the command's LaunchSpec from the defaults, the --config file and those
// flags, in that order of precedence, through the same checks.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli/command.h"
#include "launch/launch.h"
#include "launch/launch_options.h"
#include "util/status.h"

namespace CLI {
class App;
}

namespace polychip::cli {

// The launch flags as given, in order: (option name, value).
using GivenFlags = std::vector<std::pair<std::string, std::string>>;

// Adds every launch option whose scope meets `scope` to `app`; their values land in `given`.
void AddLaunchOptions(CLI::App& app, uint32_t scope, GivenFlags* given);

// Defaults, then the config file's keys, then the flags (and --device, --config, --op-fallback
// from `globals`). Applies --log-level. `sources` (may be null) records where each value came
// from, for --print-config.
StatusOr<launch::LaunchSpec> BuildSpec(const GlobalOptions& globals, uint32_t scope,
                                       const GivenFlags& given, launch::Sources* sources);

int Fail(const Status& status);

}  // namespace polychip::cli
