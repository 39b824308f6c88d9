// The emu device plugin: an emulated discrete accelerator that makes the framework honour the
// assumptions a real one imposes.
//   - Device memory is a private mapping per device; a devptr is an opaque handle
//     ((device_index + 1) << 48 | offset), never a host pointer. Every access is translated
//     and checked against the live allocations, so a stray or stale address is an error.
//   - Alignment 4096, max single allocation 64 MiB (parameter max_alloc_bytes), no
//     stream-ordered free (mem_free waits for the device's work).
//   - Each stream runs its commands asynchronously on its own worker thread. One executor per
//     device runs one command at a time and, when several streams have work ready, lets the
//     highest-priority stream go first.
//   - Results are computed by the SDK reference kernels through address translation.
//   - Faults on request, to test the framework's error paths (parameters, all counted from
//     initialize): fail_alloc_after_bytes=N makes mem_alloc fail with RESOURCE_EXHAUSTED once the
//     bytes allocated so far (freed ones included) would pass N; fail_op_launch=[OP:]N makes the
//     Nth launch (of OP, else of any op) fail on its stream as a device fault would, reported
//     by the next stream_synchronize; stall_stream_ms=MS[@N] holds the stream (and so the device)
//     of the Nth op launch (default the 1st) for MS ms before it runs. Each op fault happens once.
//   - Per-op counters (ABI 1.3): launches, time each command ran on the executor (the host
//     clock: the emulated device's clock), bytes and FLOPs (sdk/op_counters.h); parameter
//     op_counters=off switches them off.
//   - profile=xre (or POLYCHIP_EMU_PROFILE=xre): only what Kunlun's XRE runtime offers, as its
//     public wrappers use it (InfiniCore's src/infinirt/kunlun/infinirt_kunlun.cc): no memset,
//     no event query, no elapsed time between events, no memory query (mem_get_info absent,
//     props' free_memory is the declared total), no stream priorities (PaddlePaddle's
//     paddle.device.xpu.create_stream ignores its priority argument), no stream-ordered free.
//     The members are NULL in the table from initialize on (ABI 1.5 makes them optional) and
//     the op counters measure no time (XRE cannot time device work). XRE has no device-wide
//     synchronize, async allocation or graph capture either; the ABI asks for none of them.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "emu_private.h"
#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/op_counters.h"
#include "polychip/sdk/op_list.h"
#include "polychip/sdk/plugin_util.h"
#include "polychip/sdk/ref_kernels.h"

using polychip::sdk::Guard;
using polychip::sdk::MakeError;

namespace {

constexpr uint64_t kAlignment = 4096;
constexpr uint64_t kMaxAlloc = 64ull << 20;  // default of the parameter max_alloc_bytes
constexpr int kPriorityLow = 0, kPriorityHigh = 2;
constexpr int kHandleShift = 48;
constexpr uint64_t kOffsetMask = (1ull << kHandleShift) - 1;

pc_error_t* BadArg(const std::string& msg) { return MakeError(PC_CODE_INVALID_ARGUMENT, msg); }

// One command at a time per device; among waiting streams the highest priority goes next
// (ties: whoever the condition variable wakes first).
class Executor {
 public:
  void Acquire(int priority) {
    std::unique_lock<std::mutex> lock(mu_);
    waiting_.insert(priority);
    cv_.wait(lock, [&] { return !busy_ && *waiting_.rbegin() == priority; });
    waiting_.erase(waiting_.find(priority));
    busy_ = true;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
  std::multiset<int> waiting_;
};

}  // namespace

struct pc_device {
  int32_t index;
  uint8_t* region = nullptr;  // [total] private mapping, never handed out
  uint64_t total = 0;
  std::mutex mem_mu;
  std::map<uint64_t, uint64_t> live;  // offset -> size of each allocation
  std::map<uint64_t, uint64_t> free;  // offset -> size of each free range (coalesced)
  uint64_t used = 0;
  Executor executor;
  polychip::sdk::OpCounterTable op_counters;
  // Commands enqueued on any stream of this device and not yet finished (mem_free waits).
  std::mutex work_mu;
  std::condition_variable work_cv;
  int64_t pending = 0;

