#include "dist/kv_budget.h"

#include <algorithm>
#include <cstdio>

namespace polychip::dist {

std::string KvBudget::Describe() const {
  auto mib = [](uint64_t b) { return b / 1048576.0; };
  char buf[512];
  std::string comm_part;
  if (comm.plugin.empty()) {
    comm_part = "0.0 MiB comm buffers (one rank)";
  } else if (!comm.known) {
    comm_part = "? MiB comm buffers (" + comm.plugin + " does not report them, counted 0; " +
                comm.where + ")";
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f MiB comm buffers (%s, %s)", mib(comm.bytes),
                  comm.plugin.c_str(), comm.where.c_str());
    comm_part = buf;
  }
  std::string weights_part;
  if (weight_bytes > 0) {
    std::snprintf(buf, sizeof(buf), " - %.1f MiB weights", mib(weight_bytes));
    weights_part = buf;
  }
  const uint64_t taken = comm.bytes + weight_bytes;
  std::snprintf(buf, sizeof(buf), "KV budget: %.1f MiB free - %s%s = %.1f MiB x %g = %.1f MiB",
                mib(free_bytes), comm_part.c_str(), weights_part.c_str(),
                mib(free_bytes - std::min(free_bytes, taken)), fraction, mib(kv_bytes));
  return buf;
}

KvBudget ComputeKvBudget(uint64_t free_bytes, double fraction, const CommBuffers& comm,
                         uint64_t weight_bytes) {
  KvBudget b;
  b.free_bytes = free_bytes;
  b.comm = comm;
  b.weight_bytes = weight_bytes;
  b.fraction = fraction;
  const uint64_t usable = free_bytes - std::min(free_bytes, comm.bytes + weight_bytes);
  b.kv_bytes = static_cast<uint64_t>(std::max(0.0, fraction) * static_cast<double>(usable));
  return b;
}

bool CommBuffersOnDevice(bool plugin_reads_device, const std::string& plugin_device_backend,
                         const std::string& device_backend, bool device_host_accessible) {
  if (plugin_reads_device) return plugin_device_backend == device_backend;
  return device_host_accessible;  // host memory is this device's memory
}

StatusOr<CommBuffers> RunCommBuffers(const std::string& config_path, const std::string& device_flag,
                                     const ParallelOptions& parallel,
                                     const runtime::Device& device) {
  const int32_t tp = std::max(1, parallel.tp_size), pp = std::max(1, parallel.pp_size);
  CommBuffers c;
  if (tp * pp == 1) return c;
  PC_ASSIGN_OR_RETURN(auto plugin, LoadComm(config_path, device_flag));
  c.plugin = plugin->name();
  const std::string backend = device.backend()->name();
  c.on_device = CommBuffersOnDevice(plugin->reads_device_memory(), plugin->device_plugin(),
                                    backend, device.props().host_accessible);
  c.where = plugin->reads_device_memory()
                ? "device memory of " + plugin->device_plugin()
                : std::string("host memory") +
                      (device.props().host_accessible ? ", which is " + backend + "'s"
                                                      : ", not " + backend + "'s");
  // As CreateRunner makes them: the world, then a tensor group and a pipeline group per rank.
  uint64_t total = 0;
  for (int32_t n : {tp * pp, tp > 1 ? tp : 0, pp > 1 ? pp : 0}) {
    if (n == 0) continue;
    std::optional<uint64_t> bytes = plugin->BufferBytes(n);
    if (!bytes) {
      c.known = false;
      return c;
    }
    total += *bytes;
  }
  c.bytes = c.on_device ? total : 0;
  return c;
}

}  // namespace polychip::dist
