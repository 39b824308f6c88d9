// The two-level device memory pool: large arenas obtained from the plugin (each <= the
// device's max single allocation, aligned as the device requires) are cut into blocks by a
// best-fit free list with coalescing. KV blocks and activation workspaces come from here.
//
// Freeing is stream-ordered: Free(block, &stream) records an event on the stream; the block is
// reused by other streams only once that event completed, and at once by the same stream (whose
// later work is ordered after the free). Arenas are returned to the plugin by Trim(): with
// mem_free_async when the device has ASYNC_FREE, else after the device's work is done
// (mem_free is synchronous). Out of memory is RESOURCE_EXHAUSTED, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/device.h"
#include "util/status.h"

namespace polychip::runtime {

struct MemoryPoolOptions {
  uint64_t arena_bytes = 256ull << 20;  // clamped to the device's max_alloc_size
  uint64_t max_total_bytes = 0;         // cap on all arenas together; 0 = what the device has
};

// A sub-allocation. ptr is aligned to the device's alignment.
struct PoolBlock {
  DevPtr ptr = 0;
  uint64_t size = 0;  // the size handed out (rounded up to the alignment)
  int32_t arena = -1;
  explicit operator bool() const { return arena >= 0; }
};

class MemoryPool {
 public:
  MemoryPool(std::shared_ptr<Device> device, MemoryPoolOptions options = {});
  ~MemoryPool();  // waits for pending frees, returns every arena (blocks still in use leak a
                  // warning, not a crash)
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // `stream`: the stream that will use the block (lets it reuse blocks it freed itself before
  // their event completed). A request larger than an arena gets its own arena if it fits the
  // device's max single allocation; a larger one, or one the device has no memory for, is
  // RESOURCE_EXHAUSTED with the limit in the message.
  StatusOr<PoolBlock> Allocate(uint64_t bytes, const Stream* stream = nullptr);
  // stream == nullptr: the caller guarantees no pending work uses the block (immediate reuse).
  Status Free(const PoolBlock& block, const Stream* stream = nullptr);
  // Returns fully free arenas to the plugin: stream-ordered on `stream` when the device has
  // ASYNC_FREE, else (or with no stream) after the pending frees completed, with mem_free.
  Status Trim(const Stream* stream = nullptr);

  uint64_t in_use_bytes() const;    // handed out and not yet freed
  uint64_t peak_bytes() const;      // the maximum of in_use_bytes since creation
  uint64_t reserved_bytes() const;  // held in arenas
  uint64_t alignment() const { return alignment_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  Device& device() const { return *device_; }

 private:
  struct Arena;
  struct Pending;
  Status PollPending(bool wait_all);
  Status AddArena(uint64_t min_bytes);
  bool TryAllocate(uint64_t bytes, const Stream* stream, PoolBlock* out);
  void Hand(const PoolBlock& block, PoolBlock* out);
  void InsertFree(int32_t arena, uint64_t offset, uint64_t size);

  std::shared_ptr<Device> device_;
  MemoryPoolOptions options_;
  uint64_t alignment_;
  uint64_t arena_bytes_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_;  // a slot is null once its arena is trimmed
  std::vector<std::unique_ptr<Pending>> pending_;
  std::vector<std::unique_ptr<Event>> spare_events_;  // recycled for later frees
  std::map<DevPtr, PoolBlock> live_;                  // handed-out blocks, to catch bad frees
  uint64_t in_use_ = 0;
  uint64_t peak_ = 0;
  uint64_t reserved_ = 0;
};

}  // namespace polychip::runtime