  // Host address of [ptr, ptr + bytes) if it lies inside one live allocation of this device.
  void* Translate(pc_devptr_t ptr, uint64_t bytes) {
    if ((ptr >> kHandleShift) != static_cast<uint64_t>(index) + 1) return nullptr;
    const uint64_t off = ptr & kOffsetMask;
    std::lock_guard<std::mutex> lock(mem_mu);
    auto it = live.upper_bound(off);
    if (it == live.begin()) return nullptr;
    --it;
    if (off + bytes < off || off + bytes > it->first + it->second) return nullptr;
    return region + off;
  }
  pc_devptr_t Handle(uint64_t offset) const {
    return (static_cast<uint64_t>(index) + 1) << kHandleShift | offset;
  }
  void AddPending(int64_t delta) {
    std::lock_guard<std::mutex> lock(work_mu);
    pending += delta;
    if (pending == 0) work_cv.notify_all();
  }
  void WaitIdle() {
    std::unique_lock<std::mutex> lock(work_mu);
    work_cv.wait(lock, [&] { return pending == 0; });
  }
};

struct pc_event {
  pc_device* device;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // generation of the latest event_record
  uint64_t completed = 0;  // generation the device has reached
  std::chrono::steady_clock::time_point when;

  void WaitFor(uint64_t generation) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return completed >= generation; });
  }
};

struct pc_stream {
  pc_device* device;
  int priority;
  std::mutex mu;
  std::condition_variable cv;
  // A command either computes (run, under the device executor) or waits for an event (wait,
  // outside the executor so that a waiting stream never blocks the device).
  // A third kind (host) runs outside the executor too: the collective library's work, which
  // may wait for other processes (emu_private.h).
  struct Command {
    std::function<const char*()> run;
    pc_event* wait_event = nullptr;
    uint64_t wait_generation = 0;
    std::function<const char*()> host;
  };
  std::deque<Command> queue;
  int64_t in_flight = 0;  // queued + running
  bool stopping = false;
  pc_error_t* first_error = nullptr;
  std::thread worker;

  void Enqueue(Command c) {
    device->AddPending(1);
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(c));
      ++in_flight;
    }
    cv.notify_all();
  }

  void Loop() {
    for (;;) {
      Command c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping and drained
        c = std::move(queue.front());
        queue.pop_front();
      }
      const char* why = nullptr;
      std::string what;
      if (c.wait_event) {
        c.wait_event->WaitFor(c.wait_generation);
      } else if (c.host) {
        try {
          why = c.host();
        } catch (const std::exception& e) {
          what = e.what();
          why = what.c_str();
        }
      } else {
        device->executor.Acquire(priority);
        try {
          why = c.run();
        } catch (const std::exception& e) {
          what = e.what();
          why = what.c_str();
        }
        device->executor.Release();
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (why && !first_error) first_error = MakeError(PC_CODE_INTERNAL, why);
        --in_flight;
      }
      cv.notify_all();
      device->AddPending(-1);
    }
  }

  pc_error_t* Synchronize() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
    pc_error_t* e = first_error;
    first_error = nullptr;
    return e;
  }
};

