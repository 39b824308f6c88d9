#include "common/fake_backend.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>

#ifdef FAKE_PLUGIN_MISSING_DEP
extern "C" int pctest_helper_value(void);  // from libpctest_helper.so, deliberately not findable
#endif

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif

struct pc_error {
  pc_code_t code;
  std::string message;
};
struct pc_device {
  int32_t ordinal;
};
struct pc_stream {
  pc_device* device;
};
struct pc_event {
  bool recorded = false;
  uint64_t epoch = 0;  // completion epoch when recorded while paused
};

namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kMaxAlloc = 64ull << 20;

std::mutex g_mu;
FakeStats g_stats{};
uint64_t g_total = 256ull << 20;
bool g_paused = false;
uint64_t g_epoch = 0;  // bumped on unpause: events recorded before then complete
// Device address -> host memory. Addresses are offsets from a fake base, never host pointers.
std::map<uint64_t, std::pair<void*, uint64_t>> g_allocs;
uint64_t g_next_addr = 0x100000000ull;

pc_error_t* Err(pc_code_t code, std::string msg) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_stats.errors_created;
  return new pc_error{code, std::move(msg)};
}

// Host pointer for a device address inside an allocation, or nullptr.
char* HostPtr(uint64_t addr, uint64_t n) {
  auto it = g_allocs.upper_bound(addr);
  if (it == g_allocs.begin()) return nullptr;
  --it;
  if (addr + n > it->first + it->second.second) return nullptr;
  return static_cast<char*>(it->second.first) + (addr - it->first);
}

pc_code_t ErrorCode(const pc_error_t* e) { return e->code; }
const char* ErrorMessage(const pc_error_t* e) { return e->message.c_str(); }
void ErrorDestroy(pc_error_t* e) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_stats.errors_destroyed;
  }
  delete e;
}

pc_error_t* Initialize(const pc_param_t* params, size_t n) {
#ifdef FAKE_PLUGIN_MISSING_DEP
  if (pctest_helper_value() != 42) return Err(PC_CODE_INTERNAL, "helper");
#endif
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (std::strcmp(params[i].key, "fail") == 0) {
      return Err(PC_CODE_UNAVAILABLE, std::string("asked to fail: ") + params[i].value);
    }
    s += std::string(i ? ";" : "") + params[i].key + "=" + params[i].value;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::snprintf(g_stats.last_params, sizeof(g_stats.last_params), "%s", s.c_str());
  g_stats.initialized = 1;
  return nullptr;
}
void Shutdown() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats.initialized = 0;
}

pc_error_t* DeviceCount(int32_t* count) {
  *count = 2;
  return nullptr;
}
pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* p) {
  if (ordinal < 0 || ordinal >= 2) return Err(PC_CODE_INVALID_ARGUMENT, "no such device");
  std::lock_guard<std::mutex> lock(g_mu);
  std::snprintf(p->name, sizeof(p->name), "fake device %d", ordinal);
  std::snprintf(p->physical_id, sizeof(p->physical_id), "fake-%d", ordinal);
  p->total_memory = g_total;
  p->free_memory = g_total - g_stats.bytes_in_use;
  p->alignment = kAlign;
  p->max_alloc_size = kMaxAlloc;
  p->flags = PC_DEVICE_FLAG_ASYNC_EXEC | PC_DEVICE_FLAG_STREAM_PRIORITY;
  p->priority_low = 0;
  p->priority_high = 3;
  p->compute_units = 4;
  return nullptr;
}
pc_error_t* DeviceOpen(int32_t ordinal, pc_device_t** out) {
  if (ordinal < 0 || ordinal >= 2) return Err(PC_CODE_INVALID_ARGUMENT, "no such device");
  *out = new pc_device{ordinal};
  return nullptr;
}
void DeviceClose(pc_device_t* d) { delete d; }

