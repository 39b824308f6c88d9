// The cpu device plugin. Device memory is host memory (devptr == host pointer, 64-byte
// aligned), every operation runs on the calling thread (helped by the plugin's thread pool)
// except a small LORA launch, which runs on a worker beside the independent launches after it
// (launch_overlap.h); every other call waits for it, so the host sees synchronous execution.
// Kernels: SIMD variants chosen from CPUID (kernels.h) for matmul, attention, rope, rms_norm,
// swiglu, moe and lora; the SDK reference kernels for the rest.
// At weight_upload, quantized weights are repacked into the layout of packed.h and, on AVX-512
// and AVX2, float weights into the panels of panel.h; MATMUL and EMBEDDING both read those layouts (a tied
// embedding table is held once). One counter: allocated_bytes. Per-op counters (ABI 1.3):
// launches, time on the host's monotonic clock around each kernel, bytes and FLOPs
// (sdk/op_counters.h).
//
// Parameters: threads (default: physical cores), isa (auto|scalar|avx2|avx512; also the
// environment variable POLYCHIP_CPU_ISA), devices (default 1), op_counters (on|off, default
// on; also the environment variable POLYCHIP_OP_COUNTERS), huge_pages (on|off, default off;
// also POLYCHIP_CPU_HUGE_PAGES; see kHugePage), weight_streams (auto|1..4, default auto: measured
// while decoding, streams_tuner.h; also POLYCHIP_CPU_WEIGHT_STREAMS; decode's weight streams per
// thread, OpContext), weight_prefetch (on|off, default on; also POLYCHIP_CPU_WEIGHT_PREFETCH;
// whether decode prefetches in software where weight_streams is a number; auto tunes both),
// lora_overlap (on|off, default on; also POLYCHIP_CPU_LORA_OVERLAP; launch_overlap.h).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <set>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu_ops.h"
#include "kernels.h"
#include "launch_overlap.h"
#include "packed.h"
#include "panel.h"
#include "polychip/sdk/op_counters.h"
#include "thread_pool.h"
#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/plugin_util.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"

using polychip::sdk::Guard;
using polychip::sdk::MakeError;

struct pc_device {
  int32_t ordinal;
  std::mutex mu;
  std::unordered_map<void*, uint64_t> allocations;  // live allocations and their sizes
  uint64_t allocated = 0;
  polychip::sdk::OpCounterTable op_counters;
};

struct pc_stream {
  pc_device* device;
};

struct pc_event {
  pc_device* device;
  bool recorded = false;
  // Record waits for the work before it, so its time is when that work was done.
  std::chrono::steady_clock::time_point when;
};

