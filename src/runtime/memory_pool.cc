#include "runtime/memory_pool.h"

#include "runtime/log.h"

#include <algorithm>

namespace polychip::runtime {

namespace {
uint64_t RoundUp(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
std::string MiB(uint64_t b) { return std::to_string(b >> 20) + " MiB"; }
}  // namespace

struct MemoryPool::Arena {
  DevPtr base = 0;
  uint64_t size = 0;
  std::map<uint64_t, uint64_t> free;  // offset -> size; adjacent ranges are always merged
  int32_t live = 0;                   // blocks handed out or pending
};

// A block freed on a stream: reusable by other streams once `event` completed.
struct MemoryPool::Pending {
  PoolBlock block;
  std::unique_ptr<Event> event;
  const Stream* stream;  // compared only, never dereferenced
};

MemoryPool::MemoryPool(std::shared_ptr<Device> device, MemoryPoolOptions options)
    : device_(std::move(device)), options_(options) {
  const DeviceProps& p = device_->props();
  alignment_ = std::max<uint64_t>(p.alignment, 1);
  arena_bytes_ = RoundUp(std::max<uint64_t>(options_.arena_bytes, alignment_), alignment_);
  if (p.max_alloc_size != 0 && arena_bytes_ > p.max_alloc_size) {
    arena_bytes_ = p.max_alloc_size / alignment_ * alignment_;
  }
}

MemoryPool::~MemoryPool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : pending_) {
    Status s = p->event->Synchronize();
    if (!s.ok()) Log().error("memory pool: {}", s.ToString());
  }
  pending_.clear();
  if (!live_.empty()) {
    Log().warn("memory pool of {} destroyed with {} blocks ({} bytes) still in use",
                 device_->props().name, live_.size(), in_use_);
  }
  for (auto& a : arenas_) {
    if (a == nullptr) continue;
    Status s = device_->FreeRaw(a->base);
    if (!s.ok()) Log().error("memory pool: {}", s.ToString());
  }
}

void MemoryPool::InsertFree(int32_t arena, uint64_t offset, uint64_t size) {
  auto& free = arenas_[arena]->free;
  auto next = free.lower_bound(offset);
  // Merge with the following range.
  if (next != free.end() && offset + size == next->first) {
    size += next->second;
    next = free.erase(next);
  }
  // Merge with the preceding range.
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free.emplace(offset, size);
}

void MemoryPool::Hand(const PoolBlock& block, PoolBlock* out) {
  *out = block;
  live_[block.ptr] = block;
  in_use_ += block.size;
  peak_ = std::max(peak_, in_use_);
}

bool MemoryPool::TryAllocate(uint64_t bytes, const Stream* stream, PoolBlock* out) {
  // A block this stream freed itself is safe for it at once: its later work runs after the free.
  if (stream != nullptr) {
    auto best = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if ((*it)->stream == stream && (*it)->block.size >= bytes &&
          (best == pending_.end() || (*it)->block.size < (*best)->block.size)) {
        best = it;
      }
    }
    if (best != pending_.end() && (*best)->block.size < 2 * bytes) {
      PoolBlock block = (*best)->block;
      spare_events_.push_back(std::move((*best)->event));
      pending_.erase(best);
      Hand(block, out);  // still counted live in its arena
      return true;
    }
  }
  // Best fit over every arena's free ranges.
  int32_t best_arena = -1;
  uint64_t best_offset = 0, best_size = UINT64_MAX;
  for (size_t a = 0; a < arenas_.size(); ++a) {
    if (arenas_[a] == nullptr) continue;
    for (const auto& [offset, size] : arenas_[a]->free) {
      if (size >= bytes && size < best_size) {
        best_arena = static_cast<int32_t>(a);
        best_offset = offset;
        best_size = size;
      }
    }
  }
  if (best_arena < 0) return false;
  Arena& arena = *arenas_[best_arena];
  arena.free.erase(best_offset);
  if (best_size > bytes) arena.free.emplace(best_offset + bytes, best_size - bytes);
  ++arena.live;
  Hand(PoolBlock{arena.base + best_offset, bytes, best_arena}, out);
  return true;
}