namespace {

void SetProfileMembers(bool xre);  // below, beside the table

struct State {
  const pc_host_services_t* host = nullptr;
  bool xre = false;  // parameter profile=xre: XRE's capability set (see the top of the file)
  int n_devices = 4;
  uint64_t memory_bytes = 4096ull << 20;
  uint64_t max_alloc = kMaxAlloc;  // parameter max_alloc_bytes
  // Parameter only_ops: the ops this emulated device claims (names as in pc_ops.def), so that
  // op coverage errors and --op-fallback can be exercised without writing a plugin. Empty:
  // every op.
  std::set<pc_op_t> only_ops;
  bool count_ops = true;  // parameter op_counters
  // Fault injection (see the top of the file). 0 / PC_OP_COUNT: off.
  uint64_t fail_alloc_after_bytes = 0;
  std::atomic<uint64_t> allocated_bytes{0};
  pc_op_t fail_op = PC_OP_COUNT;  // PC_OP_COUNT with fail_op_launch > 0: any op
  int64_t fail_op_launch = 0;
  int64_t stall_ms = 0;
  int64_t stall_launch = 1;
  std::atomic<int64_t> launches{0};     // every op
  std::atomic<int64_t> op_launches{0};  // of fail_op
  std::mutex mu;
  std::vector<pc_device*> open;
};
State& G() {
  static State s;
  return s;
}

void Log(pc_log_level_t level, const std::string& msg) {
  const pc_host_services_t* h = G().host;
  if (h && h->log) h->log(h->host_ctx, level, "emu", msg.c_str());
}

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  return Guard([&]() -> pc_error_t* {
    State& s = G();
    s.n_devices = 4;
    s.memory_bytes = 4096ull << 20;
    s.max_alloc = kMaxAlloc;
    s.only_ops.clear();
    s.count_ops = true;
    s.fail_alloc_after_bytes = 0;
    s.allocated_bytes = 0;
    s.fail_op = PC_OP_COUNT;
    s.fail_op_launch = 0;
    s.stall_ms = 0;
    s.stall_launch = 1;
    s.launches = 0;
    s.op_launches = 0;
    const char* env_profile = std::getenv("POLYCHIP_EMU_PROFILE");
    std::string profile = env_profile ? env_profile : "";
    for (size_t i = 0; i < n_params; ++i) {
      if (params[i].key && std::strcmp(params[i].key, "profile") == 0 && params[i].value)
        profile = params[i].value;
    }
    if (profile != "" && profile != "full" && profile != "xre")
      return BadArg("parameter profile must be full or xre, got '" + profile + "'");
    s.xre = profile == "xre";
    if (s.xre) Log(PC_LOG_INFO, "profile xre: Kunlun XRE's capability set");
    SetProfileMembers(s.xre);
    for (size_t i = 0; i < n_params; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      const char* value = params[i].value ? params[i].value : "";
      long long v = 0;
      if (key == "devices") {
        if (!polychip::sdk::ParseInt(value, &v) || v < 1 || v > 16)
          return BadArg(std::string("parameter devices must be 1..16, got '") + value + "'");
        s.n_devices = static_cast<int>(v);
      } else if (key == "profile") {
        // read above
      } else if (key == "op_counters") {
        if (std::strcmp(value, "on") != 0 && std::strcmp(value, "off") != 0)
          return BadArg(std::string("parameter op_counters must be on or off, got '") + value +
                        "'");
        s.count_ops = std::strcmp(value, "on") == 0;
      } else if (key == "memory_mb") {
        if (!polychip::sdk::ParseInt(value, &v) || v < 1 || v > (1ll << 24))
          return BadArg(std::string("parameter memory_mb must be positive, got '") + value + "'");
        s.memory_bytes = static_cast<uint64_t>(v) << 20;
      } else if (key == "max_alloc_bytes") {
        // Smaller limits make the framework's splitting of large tensors testable on small
        // models.
        if (!polychip::sdk::ParseInt(value, &v) || v < int64_t(kAlignment) ||
            v % int64_t(kAlignment) != 0) {
          return BadArg(std::string("parameter max_alloc_bytes must be a positive multiple of ") +
                        std::to_string(kAlignment) + ", got '" + value + "'");
        }
        s.max_alloc = static_cast<uint64_t>(v);
      } else if (key == "only_ops") {
        std::stringstream list(value);
        std::string name;
        while (std::getline(list, name, ',')) {
          name.erase(0, name.find_first_not_of(" \t"));
          name.erase(name.find_last_not_of(" \t") + 1);
          if (name.empty()) continue;
          pc_op_t op;
          if (!polychip::sdk::OpFromName(name.c_str(), &op)) {
            std::string known;
            polychip::sdk::ForEachOp([&](auto t) {
              known += (known.empty() ? "" : ", ") + std::string(decltype(t)::kName);
            });
            return BadArg("parameter only_ops: unknown op '" + name + "' (ops: " + known + ")");
          }
          s.only_ops.insert(op);
        }
        if (s.only_ops.empty()) return BadArg("parameter only_ops names no op");
        Log(PC_LOG_INFO, std::string("only_ops: claiming ") + value + " only");
      } else if (key == "fail_alloc_after_bytes") {
        if (!polychip::sdk::ParseInt(value, &v))
          return BadArg(std::string("parameter fail_alloc_after_bytes must be a byte count, got '") +
                        value + "'");
        // 0 would mean "off"; failing the very first allocation is 1 byte.
        s.fail_alloc_after_bytes = std::max<uint64_t>(v, 1);
        Log(PC_LOG_WARNING, std::string("fault injection: allocations fail after ") + value +
                                " bytes");
      } else if (key == "fail_op_launch") {
        std::string text = value;
        const size_t colon = text.find(':');
        if (colon != std::string::npos) {
          const std::string name = text.substr(0, colon);
          if (!polychip::sdk::OpFromName(name.c_str(), &s.fail_op))
            return BadArg("parameter fail_op_launch: unknown op '" + name + "'");
          text = text.substr(colon + 1);
        }
        if (!polychip::sdk::ParseInt(text.c_str(), &v) || v < 1)
          return BadArg(std::string("parameter fail_op_launch must be [OP:]N with N >= 1, got '") +
                        value + "'");
        s.fail_op_launch = v;
        Log(PC_LOG_WARNING, std::string("fault injection: op launch ") + value + " fails");
      } else if (key == "stall_stream_ms") {
        std::string text = value;
        const size_t at = text.find('@');
        if (at != std::string::npos) {
          if (!polychip::sdk::ParseInt(text.substr(at + 1).c_str(), &v) || v < 1)
            return BadArg(std::string("parameter stall_stream_ms must be MS[@N], got '") + value +
                          "'");
          s.stall_launch = v;
          text = text.substr(0, at);
        }
        if (!polychip::sdk::ParseInt(text.c_str(), &v) || v > 3600 * 1000)
          return BadArg(std::string("parameter stall_stream_ms must be MS[@N], got '") + value +
                        "'");
        s.stall_ms = v;
        Log(PC_LOG_WARNING, std::string("fault injection: a stream stalls ") + value);
      } else {
        Log(PC_LOG_WARNING, "unknown parameter '" + key + "' ignored");
      }
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.open.assign(s.n_devices, nullptr);
    return nullptr;
  });
}

void Shutdown() {}

pc_error_t* DeviceCount(int32_t* count) {
  if (!count) return BadArg("count is null");
  *count = G().n_devices;
  return nullptr;
}

pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* props) {
  return Guard([&]() -> pc_error_t* {
    if (!props || props->struct_size < sizeof(size_t)) return BadArg("props is null or too small");
    State& s = G();
    if (ordinal < 0 || ordinal >= s.n_devices) return BadArg("no such device ordinal");
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    std::snprintf(p.name, sizeof(p.name), "emu device %d (emulated accelerator)", ordinal);
    std::snprintf(p.physical_id, sizeof(p.physical_id), "emu-%04d", ordinal);
    p.total_memory = s.memory_bytes;
    p.free_memory = s.memory_bytes;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (ordinal < static_cast<int32_t>(s.open.size()) && s.open[ordinal]) {
        pc_device* d = s.open[ordinal];
        std::lock_guard<std::mutex> mlock(d->mem_mu);
        p.free_memory = d->total - d->used;
      }
    }
    p.alignment = kAlignment;
    p.max_alloc_size = std::min(s.max_alloc, s.memory_bytes);
    p.flags = PC_DEVICE_FLAG_ASYNC_COPY | PC_DEVICE_FLAG_ASYNC_EXEC;
    if (!s.xre) p.flags |= PC_DEVICE_FLAG_STREAM_PRIORITY | PC_DEVICE_FLAG_TIMING;
    p.priority_low = kPriorityLow;
    p.priority_high = s.xre ? kPriorityLow : kPriorityHigh;
    // XRE cannot say how much is free: the declared size is all a plugin can report.
    if (s.xre) p.free_memory = p.total_memory;
    p.compute_units = 1;
    // The caller's struct may be older (shorter) than ours: copy only what it declared.
    polychip::sdk::CopyToCallerStruct(p, props);
    return nullptr;
  });
}