namespace {

constexpr uint64_t kAlignment = 64;
// Buffers of at least this size go on transparent huge pages with the parameter huge_pages=on:
// 2 MiB aligned, madvise (Debian's THP default is "madvise"). Off by default: on the Zen 5 VMs
// measured (docs/performance.md, "Huge pages") decode got slower with them, by ~5% on
// qwen2.5-0.5b and ~20% on qwen3-0.6b Q4_K_M, though a step streams every weight once.
constexpr uint64_t kHugePage = uint64_t{2} << 20;

// The LORA launch running on a pool worker beside the launches after it (launch_overlap.h), if
// any. Guarded by State::launch_mu.
struct DeferredLora {
  bool pending = false;
  pc_lora_args_t args{};
  polychip::cpu::LaunchAccess access;
  pc_device* device = nullptr;  // whose op counters count it
  uint64_t ns = 0;              // its run time, written by the thread that ran it
};

struct State {
  const pc_host_services_t* host = nullptr;
  int threads = 1;
  int n_devices = 1;
  bool count_ops = true;  // parameter op_counters
  bool huge_pages = false;  // parameter huge_pages
  bool lora_overlap = true;  // parameter lora_overlap (launch_overlap.h)
  bool tune_weight_reads = true;  // parameter weight_streams=auto
  int weight_streams = polychip::cpu::OpContext{}.weight_streams;  // weight_streams=N
  bool weight_prefetch = true;  // parameter weight_prefetch (OpContext::weight_prefetch)
  // Chooses decode's weight streams while weight_streams is auto (streams_tuner.h).
  std::unique_ptr<polychip::cpu::StreamsTuner> streams_tuner;
  const polychip::cpu::KernelTable* kernels = nullptr;
  std::unique_ptr<polychip::cpu::ThreadPool> pool;
  std::mutex launch_mu;  // the pool runs one op at a time
  DeferredLora deferred;
  std::mutex mu;
  std::vector<pc_device*> open;  // by ordinal, nullptr when closed
};
State& G() {
  static State s;
  return s;
}

// Waits for the LORA launch on the worker, if any, and counts it. The caller holds launch_mu.
void FinishDeferredLocked() {
  State& s = G();
  DeferredLora& d = s.deferred;
  if (!d.pending) return;
  s.pool->Join();
  d.pending = false;
  if (s.count_ops) {
    const polychip::sdk::DeviceMemory host = polychip::sdk::IdentityMemory();
    d.device->op_counters.Record(PC_OP_LORA, d.ns,
                                 polychip::sdk::OpWorkOf(PC_OP_LORA, &d.args, &host));
  }
}

// Before a call that reads or writes device memory outside a launch, or says work is done.
void FinishDeferred() {
  std::lock_guard<std::mutex> launch(G().launch_mu);
  FinishDeferredLocked();
}

void Log(pc_log_level_t level, const std::string& msg) {
  const pc_host_services_t* h = G().host;
  if (h && h->log) h->log(h->host_ctx, level, "cpu", msg.c_str());
}

// The memory limit of this process's cgroup and its ancestors (a container's limits.memory, a
// systemd unit's MemoryMax=), and what of it is still free: the machine's free RAM is no measure
// inside a container, and a KV cache sized from it gets the process killed. cgroup v2
// (memory.max, memory.current) or v1 (memory.limit_in_bytes, memory.usage_in_bytes); the
// reclaimable inactive file pages are not counted as used (the kubelet's working set).
struct MemoryLimit {
  uint64_t limit = UINT64_MAX;
  uint64_t free = UINT64_MAX;
};
MemoryLimit CgroupMemoryLimit() {
  auto read_u64 = [](const std::string& file, uint64_t* v) {
    std::ifstream in(file);
    return static_cast<bool>(in >> *v);
  };
  auto stat_u64 = [](const std::string& file, const std::string& key) {
    std::ifstream in(file);
    std::string k;
    uint64_t v = 0;
    while (in >> k >> v) {
      if (k == key) return v;
    }
    return uint64_t{0};
  };
  MemoryLimit m;
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroups, line)) {  // "0::/path" (v2) or "4:memory:/path" (v1)
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    const bool v2 = controllers == ",,";
    if (!v2 && controllers.find(",memory,") == std::string::npos) continue;
    const std::string mount = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    // Inside a container's namespace the path may name a folder the mount does not show: each
    // level that exists is read, up to the mount's root.
    std::string path = line.substr(b + 1);
    while (true) {
      const std::string dir = mount + (path == "/" ? "" : path);
      uint64_t limit = 0, used = 0;
      if (read_u64(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), &limit) &&
          limit < (uint64_t{1} << 60) &&  // v1 says "no limit" with a huge number, v2 "max"
          read_u64(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"), &used)) {
        const uint64_t cache =
            stat_u64(dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file");
        used -= std::min(used, cache);
        m.limit = std::min(m.limit, limit);
        m.free = std::min(m.free, limit - std::min(limit, used));
      }
      if (path.empty() || path == "/") break;
      path = path.substr(0, path.rfind('/'));
      if (path.empty()) path = "/";
    }
  }
  return m;
}

uint64_t PhysicalMemory() {
  return std::min(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE),
                  CgroupMemoryLimit().limit);
}
uint64_t AvailableMemory() {
  return std::min(static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE),
                  CgroupMemoryLimit().free);
}

pc_error_t* BadArg(const std::string& msg) { return MakeError(PC_CODE_INVALID_ARGUMENT, msg); }

// Physical cores (distinct core ids per package), so that SMT siblings do not oversubscribe
// the vector units; falls back to the hardware thread count.
int PhysicalCores() {
  std::set<std::pair<int, int>> cores;
  const unsigned n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned cpu = 0; cpu < n; ++cpu) {
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core(dir + "core_id"), pkg(dir + "physical_package_id");
    int c = -1, p = -1;
    if (!(core >> c) || !(pkg >> p)) return static_cast<int>(n);
    cores.insert({p, c});
  }
  return cores.empty() ? static_cast<int>(n) : static_cast<int>(cores.size());
}

