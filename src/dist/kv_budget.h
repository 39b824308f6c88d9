// The KV cache's share of device memory when it is sized from free memory
// (`serve --mem-fraction-static`): the comm plugin's buffers that live in that memory come off
// first. A device-memory comm plugin's buffers live on its device plugin's devices; a
// host-memory plugin's live in host memory, which is the device's own memory when the device is
// host-accessible (cpu).
#pragma once

#include <cstdint>
#include <string>

#include "dist/parallel.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::dist {

// What the comm plugin of a run keeps in one device's memory.
struct CommBuffers {
  std::string plugin;      // "" with one rank (no comm plugin)
  bool on_device = false;  // the buffers live in this device's memory
  bool known = true;       // false: the plugin does not report its buffer bytes
  uint64_t bytes = 0;      // in this device's memory (0 when !on_device or !known)
  std::string where;       // for the log: "host memory, not on emu:0", ...
};

struct KvBudget {
  uint64_t free_bytes = 0;
  CommBuffers comm;
  uint64_t weight_bytes = 0;  // weights still to be uploaded to the device
  double fraction = 0;
  // fraction * (free_bytes - comm.bytes - weight_bytes), 0 when they take it all
  uint64_t kv_bytes = 0;
  // "KV budget: 1000.0 MiB free - 16.0 MiB comm buffers (shm, host memory, which is cpu's)
  // - 100.0 MiB weights = 884.0 MiB x 0.8 = 707.2 MiB"
  std::string Describe() const;
};

KvBudget ComputeKvBudget(uint64_t free_bytes, double fraction, const CommBuffers& comm,
                         uint64_t weight_bytes = 0);

// Whether a comm plugin's buffers are in `device`'s memory (see the file comment).
bool CommBuffersOnDevice(bool plugin_reads_device, const std::string& plugin_device_backend,
                         const std::string& device_backend, bool device_host_accessible);

// The comm buffers this rank of a tp_size x pp_size run keeps in `device`'s memory: the world
// communicator plus the tensor and pipeline groups split from it (as CreateRunner makes them).
// Loads the comm plugin CreateRunner will use (the registry keeps it). One rank: none.
StatusOr<CommBuffers> RunCommBuffers(const std::string& config_path, const std::string& device_flag,
                                     const ParallelOptions& parallel,
                                     const runtime::Device& device);

}  // namespace polychip::dist