Status MemoryPool::AddArena(uint64_t min_bytes) {
  const DeviceProps& p = device_->props();
  uint64_t size = std::max(arena_bytes_, min_bytes);
  if (options_.max_total_bytes != 0 && reserved_ + size > options_.max_total_bytes) {
    size = min_bytes;  // a smaller arena may still fit under the cap
    if (reserved_ + size > options_.max_total_bytes) {
      return ResourceExhausted("memory pool of " + p.name + " is at its cap of " +
                               MiB(options_.max_total_bytes));
    }
  }
  StatusOr<DevPtr> base = device_->AllocateRaw(size);
  if (!base.ok() && base.status().code() == StatusCode::kResourceExhausted && size > min_bytes) {
    size = min_bytes;
    base = device_->AllocateRaw(size);
  }
  if (!base.ok()) return base.status();
  auto arena = std::make_unique<Arena>();
  arena->base = *base;
  arena->size = size;
  arena->free.emplace(0, size);
  reserved_ += size;
  // Reuse a trimmed slot so arena indices stay small.
  for (auto& slot : arenas_) {
    if (slot == nullptr) {
      slot = std::move(arena);
      return Status::Ok();
    }
  }
  arenas_.push_back(std::move(arena));
  return Status::Ok();
}

Status MemoryPool::PollPending(bool wait_all) {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = *pending_[i];
    bool done;
    if (wait_all) {
      PC_RETURN_IF_ERROR(p.event->Synchronize());
      done = true;
    } else {
      PC_ASSIGN_OR_RETURN(done, p.event->Query());
    }
    if (!done) {
      ++i;
      continue;
    }
    --arenas_[p.block.arena]->live;
    InsertFree(p.block.arena, p.block.ptr - arenas_[p.block.arena]->base, p.block.size);
    spare_events_.push_back(std::move(p.event));
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return Status::Ok();
}

StatusOr<PoolBlock> MemoryPool::Allocate(uint64_t bytes, const Stream* stream) {
  const uint64_t size = RoundUp(std::max<uint64_t>(bytes, 1), alignment_);
  const DeviceProps& p = device_->props();
  if (p.max_alloc_size != 0 && size > p.max_alloc_size) {
    return ResourceExhausted("request of " + std::to_string(bytes) + " bytes exceeds the max " +
                             "single allocation of " + p.name + " (" +
                             std::to_string(p.max_alloc_size) + " bytes)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  PoolBlock block;
  PC_RETURN_IF_ERROR(PollPending(false));
  if (TryAllocate(size, stream, &block)) return block;
  Status grown = AddArena(size);
  if (grown.ok() && TryAllocate(size, stream, &block)) return block;
  if (!grown.ok() && grown.code() != StatusCode::kResourceExhausted) return grown;
  // Out of device memory: wait for blocks still in flight, then try once more.
  if (!pending_.empty()) {
    PC_RETURN_IF_ERROR(PollPending(true));
    if (TryAllocate(size, stream, &block)) return block;
  }
  return ResourceExhausted("out of device memory on " + p.name + ": cannot allocate " +
                           std::to_string(bytes) + " bytes (pool: " + std::to_string(in_use_) +
                           " bytes in use, " + std::to_string(reserved_) + " reserved; " +
                           grown.message() + ")");
}

Status MemoryPool::Free(const PoolBlock& block, const Stream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(block.ptr);
  if (it == live_.end() || it->second.size != block.size || it->second.arena != block.arena) {
    return InvalidArgument("memory pool: block at " + std::to_string(block.ptr) +
                           " is not allocated from this pool (double free?)");
  }
  live_.erase(it);
  in_use_ -= block.size;
  if (stream != nullptr) {
    std::unique_ptr<Event> event;
    if (!spare_events_.empty()) {
      event = std::move(spare_events_.back());
      spare_events_.pop_back();
    } else {
      auto created = device_->CreateEvent();
      if (created.ok()) event = std::move(created).value();
    }
    if (event != nullptr && event->Record(*stream).ok()) {
      pending_.push_back(std::make_unique<Pending>(Pending{block, std::move(event), stream}));
      return Status::Ok();
    }
    // No event: fall back to the synchronous safe free.
    PC_RETURN_IF_ERROR(const_cast<Stream*>(stream)->Synchronize());
  }
  --arenas_[block.arena]->live;
  InsertFree(block.arena, block.ptr - arenas_[block.arena]->base, block.size);
  return Status::Ok();
}

Status MemoryPool::Trim(const Stream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  PC_RETURN_IF_ERROR(PollPending(false));
  const bool async = stream != nullptr && device_->props().async_free;
  for (auto& a : arenas_) {
    if (a == nullptr || a->live != 0) continue;
    // live == 0 means every block came back: the free map is the single whole range.
    PC_RETURN_IF_ERROR(async ? device_->FreeRawAsync(*stream, a->base) : device_->FreeRaw(a->base));
    reserved_ -= a->size;
    a.reset();
  }
  return Status::Ok();
}

uint64_t MemoryPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}
uint64_t MemoryPool::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}
uint64_t MemoryPool::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

}  // namespace polychip::runtime