polychip::cpu::OpContext Ctx() {
  State& s = G();
  return {s.pool.get(), s.kernels, s.weight_streams,
          s.tune_weight_reads ? s.streams_tuner.get() : nullptr, s.weight_prefetch};
}

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  return Guard([&]() -> pc_error_t* {
    State& s = G();
    s.threads = PhysicalCores();
    s.n_devices = 1;
    const char* env_isa = std::getenv("POLYCHIP_CPU_ISA");
    std::string isa = env_isa ? env_isa : "auto";
    const char* env_counters = std::getenv("POLYCHIP_OP_COUNTERS");
    std::string op_counters = env_counters ? env_counters : "on";
    const char* env_huge = std::getenv("POLYCHIP_CPU_HUGE_PAGES");
    std::string huge_pages = env_huge ? env_huge : "off";
    const char* env_streams = std::getenv("POLYCHIP_CPU_WEIGHT_STREAMS");
    std::string weight_streams = env_streams ? env_streams : "auto";
    const char* env_prefetch = std::getenv("POLYCHIP_CPU_WEIGHT_PREFETCH");
    std::string weight_prefetch = env_prefetch ? env_prefetch : "on";
    const char* env_overlap = std::getenv("POLYCHIP_CPU_LORA_OVERLAP");
    std::string lora_overlap = env_overlap ? env_overlap : "on";
    for (size_t i = 0; i < n_params; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      long long v = 0;
      if (key == "isa") {
        isa = params[i].value ? params[i].value : "";
      } else if (key == "op_counters") {
        op_counters = params[i].value ? params[i].value : "";
      } else if (key == "huge_pages") {
        huge_pages = params[i].value ? params[i].value : "";
      } else if (key == "weight_streams") {
        weight_streams = params[i].value ? params[i].value : "";
      } else if (key == "weight_prefetch") {
        weight_prefetch = params[i].value ? params[i].value : "";
      } else if (key == "lora_overlap") {
        lora_overlap = params[i].value ? params[i].value : "";
      } else if (key == "threads" || key == "devices") {
        if (!polychip::sdk::ParseInt(params[i].value, &v) || v < 1 || v > 1024) {
          return BadArg("parameter " + key + " must be a positive integer, got '" +
                        (params[i].value ? params[i].value : "") + "'");
        }
        (key == "threads" ? s.threads : s.n_devices) = static_cast<int>(v);
      } else {
        Log(PC_LOG_WARNING, "unknown parameter '" + key + "' ignored");
      }
    }
    if (op_counters != "on" && op_counters != "off") {
      return BadArg("parameter op_counters must be on or off, got '" + op_counters + "'");
    }
    s.count_ops = op_counters == "on";
    if (huge_pages != "on" && huge_pages != "off") {
      return BadArg("parameter huge_pages must be on or off, got '" + huge_pages + "'");
    }
    s.huge_pages = huge_pages == "on";
    if (lora_overlap != "on" && lora_overlap != "off") {
      return BadArg("parameter lora_overlap must be on or off, got '" + lora_overlap + "'");
    }
    s.lora_overlap = lora_overlap == "on";
    long long streams = 0;
    if (weight_streams != "auto" &&
        (!polychip::sdk::ParseInt(weight_streams.c_str(), &streams) || streams < 1 ||
         streams > polychip::cpu::kMaxWeightStreams)) {
      return BadArg("parameter weight_streams must be auto or 1 to " +
                    std::to_string(polychip::cpu::kMaxWeightStreams) + ", got '" +
                    weight_streams + "'");
    }
    s.tune_weight_reads = weight_streams == "auto";
    if (!s.tune_weight_reads) s.weight_streams = static_cast<int>(streams);
    if (weight_prefetch != "on" && weight_prefetch != "off") {
      return BadArg("parameter weight_prefetch must be on or off, got '" + weight_prefetch + "'");
    }
    s.weight_prefetch = weight_prefetch == "on";
    const polychip::cpu::KernelTable* kernels = polychip::cpu::SelectKernels(isa.c_str());
    if (!kernels) {
      return BadArg("parameter isa must be auto, scalar, avx2 or avx512 (and supported by this "
                    "CPU), got '" + isa + "'");
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.kernels = kernels;
    if (!s.pool || s.pool->size() != s.threads) {
      std::lock_guard<std::mutex> launch(s.launch_mu);
      FinishDeferredLocked();
      s.pool = std::make_unique<polychip::cpu::ThreadPool>(s.threads);
    }
    if (!s.streams_tuner) {
      std::lock_guard<std::mutex> launch(s.launch_mu);
      s.streams_tuner = std::make_unique<polychip::cpu::StreamsTuner>(
          [](const std::string& msg) { Log(PC_LOG_DEBUG, msg); });
    }
    s.open.assign(s.n_devices, nullptr);
    Log(PC_LOG_INFO, std::to_string(s.n_devices) + " device(s), " + std::to_string(s.threads) +
                         " thread(s), " + kernels->name + " kernels");
    return nullptr;
  });
}

