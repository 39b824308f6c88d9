// Per-op counters (ABI 1.3, Backend::ReadOpCounters): the difference of two snapshots (the
// cost of a step) and their Prometheus series for /metrics.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace polychip::runtime {

// after - before, per op (an op absent from `before` counts from zero); ops that did not run
// in between are left out.
std::vector<OpCounters> OpCountersDelta(const std::vector<OpCounters>& before,
                                        const std::vector<OpCounters>& after);

// Sum of the measured device time of `ops`, in seconds; nullopt when no op's time is measured.
std::optional<double> DeviceSeconds(const std::vector<OpCounters>& ops);

// Prometheus text (HELP/TYPE once per family) of the per-op counters and the plugin's extras
// of every device, labelled backend, device (logical id), op (or name) and generation (the
// plugin load's number, Backend::generation()). Devices without per-op counters add none.
void AppendOpCounterMetrics(const std::vector<const Device*>& devices, std::string* out);

}  // namespace polychip::runtime