pc_error_t* DeviceOpen(int32_t ordinal, pc_device_t** device) {
  return Guard([&]() -> pc_error_t* {
    if (!device) return BadArg("device is null");
    State& s = G();
    std::lock_guard<std::mutex> lock(s.mu);
    if (ordinal < 0 || ordinal >= static_cast<int32_t>(s.open.size()))
      return BadArg("no such device ordinal");
    if (s.open[ordinal]) return MakeError(PC_CODE_FAILED_PRECONDITION, "device already open");
    // MAP_NORESERVE: the emulated memory costs host RAM only where it is touched.
    void* region = mmap(nullptr, s.memory_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED)
      return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "cannot map the emulated device memory");
    auto* d = new pc_device;
    d->index = ordinal;
    d->region = static_cast<uint8_t*>(region);
    d->total = s.memory_bytes;
    d->free[0] = s.memory_bytes;
    if (s.xre) d->op_counters.set_flags(PC_OP_COUNTERS_BYTES | PC_OP_COUNTERS_FLOPS);
    s.open[ordinal] = d;
    *device = d;
    return nullptr;
  });
}

void DeviceClose(pc_device_t* device) {
  if (!device) return;
  device->WaitIdle();
  State& s = G();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (device->index < static_cast<int32_t>(s.open.size())) s.open[device->index] = nullptr;
  }
  munmap(device->region, device->total);
  delete device;
}