void Shutdown() {
  std::lock_guard<std::mutex> launch(G().launch_mu);
  FinishDeferredLocked();
  G().pool.reset();
}

pc_error_t* DeviceCount(int32_t* count) {
  if (!count) return BadArg("count is null");
  *count = G().n_devices;
  return nullptr;
}

pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* props) {
  return Guard([&]() -> pc_error_t* {
    if (!props || props->struct_size < sizeof(size_t)) return BadArg("props is null or too small");
    if (ordinal < 0 || ordinal >= G().n_devices) return BadArg("no such device ordinal");
    // Fill only as much as the caller's struct holds (it may be an older, shorter one).
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    std::snprintf(p.name, sizeof(p.name), "cpu device %d (host memory, %d threads, %s)", ordinal,
                  G().threads, G().kernels ? G().kernels->name : "?");
    std::snprintf(p.physical_id, sizeof(p.physical_id), "cpu:%d", ordinal);
    p.total_memory = PhysicalMemory();
    p.free_memory = AvailableMemory();
    p.alignment = kAlignment;
    p.max_alloc_size = p.total_memory;
    p.flags = PC_DEVICE_FLAG_HOST_ACCESSIBLE | PC_DEVICE_FLAG_TIMING |
              PC_DEVICE_FLAG_WEIGHT_REPACK;
    p.priority_low = 0;
    p.priority_high = 0;
    p.compute_units = G().threads;
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
    auto* d = new pc_device;
    d->ordinal = ordinal;
    s.open[ordinal] = d;
    *device = d;
    return nullptr;
  });
}

void DeviceClose(pc_device_t* device) {
  if (!device) return;
  FinishDeferred();
  State& s = G();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (device->ordinal < static_cast<int32_t>(s.open.size())) s.open[device->ordinal] = nullptr;
  }
  for (auto& [ptr, size] : device->allocations) std::free(ptr);  // leaked by the caller
  delete device;
}

pc_error_t* MemAlloc(pc_device_t* device, uint64_t size, pc_devptr_t* out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    // The contract: a request above max_alloc_size (= total memory) is refused, never tried.
    if (size > PhysicalMemory()) {
      return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "cannot allocate " + std::to_string(size) +
                                                       " bytes: more than the host's memory");
    }
    const uint64_t rounded = (std::max<uint64_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
    const bool huge = rounded >= kHugePage && G().huge_pages;
    void* p = nullptr;  // posix_memalign: the size need not be a multiple of the alignment
    if (posix_memalign(&p, huge ? kHugePage : kAlignment, rounded) != 0) p = nullptr;
    // Advice only: where the kernel has no THP the buffer keeps small pages, nothing fails.
    if (p && huge) madvise(p, rounded, MADV_HUGEPAGE);
    if (!p) {
      return MakeError(PC_CODE_RESOURCE_EXHAUSTED,
                       "cannot allocate " + std::to_string(size) + " bytes of host memory");
    }
    std::lock_guard<std::mutex> lock(device->mu);
    device->allocations[p] = rounded;
    device->allocated += rounded;
    *out = reinterpret_cast<uintptr_t>(p);
    return nullptr;
  });
}

pc_error_t* MemFree(pc_device_t* device, pc_devptr_t ptr) {
  return Guard([&]() -> pc_error_t* {
    if (!device) return BadArg("device is null");
    if (ptr == 0) return nullptr;
    FinishDeferred();
    void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
    std::lock_guard<std::mutex> lock(device->mu);
    auto it = device->allocations.find(p);
    if (it == device->allocations.end()) return BadArg("pointer was not allocated by mem_alloc");
    device->allocated -= it->second;
    device->allocations.erase(it);
    std::free(p);  // no work can still be using it: the LORA on a worker is finished
    return nullptr;
  });
}

pc_error_t* MemGetInfo(pc_device_t* device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!device || !free_bytes || !total_bytes) return BadArg("null argument");
  *total_bytes = PhysicalMemory();
  *free_bytes = AvailableMemory();
  return nullptr;
}

