// The runtime's logger: stderr always (stdout belongs to command output such as --json).
#pragma once

#include <spdlog/spdlog.h>

namespace polychip::runtime {

// Named "runtime"; its level follows spdlog's global level.
spdlog::logger& Log();

}  // namespace polychip::runtime