const char* VisibleDevicesEnv() { return nullptr; }

pc_error_t* MemAlloc(pc_device_t* device, uint64_t size, pc_devptr_t* out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    if (size > G().max_alloc) {
      return BadArg("allocation of " + std::to_string(size) + " bytes exceeds max_alloc_size " +
                    std::to_string(G().max_alloc));
    }
    const uint64_t rounded = (std::max<uint64_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
    State& s = G();
    if (s.fail_alloc_after_bytes != 0 &&
        s.allocated_bytes.load() + rounded > s.fail_alloc_after_bytes) {
      return MakeError(PC_CODE_RESOURCE_EXHAUSTED,
                       "emu fault injection: allocation of " + std::to_string(size) +
                           " bytes refused, " + std::to_string(s.allocated_bytes.load()) +
                           " of fail_alloc_after_bytes=" +
                           std::to_string(s.fail_alloc_after_bytes) + " already allocated");
    }
    std::lock_guard<std::mutex> lock(device->mem_mu);
    for (auto it = device->free.begin(); it != device->free.end(); ++it) {  // first fit
      if (it->second < rounded) continue;
      const uint64_t off = it->first, rest = it->second - rounded;
      device->free.erase(it);
      if (rest) device->free[off + rounded] = rest;
      device->live[off] = rounded;
      device->used += rounded;
      s.allocated_bytes += rounded;
      *out = device->Handle(off);
      return nullptr;
    }
    return MakeError(PC_CODE_RESOURCE_EXHAUSTED,
                     "emu device " + std::to_string(device->index) + " out of memory (" +
                         std::to_string(device->total - device->used) + " bytes free)");
  });
}

pc_error_t* MemFree(pc_device_t* device, pc_devptr_t ptr) {
  return Guard([&]() -> pc_error_t* {
    if (!device) return BadArg("device is null");
    if (ptr == 0) return nullptr;
    if ((ptr >> kHandleShift) != static_cast<uint64_t>(device->index) + 1)
      return BadArg("pointer does not belong to this device");
    device->WaitIdle();  // no async free: work still queued may use the memory
    std::lock_guard<std::mutex> lock(device->mem_mu);
    uint64_t off = ptr & kOffsetMask;
    auto it = device->live.find(off);
    if (it == device->live.end()) return BadArg("pointer is not the start of an allocation");
    uint64_t size = it->second;
    device->live.erase(it);
    device->used -= size;
    // Coalesce with the neighbouring free ranges.
    auto next = device->free.lower_bound(off);
    if (next != device->free.end() && off + size == next->first) {
      size += next->second;
      next = device->free.erase(next);
    }
    if (next != device->free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += size;
        return nullptr;
      }
    }
    device->free[off] = size;
    return nullptr;
  });
}

pc_error_t* MemGetInfo(pc_device_t* device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!device || !free_bytes || !total_bytes) return BadArg("null argument");
  std::lock_guard<std::mutex> lock(device->mem_mu);
  *free_bytes = device->total - device->used;
  *total_bytes = device->total;
  return nullptr;
}

pc_error_t* CheckRange(pc_device* d, pc_devptr_t p, uint64_t n, const char* what) {
  if (n && !d->Translate(p, n)) {
    return BadArg(std::string(what) + " is not valid memory of emu device " +
                  std::to_string(d->index));
  }
  return nullptr;
}

// Copies are checked at enqueue and translated again when they run (the allocation may have
// been freed in between only through a caller bug; then the stream reports the error).
pc_error_t* MemcpyH2D(pc_stream_t* stream, pc_devptr_t dst, const void* src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || (n && !src)) return BadArg("null argument");
    if (pc_error_t* e = CheckRange(stream->device, dst, n, "memcpy_h2d destination")) return e;
    pc_device* d = stream->device;
    stream->Enqueue({[=]() -> const char* {
      void* h = d->Translate(dst, n);
      if (!h) return "memcpy_h2d destination freed before the copy ran";
      std::memcpy(h, src, n);
      return nullptr;
    }});
    return nullptr;
  });
}