// Packable quantized weights are repacked (packed.h); anything else is copied as it is.
pc_error_t* WeightUpload(pc_device_t* device, pc_dtype_t dtype, int64_t rows, int64_t cols,
                         const void* host_data, uint64_t host_bytes, pc_weight_t* out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out || (host_bytes && !host_data)) return BadArg("null argument");
    const int64_t row_bytes = polychip::sdk::RowBytes(dtype, cols);
    if (rows < 0 || row_bytes < 0 || static_cast<uint64_t>(row_bytes * rows) != host_bytes)
      return BadArg("weight shape does not match its byte size");
    polychip::cpu::PackedFormat f;
    const bool pack = polychip::cpu::PackedFormatOf(dtype, &f) && rows > 0;
    // Float matrices go into panels where the kernel table has a panel GEMM (AVX-512, AVX2).
    // One of fewer rows than a panel (a LoRA adapter's A at rank 16) stays as it is: padded to
    // a panel it would be read twice over, and its few dot products are as fast.
    const bool panels = !pack && polychip::cpu::PanelDtype(dtype) &&
                        Ctx().k->gemm_panel != nullptr && rows >= polychip::cpu::kPanelRows;
    const uint64_t bytes = pack     ? polychip::cpu::PackedBytes(f, rows, cols)
                           : panels ? polychip::cpu::PanelBytes(dtype, rows, cols)
                                    : host_bytes;
    FinishDeferred();
    pc_devptr_t dst = 0;
    if (pc_error_t* e = MemAlloc(device, bytes, &dst)) return e;
    void* dst_host = reinterpret_cast<void*>(static_cast<uintptr_t>(dst));
    if (pack || panels) {
      std::lock_guard<std::mutex> launch(G().launch_mu);
      if (pack) {
        polychip::cpu::PackParallel(Ctx(), dtype, host_data, rows, cols, dst_host);
      } else {
        polychip::cpu::PackPanelsParallel(Ctx(), dtype, host_data, rows, cols, dst_host);
      }
    } else if (host_bytes) {
      std::memcpy(dst_host, host_data, host_bytes);
    }
    out->data = dst;
    out->layout = pack     ? polychip::cpu::kLayoutPacked
                  : panels ? polychip::cpu::kLayoutPanel
                           : PC_LAYOUT_GGUF;
    out->bytes = bytes;
    return nullptr;
  });
}

pc_error_t* WeightFree(pc_device_t* device, const pc_weight_t* weight) {
  if (!device || !weight) return BadArg("null argument");
  return MemFree(device, weight->data);
}

void* Host(pc_devptr_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

pc_error_t* MemcpyH2D(pc_stream_t* stream, pc_devptr_t dst, const void* src, uint64_t n) {
  if (!stream || (n && (!dst || !src))) return BadArg("null argument");
  FinishDeferred();
  if (n) std::memcpy(Host(dst), src, n);
  return nullptr;
}
pc_error_t* MemcpyD2H(pc_stream_t* stream, void* dst, pc_devptr_t src, uint64_t n) {
  if (!stream || (n && (!dst || !src))) return BadArg("null argument");
  FinishDeferred();
  if (n) std::memcpy(dst, Host(src), n);
  return nullptr;
}
pc_error_t* MemcpyD2D(pc_stream_t* stream, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
  if (!stream || (n && (!dst || !src))) return BadArg("null argument");
  FinishDeferred();
  if (n) std::memmove(Host(dst), Host(src), n);
  return nullptr;
}
pc_error_t* Memset(pc_stream_t* stream, pc_devptr_t dst, uint8_t value, uint64_t n) {
  if (!stream || (n && !dst)) return BadArg("null argument");
  FinishDeferred();
  if (n) std::memset(Host(dst), value, n);
  return nullptr;
}

pc_error_t* StreamCreate(pc_device_t* device, int32_t priority, pc_stream_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    *out = new pc_stream{device};  // priorities are accepted and ignored (range is [0, 0])
    return nullptr;
  });
}
void StreamDestroy(pc_stream_t* stream) {
  FinishDeferred();
  delete stream;
}
pc_error_t* StreamSynchronize(pc_stream_t* stream) {
  if (!stream) return BadArg("stream is null");
  FinishDeferred();  // the only work ever pending
  return nullptr;
}

