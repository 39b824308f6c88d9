// Host fallback for ops a device lacks (--op-fallback cpu): how a chip team runs a model while
// only some ops are ported. An op the device does not support (op_supports says 0 for its
// dtypes and layout) runs on the fallback device instead; its operands are staged through host
// memory with the ABI's ordinary copies, synchronously:
//
//   device stream --D2H--> host --H2D--> fallback device, launch, --D2H--> host --H2D--> device
//
// What is staged is derived from the op list (pc_ops.def): each address member's access and
// extent. Weights (immutable: uploaded through DeviceWeight, or marked with MarkImmutable) are
// copied to the fallback device once, through its own weight_upload, and reused. Paged KV
// caches are staged block by block: only the blocks an ATTENTION reads, only the rows a
// KV_STORE writes. Results equal what the fallback device alone computes.
//
// Slow by design (two synchronisations per op), and meant for bring-up, not production.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::runtime {

class DeviceWeight;

class OpFallback {
 public:
  explicit OpFallback(std::shared_ptr<Device> fallback);
  ~OpFallback();

  Device& device() const { return *fallback_; }
  const std::shared_ptr<Device>& shared_device() const { return fallback_; }

  // True when `args` (the op's ABI struct) is not supported by `device` but by the fallback.
  bool ShouldFallBack(const Device& device, int32_t op, const void* args);
  // Runs the op on the fallback device; `args` addresses are `stream`'s device memory.
  Status Launch(const Stream& stream, int32_t op, const void* args);

  // Launches that fell back, per op name (for /metrics and the log).
  std::map<std::string, uint64_t> LaunchCounts() const;

  // [ptr, ptr + bytes) of the main device holds data that never changes (a weight, an
  // embedding table): operands inside it are staged once and kept on the fallback device.
  void MarkImmutable(DevPtr ptr, uint64_t bytes);

 private:
  bool IsImmutable(DevPtr ptr, uint64_t bytes) const;
  // The fallback copy of a main-device weight [rows, cols] of dtype in the GGUF layout.
  StatusOr<const DeviceWeight*> Weight(Stream& stream, DevPtr ptr, DType dtype,
                                       int64_t rows, int64_t cols);
  template <typename T>
  Status LaunchGeneric(Stream& stream, typename T::Args args);
  Status LaunchKvStore(Stream& stream, const void* args);
  Status LaunchAttention(Stream& stream, const void* args);

  std::shared_ptr<Device> fallback_;
  std::unique_ptr<Stream> stream_;  // on the fallback device
  mutable std::mutex mu_;           // one fallback launch at a time; guards the maps
  std::map<DevPtr, uint64_t> immutable_;  // start -> bytes
  std::map<std::string, std::unique_ptr<DeviceWeight>> weights_;  // by "ptr/dtype/rows/cols"
  std::map<std::string, uint64_t> launches_;
  // Cache of ShouldFallBack's device query, by (op, dtypes[0..3], layout).
  std::map<std::array<int64_t, 6>, bool> supported_;
};

}  // namespace polychip::runtime