pc_error_t* MemcpyD2H(pc_stream_t* stream, void* dst, pc_devptr_t src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || (n && !dst)) return BadArg("null argument");
    if (pc_error_t* e = CheckRange(stream->device, src, n, "memcpy_d2h source")) return e;
    pc_device* d = stream->device;
    stream->Enqueue({[=]() -> const char* {
      const void* h = d->Translate(src, n);
      if (!h) return "memcpy_d2h source freed before the copy ran";
      std::memcpy(dst, h, n);
      return nullptr;
    }});
    return nullptr;
  });
}

pc_error_t* MemcpyD2D(pc_stream_t* stream, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("null argument");
    if (pc_error_t* e = CheckRange(stream->device, src, n, "memcpy_d2d source")) return e;
    if (pc_error_t* e = CheckRange(stream->device, dst, n, "memcpy_d2d destination")) return e;
    pc_device* d = stream->device;
    stream->Enqueue({[=]() -> const char* {
      void* to = d->Translate(dst, n);
      const void* from = d->Translate(src, n);
      if (!to || !from) return "memcpy_d2d operand freed before the copy ran";
      std::memmove(to, from, n);
      return nullptr;
    }});
    return nullptr;
  });
}

pc_error_t* Memset(pc_stream_t* stream, pc_devptr_t dst, uint8_t value, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("null argument");
    if (pc_error_t* e = CheckRange(stream->device, dst, n, "memset destination")) return e;
    pc_device* d = stream->device;
    stream->Enqueue({[=]() -> const char* {
      void* h = d->Translate(dst, n);
      if (!h) return "memset destination freed before it ran";
      std::memset(h, value, n);
      return nullptr;
    }});
    return nullptr;
  });
}

pc_error_t* StreamCreate(pc_device_t* device, int32_t priority, pc_stream_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    auto* s = new pc_stream;
    s->device = device;
    // Without priorities (profile xre) every stream is equal, whatever was asked.
    s->priority =
        G().xre ? kPriorityLow : std::clamp<int32_t>(priority, kPriorityLow, kPriorityHigh);
    s->worker = std::thread([s] { s->Loop(); });
    *out = s;
    return nullptr;
  });
}

void StreamDestroy(pc_stream_t* stream) {
  if (!stream) return;
  {
    std::lock_guard<std::mutex> lock(stream->mu);
    stream->stopping = true;
  }
  stream->cv.notify_all();
  stream->worker.join();  // drains the queue first
  polychip::sdk::ErrorDestroy(stream->first_error);
  delete stream;
}

pc_error_t* StreamSynchronize(pc_stream_t* stream) {
  if (!stream) return BadArg("stream is null");
  return Guard([&] { return stream->Synchronize(); });
}

pc_error_t* EventCreate(pc_device_t* device, pc_event_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    auto* e = new pc_event;
    e->device = device;
    *out = e;
    return nullptr;
  });
}

void EventDestroy(pc_event_t* event) {
  if (!event) return;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    gen = event->recorded;
  }
  event->WaitFor(gen);  // a pending record still refers to it
  delete event;
}

pc_error_t* EventRecord(pc_event_t* event, pc_stream_t* stream) {
  return Guard([&]() -> pc_error_t* {
    if (!event || !stream) return BadArg("null argument");
    if (event->device != stream->device) return BadArg("event and stream on different devices");
    uint64_t gen;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      gen = ++event->recorded;
    }
    // The mark completes when the stream's earlier commands have; it runs through the executor
    // like any command so that its timestamp is taken in device order.
    stream->Enqueue({[event, gen]() -> const char* {
      // Notify under the lock: once `completed` is visible, event_destroy may free the event.
      std::lock_guard<std::mutex> lock(event->mu);
      event->completed = std::max(event->completed, gen);
      event->when = std::chrono::steady_clock::now();
      event->cv.notify_all();
      return nullptr;
    }});
    return nullptr;
  });
}

pc_error_t* StreamWaitEvent(pc_stream_t* stream, pc_event_t* event) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || !event) return BadArg("null argument");
    if (event->device != stream->device) return BadArg("event and stream on different devices");
    pc_stream::Command c;
    c.wait_event = event;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      c.wait_generation = event->recorded;
    }
    stream->Enqueue(std::move(c));
    return nullptr;
  });
}