pc_error_t* MemAlloc(pc_device_t*, uint64_t size, pc_devptr_t* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_stats.alloc_calls;
  if (size > kMaxAlloc) {
    ++g_stats.errors_created;
    return new pc_error{PC_CODE_INVALID_ARGUMENT, "size exceeds max_alloc_size"};
  }
  if (g_stats.bytes_in_use + size > g_total) {
    ++g_stats.errors_created;
    return new pc_error{PC_CODE_RESOURCE_EXHAUSTED, "fake device out of memory"};
  }
  void* p = std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign);
  *out = g_next_addr;
  g_next_addr += (size + kAlign - 1) / kAlign * kAlign + kAlign;  // a gap catches overruns
  g_allocs[*out] = {p, size};
  ++g_stats.live_allocs;
  g_stats.bytes_in_use += size;
  return nullptr;
}
pc_error_t* MemFree(pc_device_t*, pc_devptr_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_stats.free_calls;
  auto it = g_allocs.find(ptr);
  if (it == g_allocs.end()) {
    ++g_stats.errors_created;
    return new pc_error{PC_CODE_INVALID_ARGUMENT, "free of an unknown address"};
  }
  std::free(it->second.first);
  g_stats.bytes_in_use -= it->second.second;
  --g_stats.live_allocs;
  g_allocs.erase(it);
  return nullptr;
}
pc_error_t* MemGetInfo(pc_device_t*, uint64_t* f, uint64_t* t) {
  std::lock_guard<std::mutex> lock(g_mu);
  *t = g_total;
  *f = g_total - g_stats.bytes_in_use;
  return nullptr;
}
pc_error_t* MemcpyH2D(pc_stream_t*, pc_devptr_t dst, const void* src, uint64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  char* d = HostPtr(dst, n);
  if (d == nullptr) return new pc_error{PC_CODE_INVALID_ARGUMENT, "bad address"};
  std::memcpy(d, src, n);
  return nullptr;
}
pc_error_t* MemcpyD2H(pc_stream_t*, void* dst, pc_devptr_t src, uint64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  char* s = HostPtr(src, n);
  if (s == nullptr) return new pc_error{PC_CODE_INVALID_ARGUMENT, "bad address"};
  std::memcpy(dst, s, n);
  return nullptr;
}
pc_error_t* MemcpyD2D(pc_stream_t*, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  char* d = HostPtr(dst, n);
  char* s = HostPtr(src, n);
  if (d == nullptr || s == nullptr) return new pc_error{PC_CODE_INVALID_ARGUMENT, "bad address"};
  std::memmove(d, s, n);
  return nullptr;
}
pc_error_t* Memset(pc_stream_t*, pc_devptr_t dst, uint8_t v, uint64_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  char* d = HostPtr(dst, n);
  if (d == nullptr) return new pc_error{PC_CODE_INVALID_ARGUMENT, "bad address"};
  std::memset(d, v, n);
  return nullptr;
}

pc_error_t* StreamCreate(pc_device_t* d, int32_t, pc_stream_t** out) {
  *out = new pc_stream{d};
  return nullptr;
}
void StreamDestroy(pc_stream_t* s) { delete s; }
pc_error_t* StreamSync(pc_stream_t*) { return nullptr; }
pc_error_t* EventCreate(pc_device_t*, pc_event_t** out) {
  *out = new pc_event;
  return nullptr;
}
void EventDestroy(pc_event_t* e) { delete e; }
pc_error_t* EventRecord(pc_event_t* e, pc_stream_t*) {
  std::lock_guard<std::mutex> lock(g_mu);
  e->recorded = g_paused;
  e->epoch = g_epoch;
  return nullptr;
}
pc_error_t* StreamWaitEvent(pc_stream_t*, pc_event_t*) { return nullptr; }
bool Done(const pc_event_t* e) { return !e->recorded || e->epoch < g_epoch; }
pc_error_t* EventQuery(pc_event_t* e, int32_t* done) {
  std::lock_guard<std::mutex> lock(g_mu);
  *done = Done(e) ? 1 : 0;
  return nullptr;
}
pc_error_t* EventSync(pc_event_t* e) {
  std::lock_guard<std::mutex> lock(g_mu);
  // Nothing runs the paused stream but the test: waiting would hang, so report it.
  if (!Done(e)) return new pc_error{PC_CODE_FAILED_PRECONDITION, "stream paused"};
  return nullptr;
}
int32_t OpSupports(pc_device_t*, const pc_op_query_t* q) { return q->op == PC_OP_ADD; }
pc_error_t* OpLaunch(pc_stream_t*, pc_op_t op, const void* args) {
  if (op != PC_OP_ADD) return Err(PC_CODE_UNIMPLEMENTED, "only add");
  const auto* a = static_cast<const pc_add_args_t*>(args);
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t n = static_cast<uint64_t>(a->n) * 4;
  auto* x = reinterpret_cast<float*>(HostPtr(a->a, n));
  auto* y = reinterpret_cast<float*>(HostPtr(a->b, n));
  auto* o = reinterpret_cast<float*>(HostPtr(a->out, n));
  if (!x || !y || !o) return new pc_error{PC_CODE_INVALID_ARGUMENT, "bad address"};
  for (int64_t i = 0; i < a->n; ++i) o[i] = x[i] + y[i];
  return nullptr;
}