pc_error_t* EventCreate(pc_device_t* device, pc_event_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    *out = new pc_event{device};
    return nullptr;
  });
}
void EventDestroy(pc_event_t* event) { delete event; }
pc_error_t* EventRecord(pc_event_t* event, pc_stream_t* stream) {
  if (!event || !stream) return BadArg("null argument");
  FinishDeferred();
  event->recorded = true;
  event->when = std::chrono::steady_clock::now();
  return nullptr;
}
pc_error_t* StreamWaitEvent(pc_stream_t* stream, pc_event_t* event) {
  return stream && event ? nullptr : BadArg("null argument");  // already complete
}
pc_error_t* EventQuery(pc_event_t* event, int32_t* done) {
  if (!event || !done) return BadArg("null argument");
  *done = 1;
  return nullptr;
}
pc_error_t* EventSynchronize(pc_event_t* event) {
  return event ? nullptr : BadArg("event is null");
}
pc_error_t* EventElapsedMs(pc_event_t* start, pc_event_t* end, float* ms) {
  if (!start || !end || !ms) return BadArg("null argument");
  if (!start->recorded || !end->recorded)
    return MakeError(PC_CODE_FAILED_PRECONDITION, "event was never recorded");
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return nullptr;
}

// Whether weight_upload can return `layout` for `dtype` (so an op may name the two together).
bool LayoutHolds(uint32_t layout, pc_dtype_t dtype) {
  if (layout == polychip::cpu::kLayoutPacked) return polychip::cpu::PackedFormatOf(dtype, nullptr);
  if (layout == polychip::cpu::kLayoutPanel)
    return polychip::cpu::PanelDtype(dtype) && Ctx().k->gemm_panel != nullptr;
  return false;
}

pc_op_query_t QueryAsGguf(const pc_op_query_t& q) {
  pc_op_query_t gguf = q;
  gguf.layout = PC_LAYOUT_GGUF;
  return gguf;
}

// Each (layout, dtype) of an op's weights: the GGUF layout, or one weight_upload returns for
// that dtype.
const char* CheckWeightLayouts(std::initializer_list<std::pair<uint32_t, pc_dtype_t>> weights) {
  for (auto [layout, dtype] : weights)
    if (layout != PC_LAYOUT_GGUF && !LayoutHolds(layout, dtype))
      return "unknown weight layout, or one this dtype is never stored in";
  return nullptr;
}

// MOE's three weights and LORA's two may each be in one of this plugin's layouts: the checks
// are the SDK's on a GGUF copy, and each layout must be one weight_upload returns for that
// weight's dtype.
const char* ValidateMoe(const pc_moe_args_t& a) {
  pc_moe_args_t gguf = a;
  gguf.gate_layout = gguf.up_layout = gguf.down_layout = PC_LAYOUT_GGUF;
  if (const char* why = polychip::sdk::Validate(gguf)) return why;
  return CheckWeightLayouts(
      {{a.gate_layout, a.gate_dtype}, {a.up_layout, a.up_dtype}, {a.down_layout, a.down_dtype}});
}
const char* ValidateLora(const pc_lora_args_t& a) {
  pc_lora_args_t gguf = a;
  gguf.a_layout = gguf.b_layout = PC_LAYOUT_GGUF;
  if (const char* why = polychip::sdk::Validate(gguf)) return why;
  return CheckWeightLayouts({{a.a_layout, a.a_dtype}, {a.b_layout, a.b_dtype}});
}

int32_t OpSupports(pc_device_t* device, const pc_op_query_t* query) {
  // A 1.0/1.1 host's query ends at shape_class (and means the GGUF layout).
  if (!device || !PC_HAS_MEMBER(query, pc_op_query_t, shape_class)) return 0;
  if (PC_HAS_MEMBER(query, pc_op_query_t, layout) && query->layout != PC_LAYOUT_GGUF) {
    // MATMUL and EMBEDDING read the weights weight_upload laid out: packed quantized types,
    // float panels.
    if (query->op == PC_OP_MOE || query->op == PC_OP_LORA) {  // the layout of one of its weights
      if (!polychip::sdk::RefSupports(QueryAsGguf(*query))) return 0;
      for (int i = 0; i < (query->op == PC_OP_MOE ? 3 : 2); ++i)
        if (LayoutHolds(query->layout, query->dtypes[i])) return 1;
      return 0;
    }
    return (query->op == PC_OP_MATMUL || query->op == PC_OP_EMBEDDING) &&
           LayoutHolds(query->layout, query->dtypes[0]);
  }
  return polychip::sdk::RefSupports(*query) ? 1 : 0;
}

// The layout of the operand that may be packed: MATMUL's weight, EMBEDDING's table (1.2: absent
// from an older host's shorter struct).
uint32_t OperandLayout(pc_op_t op, const void* args) {
  if (op == PC_OP_MATMUL) {
    auto* a = static_cast<const pc_matmul_args_t*>(args);
    return PC_HAS_MEMBER(a, pc_matmul_args_t, w_layout) ? a->w_layout : PC_LAYOUT_GGUF;
  }
  if (op == PC_OP_EMBEDDING) {
    auto* a = static_cast<const pc_embedding_args_t*>(args);
    return PC_HAS_MEMBER(a, pc_embedding_args_t, table_layout) ? a->table_layout
                                                                : PC_LAYOUT_GGUF;
  }
  return PC_LAYOUT_GGUF;
}