pc_error_t* EventQuery(pc_event_t* event, int32_t* done) {
  if (!event || !done) return BadArg("null argument");
  std::lock_guard<std::mutex> lock(event->mu);
  *done = event->completed >= event->recorded ? 1 : 0;
  return nullptr;
}

pc_error_t* EventSynchronize(pc_event_t* event) {
  if (!event) return BadArg("event is null");
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(event->mu);
    gen = event->recorded;
  }
  event->WaitFor(gen);
  return nullptr;
}

pc_error_t* EventElapsedMs(pc_event_t* start, pc_event_t* end, float* ms) {
  if (!start || !end || !ms) return BadArg("null argument");
  std::scoped_lock lock(start->mu, end->mu);
  if (start->completed == 0 || end->completed == 0 || start->completed < start->recorded ||
      end->completed < end->recorded) {
    return MakeError(PC_CODE_FAILED_PRECONDITION, "both events must be recorded and complete");
  }
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return nullptr;
}

int32_t OpSupports(pc_device_t* device, const pc_op_query_t* query) {
  // A 1.0/1.1 host's query ends at shape_class (its layout is GGUF).
  if (!device || !PC_HAS_MEMBER(query, pc_op_query_t, shape_class)) return 0;
  const std::set<pc_op_t>& only = G().only_ops;
  if (!only.empty() && only.count(query->op) == 0) return 0;
  return polychip::sdk::RefSupports(*query) ? 1 : 0;
}

void* TranslateForKernel(void* ctx, pc_devptr_t ptr, uint64_t bytes) {
  return static_cast<pc_device*>(ctx)->Translate(ptr, bytes);
}

pc_error_t* OpLaunch(pc_stream_t* stream, pc_op_t op, const void* args) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("stream is null");
    if (!G().only_ops.empty() && G().only_ops.count(op) == 0) {
      return MakeError(PC_CODE_UNIMPLEMENTED, std::string("op ") + polychip::sdk::OpName(op) +
                                                  " is not in this emu device's only_ops");
    }
    if (const char* why = polychip::sdk::ValidateOpArgs(op, args)) {
      return MakeError(op > 0 && op < PC_OP_COUNT ? PC_CODE_INVALID_ARGUMENT
                                                  : PC_CODE_UNIMPLEMENTED,
                       why);
    }
    polychip::sdk::DeviceMemory mem;
    mem.ctx = stream->device;
    mem.to_host = TranslateForKernel;
    // Reject bad operand addresses now (a host pointer, another device's memory, a range
    // past an allocation) rather than failing later on the worker.
    mem.validate_only = true;
    if (const char* why = polychip::sdk::RefLaunch(op, args, mem)) {
      return BadArg(std::string(why) + " (emu device " + std::to_string(stream->device->index) +
                    ")");
    }
    mem.validate_only = false;
    // The args are read during this call only: keep a copy for the worker. An older host's
    // struct may be shorter than ours: its missing tail members stay zero (absent).
    std::vector<uint8_t> copy(polychip::sdk::OpArgsSize(op), 0);
    const size_t n = std::min(copy.size(), *static_cast<const size_t*>(args));
    std::memcpy(copy.data(), args, n);
    reinterpret_cast<size_t*>(copy.data())[0] = n;
    // Faults are decided in launch order (deterministic), and happen when the command runs.
    State& s = G();
    const int64_t launch = ++s.launches;
    bool fail = false;
    if (s.fail_op_launch > 0) {
      const int64_t nth = s.fail_op == PC_OP_COUNT ? launch
                          : op == s.fail_op       ? ++s.op_launches
                                                  : 0;
      fail = nth == s.fail_op_launch;
    }
    const int64_t stall_ms = s.stall_ms > 0 && launch == s.stall_launch ? s.stall_ms : 0;
    const bool count = s.count_ops;
    stream->Enqueue({[op, mem, copy = std::move(copy), fail, stall_ms, launch,
                      count]() -> const char* {
      if (stall_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms));
      if (fail) {
        // Static storage: the stream copies the text into its error object.
        static thread_local std::string why;
        why = std::string("emu fault injection: ") + polychip::sdk::OpName(op) + " (launch #" +
              std::to_string(launch) + ") failed (fail_op_launch)";
        return why.c_str();
      }
      const uint64_t start = count ? polychip::sdk::OpCounterTable::Now() : 0;
      const char* why = polychip::sdk::RefLaunch(op, copy.data(), mem);
      if (why == nullptr && count) {
        static_cast<pc_device*>(mem.ctx)->op_counters.Record(
            op, polychip::sdk::OpCounterTable::Now() - start,
            polychip::sdk::OpWorkOf(op, copy.data(), &mem));
      }
      return why;
    }});
    return nullptr;
  });
}