pc_backend_iface_t MakeTable() {
  pc_backend_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
#ifdef FAKE_PLUGIN_FUTURE_ABI
  t.abi_major = PC_ABI_MAJOR + 1;
#endif
  t.name = FAKE_NAME;
  t.version = "0.0.1-test";
  t.error_code = ErrorCode;
  t.error_message = ErrorMessage;
  t.error_destroy = ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.device_count = DeviceCount;
  t.device_get_props = DeviceGetProps;
  t.device_open = DeviceOpen;
  t.device_close = DeviceClose;
  t.mem_alloc = MemAlloc;
#ifdef FAKE_PLUGIN_NULL_MEMBER
  t.mem_alloc = nullptr;
#endif
  t.mem_free = MemFree;
  t.mem_get_info = MemGetInfo;
  t.memcpy_h2d = MemcpyH2D;
  t.memcpy_d2h = MemcpyD2H;
  t.memcpy_d2d = MemcpyD2D;
  t.memset = Memset;
  t.stream_create = StreamCreate;
  t.stream_destroy = StreamDestroy;
  t.stream_synchronize = StreamSync;
  t.event_create = EventCreate;
  t.event_destroy = EventDestroy;
  t.event_record = EventRecord;
  t.stream_wait_event = StreamWaitEvent;
  t.event_query = EventQuery;
  t.event_synchronize = EventSync;
  t.op_supports = OpSupports;
  t.op_launch = OpLaunch;
  return t;
}

}  // namespace

extern "C" {

const pc_backend_iface_t* FakeBackendTable() {
  static const pc_backend_iface_t table = MakeTable();
  return &table;
}
FakeStats* FakeGetStats() { return &g_stats; }
void FakeSetPaused(int paused) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_paused && !paused) ++g_epoch;
  g_paused = paused != 0;
}
void FakeSetMemory(uint64_t total_bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_total = total_bytes;
}

#ifdef FAKE_PLUGIN_EXPORT
PC_EXPORT void pc_backend_probe(pc_probe_result_t* r) {
#ifdef FAKE_PLUGIN_PROBE_ZERO
  r->score = 0;
  std::snprintf(r->reason, sizeof(r->reason), "no fake accelerator present (test)");
#elif defined(FAKE_PLUGIN_PROBE_FROM_ENV)
  // PCTEST_PROBE=crash: the probe segfaults; =hang: it never returns; otherwise usable.
  const char* mode = std::getenv("PCTEST_PROBE");
  if (mode != nullptr && std::strcmp(mode, "crash") == 0) std::raise(SIGSEGV);
  while (mode != nullptr && std::strcmp(mode, "hang") == 0) pause();
  r->score = 1;  // below goodfake's, so that automatic selection is unchanged
  std::snprintf(r->reason, sizeof(r->reason), "ok");
#else
  r->score = 10;
  std::snprintf(r->reason, sizeof(r->reason), "ok");
#endif
}
#ifndef FAKE_PLUGIN_NO_GET_API
PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t, uint32_t,
                                                       const pc_host_services_t*) {
  return FakeBackendTable();
}
#endif
#endif

}  // extern "C"