// A copy of a packed op's args that says PC_LAYOUT_GGUF, for the SDK's validation (which knows
// the GGUF layout only; the shape rules are the same).
template <typename Args>
Args AsGguf(const void* args, uint32_t Args::*layout) {
  Args a{};
  std::memcpy(&a, args, std::min(sizeof(a), *static_cast<const size_t*>(args)));
  a.struct_size = sizeof(a);
  a.*layout = PC_LAYOUT_GGUF;
  return a;
}

pc_error_t* OpLaunch(pc_stream_t* stream, pc_op_t op, const void* args) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("stream is null");
    // "packed": the weight operand is in one of this plugin's layouts (packed or panels).
    const uint32_t layout = args && polychip::sdk::OpArgsMinSize(op) > 0 &&
                                    *static_cast<const size_t*>(args) >=
                                        polychip::sdk::OpArgsMinSize(op)
                                ? OperandLayout(op, args)
                                : PC_LAYOUT_GGUF;
    const bool packed = layout != PC_LAYOUT_GGUF;
    pc_matmul_args_t matmul_gguf;
    pc_embedding_args_t embedding_gguf;
    const void* to_validate = args;
    if (packed && op == PC_OP_MATMUL) {
      matmul_gguf = AsGguf(args, &pc_matmul_args_t::w_layout);
      to_validate = &matmul_gguf;
    } else if (packed) {
      embedding_gguf = AsGguf(args, &pc_embedding_args_t::table_layout);
      to_validate = &embedding_gguf;
    }
    if (packed && !LayoutHolds(layout, op == PC_OP_MATMUL ? matmul_gguf.w_dtype
                                                           : embedding_gguf.table_dtype)) {
      return BadArg("unknown weight layout, or one this dtype is never stored in");
    }
    // MOE's args, zero past an older host's struct_size (its members appended later absent).
    pc_moe_args_t moe{};
    const size_t moe_size = op == PC_OP_MOE && args ? *static_cast<const size_t*>(args) : 0;
    if (op == PC_OP_MOE && moe_size >= polychip::sdk::OpArgsMinSize(PC_OP_MOE)) {
      std::memcpy(&moe, args, std::min(moe_size, sizeof(moe)));
      if (const char* why = ValidateMoe(moe)) return BadArg(why);
      args = &moe;
    } else if (op == PC_OP_LORA && args &&
               *static_cast<const size_t*>(args) >= polychip::sdk::OpArgsMinSize(PC_OP_LORA)) {
      if (const char* why = ValidateLora(*static_cast<const pc_lora_args_t*>(args)))
        return BadArg(why);
    } else if (const char* why = polychip::sdk::ValidateOpArgs(op, to_validate)) {
      return MakeError(op > 0 && op < PC_OP_COUNT ? PC_CODE_INVALID_ARGUMENT
                                                  : PC_CODE_UNIMPLEMENTED,
                       why);
    }
    const char* why = nullptr;
    State& s = G();
    std::lock_guard<std::mutex> launch(s.launch_mu);
    // What the launch touches: needed only beside a pending LORA, or to defer this one.
    polychip::cpu::LaunchAccess access;
    const bool known_access = (s.deferred.pending || op == PC_OP_LORA) &&
                              polychip::cpu::AccessOf(op, args, &access);
    if (s.deferred.pending &&
        (!known_access || s.deferred.access.OrderedBefore(access) || !s.pool->Busy())) {
      FinishDeferredLocked();
    }
    const uint64_t start = s.count_ops ? polychip::sdk::OpCounterTable::Now() : 0;
    const polychip::cpu::OpContext c = Ctx();
    switch (op) {
      case PC_OP_EMBEDDING:
        why = packed ? polychip::cpu::EmbeddingPacked(embedding_gguf, layout)
                     : polychip::sdk::RefLaunch(op, args, polychip::sdk::IdentityMemory());
        break;
      case PC_OP_MATMUL: why = Matmul(c, *static_cast<const pc_matmul_args_t*>(args)); break;
      case PC_OP_ATTENTION:
        why = Attention(c, *static_cast<const pc_attention_args_t*>(args));
        break;
      case PC_OP_ROPE: why = Rope(c, *static_cast<const pc_rope_args_t*>(args)); break;
      case PC_OP_KV_STORE:
        why = KvStore(c, *static_cast<const pc_kv_store_args_t*>(args));
        break;
      case PC_OP_RMS_NORM: why = RmsNorm(c, *static_cast<const pc_rms_norm_args_t*>(args)); break;
      case PC_OP_SWIGLU: why = Swiglu(c, *static_cast<const pc_swiglu_args_t*>(args)); break;
      case PC_OP_GEGLU: why = Geglu(c, *static_cast<const pc_geglu_args_t*>(args)); break;
      case PC_OP_MOE: why = Moe(c, *static_cast<const pc_moe_args_t*>(args)); break;
      case PC_OP_LORA: {
        const auto& lora = *static_cast<const pc_lora_args_t*>(args);
        if (s.lora_overlap && !s.deferred.pending && s.pool->size() > 1 &&
            LoraRunsAlone(c, lora)) {
          DeferredLora& d = s.deferred;
          d.pending = true;
          d.args = lora;
          d.access = access;
          d.device = stream->device;
          s.pool->Post([c, &d] {
            const uint64_t t0 = polychip::sdk::OpCounterTable::Now();
            (void)Lora(c, d.args);  // LoraRunsAlone: it cannot fail
            d.ns = polychip::sdk::OpCounterTable::Now() - t0;
          });
          return nullptr;
        }
        why = Lora(c, lora);
        break;
      }
      default: why = polychip::sdk::RefLaunch(op, args, polychip::sdk::IdentityMemory());
    }
    if (why) return MakeError(PC_CODE_INVALID_ARGUMENT, why);
    if (s.count_ops) {
      const polychip::sdk::DeviceMemory host = polychip::sdk::IdentityMemory();
      stream->device->op_counters.Record(op, polychip::sdk::OpCounterTable::Now() - start,
                                         polychip::sdk::OpWorkOf(op, args, &host));
    }
    return nullptr;
  });
}

