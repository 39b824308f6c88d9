// What `polychip profile` and `polychip bench` share: the host's read bandwidth (the roofline
// of a host-memory device) and the per-op counters of a step as a table or as JSON records.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace polychip::cli {

// Streams `bytes` with `threads` threads, best of several passes, in bytes per second.
double MeasureReadBandwidth(int threads, size_t bytes);

// Per-op records of `ops` (a difference of two snapshots) divided by `steps`: op, calls,
// device_ns, bytes_read, bytes_written, flops (null where the plugin does not count it).
nlohmann::json OpRecordsJson(const std::vector<runtime::OpCounters>& ops, int steps);

// A markdown table of one step: calls, total time, % of the step's wall time, GB/s (and % of
// `bandwidth_bps` when known), GFLOP/s. Ops sorted by time (by calls when time is unmeasured).
std::string OpTable(const std::vector<runtime::OpCounters>& ops, int steps, double step_wall_s,
                    std::optional<double> bandwidth_bps);

}  // namespace polychip::cli