// ---- the private interface of emuccl (emu_private.h) ------------------------------------

void* PrivateTranslate(pc_stream_t* stream, pc_devptr_t ptr, uint64_t bytes) {
  if (!stream) return nullptr;
  return stream->device->Translate(ptr, bytes == 0 ? 1 : bytes);
}

int32_t PrivateEnqueueHost(pc_stream_t* stream, const char* (*run)(void*), void* ctx,
                           void (*release)(void*)) {
  if (!stream || !run) return -1;
  pc_stream::Command c;
  c.host = [run, ctx, release]() -> const char* {
    const char* why = run(ctx);
    // The text may live in ctx: copy it before release.
    static thread_local std::string kept;
    if (why) kept = why;
    if (release) release(ctx);
    return why ? kept.c_str() : nullptr;
  };
  stream->Enqueue(std::move(c));
  return 0;
}

int32_t PrivateDeviceOrdinal(pc_stream_t* stream) { return stream ? stream->device->index : -1; }

const pc_emu_private_t kPrivate = {sizeof(pc_emu_private_t), PrivateTranslate, PrivateEnqueueHost,
                                   PrivateDeviceOrdinal};

int32_t OpCountersRead(pc_device_t* device, pc_op_counters_t* out, int32_t capacity) {
  if (!device || !G().count_ops) return -1;
  return device->op_counters.Read(out, capacity);
}

// Not const: initialize sets the members a profile leaves out (SetProfileMembers).
pc_backend_iface_t g_iface = [] {
  pc_backend_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "emu";
  t.version = "0.1.0";
  t.error_code = polychip::sdk::ErrorCode;
  t.error_message = polychip::sdk::ErrorMessage;
  t.error_destroy = polychip::sdk::ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.device_count = DeviceCount;
  t.device_get_props = DeviceGetProps;
  t.device_open = DeviceOpen;
  t.device_close = DeviceClose;
  t.visible_devices_env = VisibleDevicesEnv;
  t.mem_alloc = MemAlloc;
  t.mem_free = MemFree;
  t.mem_free_async = nullptr;  // deliberately absent: the framework must cope without it
  t.mem_get_info = MemGetInfo;
  t.memcpy_h2d = MemcpyH2D;
  t.memcpy_d2h = MemcpyD2H;
  t.memcpy_d2d = MemcpyD2D;
  t.memset = Memset;
  t.host_alloc = nullptr;
  t.host_free = nullptr;
  t.weight_upload = nullptr;  // the framework uploads GGUF bytes itself
  t.weight_free = nullptr;
  t.stream_create = StreamCreate;
  t.stream_destroy = StreamDestroy;
  t.stream_synchronize = StreamSynchronize;
  t.event_create = EventCreate;
  t.event_destroy = EventDestroy;
  t.event_record = EventRecord;
  t.stream_wait_event = StreamWaitEvent;
  t.event_query = EventQuery;
  t.event_synchronize = EventSynchronize;
  t.event_elapsed_ms = EventElapsedMs;
  t.op_supports = OpSupports;
  t.op_launch = OpLaunch;
  t.op_counters_read = OpCountersRead;
  return t;
}();

// The members XRE lacks are NULL under profile xre, present otherwise. The host reads optional
// members after initialize (ABI 1.5), so the table may change here.
void SetProfileMembers(bool xre) {
  g_iface.memset = xre ? nullptr : Memset;
  g_iface.event_query = xre ? nullptr : EventQuery;
  g_iface.mem_get_info = xre ? nullptr : MemGetInfo;
  g_iface.event_elapsed_ms = xre ? nullptr : EventElapsedMs;
}

}  // namespace

extern "C" {

PC_EXPORT void pc_backend_probe(pc_probe_result_t* result) {
  if (!result) return;
  result->score = 1;  // a test device: usable, but never preferred over real hardware
  std::snprintf(result->reason, sizeof(result->reason), "emulated accelerator (testing only)");
}

PC_EXPORT const pc_emu_private_t* pc_emu_private(void) { return &kPrivate; }

PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
                                                       uint32_t host_abi_minor,
                                                       const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;
  G().host = host;
  return &g_iface;
}

}  // extern "C"