// One counter: the bytes the device holds (mem_alloc and weight_upload, rounded to the
// alignment), so that what the weights really take can be checked from outside.
int32_t CounterCount(pc_device_t* device) { return device ? 1 : 0; }
pc_error_t* CounterGet(pc_device_t* device, int32_t i, const char** name, double* value) {
  if (!device || !name || !value) return BadArg("null argument");
  if (i != 0) return BadArg("no such counter");
  std::lock_guard<std::mutex> lock(device->mu);
  *name = "allocated_bytes";
  *value = static_cast<double>(device->allocated);
  return nullptr;
}

int32_t OpCountersRead(pc_device_t* device, pc_op_counters_t* out, int32_t capacity) {
  if (!device || !G().count_ops) return -1;
  FinishDeferred();
  return device->op_counters.Read(out, capacity);
}

const pc_backend_iface_t kIface = [] {
  pc_backend_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "cpu";
  t.version = "0.2.0";
  t.error_code = polychip::sdk::ErrorCode;
  t.error_message = polychip::sdk::ErrorMessage;
  t.error_destroy = polychip::sdk::ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.device_count = DeviceCount;
  t.device_get_props = DeviceGetProps;
  t.device_open = DeviceOpen;
  t.device_close = DeviceClose;
  t.visible_devices_env = nullptr;
  t.mem_alloc = MemAlloc;
  t.mem_free = MemFree;
  t.mem_free_async = nullptr;  // frees are synchronous; PC_DEVICE_FLAG_ASYNC_FREE is absent
  t.mem_get_info = MemGetInfo;
  t.memcpy_h2d = MemcpyH2D;
  t.memcpy_d2h = MemcpyD2H;
  t.memcpy_d2d = MemcpyD2D;
  t.memset = Memset;
  t.weight_upload = WeightUpload;
  t.weight_free = WeightFree;
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
  t.counter_count = CounterCount;
  t.counter_get = CounterGet;
  t.op_counters_read = OpCountersRead;
  return t;
}();

}  // namespace

extern "C" {

PC_EXPORT void pc_backend_probe(pc_probe_result_t* result) {
  if (!result) return;
  result->score = 10;  // always usable, but any real accelerator should win auto-selection
  std::snprintf(result->reason, sizeof(result->reason), "host CPU, %u hardware threads",
                std::thread::hardware_concurrency());
}

PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
                                                       uint32_t host_abi_minor,
                                                       const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;
  G().host = host;
  return &kIface;
}

}  // extern "C"
