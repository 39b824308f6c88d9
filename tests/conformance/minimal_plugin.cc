// A minimal device plugin for testing the conformance kit itself: host memory, synchronous
// streams, ops ADD and SWIGLU. Built once correct and once per deliberate defect, each defect
// chosen by a compile definition, so the tests can show the kit names exactly the broken check:
//   BROKEN_ADD            ADD computes a - b
//   BROKEN_ERROR_MESSAGE  error_message returns NULL
//   BROKEN_STREAM_ORDER   device-to-device copies are deferred to synchronize, overtaking
//                         memsets and host copies enqueued after them
//   FAULTS_FROM_ENV       PCTEST_ADD, PCTEST_SWIGLU, PCTEST_INIT = crash (SIGSEGV) or hang
//                         (never returns): that op's launch, or initialize, misbehaves
// Built into a test-only directory, never into build/lib/polychip (discovery must not find it).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "polychip/plugin/pc_backend.h"

struct pc_error {
  pc_code_t code;
  std::string message;
};
struct pc_device {
  int32_t ordinal;
};
struct pc_stream {
  std::vector<std::function<void()>> deferred;  // BROKEN_STREAM_ORDER only
};
struct pc_event {
  int unused;
};

namespace {

constexpr uint64_t kAlignment = 64;
constexpr uint64_t kTotal = 1ull << 30;
constexpr uint64_t kMaxAlloc = 256ull << 20;

std::mutex g_mu;
std::set<void*> g_allocations;
pc_device g_device{0};
bool g_open = false;

pc_error_t* Error(pc_code_t code, std::string message) {
  return new (std::nothrow) pc_error{code, std::move(message)};
}
void* Ptr(pc_devptr_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

pc_code_t ErrorCode(const pc_error_t* e) { return e->code; }
const char* ErrorMessage(const pc_error_t* e) {
#ifdef BROKEN_ERROR_MESSAGE
  (void)e;
  return nullptr;
#else
  return e->message.c_str();
#endif
}
void ErrorDestroy(pc_error_t* e) { delete e; }

// FAULTS_FROM_ENV: what the variable `name` asks of the call that reads it.
void MaybeMisbehave(const char* name) {
#ifdef FAULTS_FROM_ENV
  const char* mode = std::getenv(name);
  if (mode != nullptr && std::strcmp(mode, "crash") == 0) raise(SIGSEGV);
  while (mode != nullptr && std::strcmp(mode, "hang") == 0) pause();
#else
  (void)name;
#endif
}

pc_error_t* Initialize(const pc_param_t*, size_t) {
  MaybeMisbehave("PCTEST_INIT");
  return nullptr;
}
void Shutdown() {}

pc_error_t* DeviceCount(int32_t* count) {
  *count = 1;
  return nullptr;
}
pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* props) {
  if (ordinal != 0) return Error(PC_CODE_INVALID_ARGUMENT, "no such device ordinal");
  pc_device_props_t full{};
  std::strcpy(full.name, "minimal test device");
  std::strcpy(full.physical_id, "minimal-0");
  full.total_memory = kTotal;
  full.free_memory = kTotal;
  full.alignment = kAlignment;
  full.max_alloc_size = kMaxAlloc;
  full.flags = PC_DEVICE_FLAG_HOST_ACCESSIBLE;
  full.compute_units = 1;
  // Write only what the caller's struct holds (an older host passes a smaller one).
  full.struct_size = props->struct_size;
  std::memcpy(props, &full, std::min(props->struct_size, sizeof(full)));
  return nullptr;
}
pc_error_t* DeviceOpen(int32_t ordinal, pc_device_t** out) {
  if (ordinal != 0) return Error(PC_CODE_INVALID_ARGUMENT, "no such device ordinal");
  g_open = true;
  *out = &g_device;
  return nullptr;
}
void DeviceClose(pc_device_t*) { g_open = false; }

pc_error_t* MemAlloc(pc_device_t*, uint64_t size, pc_devptr_t* out) {
  if (size > kMaxAlloc) return Error(PC_CODE_RESOURCE_EXHAUSTED, "larger than max_alloc_size");
  const uint64_t rounded = (std::max<uint64_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return Error(PC_CODE_RESOURCE_EXHAUSTED, "out of host memory");
  std::lock_guard<std::mutex> lock(g_mu);
  g_allocations.insert(p);
  *out = reinterpret_cast<uintptr_t>(p);
  return nullptr;
}
pc_error_t* MemFree(pc_device_t*, pc_devptr_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_allocations.erase(Ptr(ptr)) == 0) return Error(PC_CODE_INVALID_ARGUMENT, "not allocated");
  std::free(Ptr(ptr));
  return nullptr;
}
pc_error_t* MemGetInfo(pc_device_t*, uint64_t* free_bytes, uint64_t* total) {
  *free_bytes = kTotal;
  *total = kTotal;
  return nullptr;
}

// Streams are synchronous: every call completes before it returns (except the deferred copies
// of BROKEN_STREAM_ORDER).
pc_error_t* MemcpyH2D(pc_stream_t*, pc_devptr_t dst, const void* src, uint64_t n) {
  std::memcpy(Ptr(dst), src, n);
  return nullptr;
}
pc_error_t* MemcpyD2H(pc_stream_t*, void* dst, pc_devptr_t src, uint64_t n) {
  std::memcpy(dst, Ptr(src), n);
  return nullptr;
}
pc_error_t* MemcpyD2D(pc_stream_t* s, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
#ifdef BROKEN_STREAM_ORDER
  s->deferred.push_back([=] { std::memmove(Ptr(dst), Ptr(src), n); });
#else
  (void)s;
  std::memmove(Ptr(dst), Ptr(src), n);
#endif
  return nullptr;
}
pc_error_t* Memset(pc_stream_t*, pc_devptr_t dst, uint8_t value, uint64_t n) {
  std::memset(Ptr(dst), value, n);
  return nullptr;
}

pc_error_t* StreamCreate(pc_device_t*, int32_t, pc_stream_t** out) {
  *out = new pc_stream{};
  return nullptr;
}
pc_error_t* StreamSynchronize(pc_stream_t* s) {
  for (auto& f : s->deferred) f();
  s->deferred.clear();
  return nullptr;
}
void StreamDestroy(pc_stream_t* s) {
  (void)StreamSynchronize(s);
  delete s;
}
pc_error_t* EventCreate(pc_device_t*, pc_event_t** out) {
  *out = new pc_event{};
  return nullptr;
}
void EventDestroy(pc_event_t* e) { delete e; }
pc_error_t* EventRecord(pc_event_t*, pc_stream_t* s) { return StreamSynchronize(s); }
pc_error_t* StreamWaitEvent(pc_stream_t*, pc_event_t*) { return nullptr; }
pc_error_t* EventQuery(pc_event_t*, int32_t* done) {
  *done = 1;
  return nullptr;
}
pc_error_t* EventSynchronize(pc_event_t*) { return nullptr; }

int32_t OpSupports(pc_device_t*, const pc_op_query_t* q) {
  const bool f32 = q->dtypes[0] == PC_DTYPE_F32 || q->dtypes[0] == PC_DTYPE_INVALID;
  return (q->op == PC_OP_ADD || q->op == PC_OP_SWIGLU) && f32;
}
pc_error_t* OpLaunch(pc_stream_t*, pc_op_t op, const void* args) {
  if (args == nullptr) return Error(PC_CODE_INVALID_ARGUMENT, "NULL args");
  // Both structs are unchanged since 1.0: a shorter one is a caller bug, never read past.
  const size_t size = *static_cast<const size_t*>(args);
  if ((op == PC_OP_ADD && size < sizeof(pc_add_args_t)) ||
      (op == PC_OP_SWIGLU && size < sizeof(pc_swiglu_args_t))) {
    return Error(PC_CODE_INVALID_ARGUMENT, "args struct_size too small");
  }
  if (op == PC_OP_ADD) {
    MaybeMisbehave("PCTEST_ADD");
    const auto* a = static_cast<const pc_add_args_t*>(args);
    const float* x = static_cast<const float*>(Ptr(a->a));
    const float* y = static_cast<const float*>(Ptr(a->b));
    float* out = static_cast<float*>(Ptr(a->out));
    for (int64_t i = 0; i < a->n; ++i) {
#ifdef BROKEN_ADD
      out[i] = x[i] - y[i];
#else
      out[i] = x[i] + y[i];
#endif
    }
    return nullptr;
  }
  if (op == PC_OP_SWIGLU) {
    MaybeMisbehave("PCTEST_SWIGLU");
    const auto* a = static_cast<const pc_swiglu_args_t*>(args);
    const float* g = static_cast<const float*>(Ptr(a->gate));
    const float* u = static_cast<const float*>(Ptr(a->up));
    float* out = static_cast<float*>(Ptr(a->out));
    for (int64_t i = 0; i < a->n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return nullptr;
  }
  return Error(PC_CODE_UNIMPLEMENTED, "op " + std::to_string(static_cast<int>(op)));
}

pc_backend_iface_t MakeTable() {
  pc_backend_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "minimal";
  t.version = "0.0.1";
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
  t.mem_free = MemFree;
  t.mem_get_info = MemGetInfo;
  t.memcpy_h2d = MemcpyH2D;
  t.memcpy_d2h = MemcpyD2H;
  t.memcpy_d2d = MemcpyD2D;
  t.memset = Memset;
  t.stream_create = StreamCreate;
  t.stream_destroy = StreamDestroy;
  t.stream_synchronize = StreamSynchronize;
  t.event_create = EventCreate;
  t.event_destroy = EventDestroy;
  t.event_record = EventRecord;
  t.stream_wait_event = StreamWaitEvent;
  t.event_query = EventQuery;
  t.event_synchronize = EventSynchronize;
  t.op_supports = OpSupports;
  t.op_launch = OpLaunch;
  return t;
}

const pc_backend_iface_t kTable = MakeTable();

}  // namespace

extern "C" PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
                                                                   uint32_t,
                                                                   const pc_host_services_t*) {
  return host_abi_major == PC_ABI_MAJOR ? &kTable : nullptr;
}
