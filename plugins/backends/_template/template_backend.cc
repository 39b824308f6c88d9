// The template device plugin: the smallest complete polychip backend, and the starting point
// for a new chip: `scripts/new-backend.sh NAME` copies this folder to plugins/backends/NAME and
// renames it. Then replace every place marked VENDOR with your runtime's call.
//
// What it models: one device whose memory is host memory, executing every operation
// synchronously on the calling thread, every op through the SDK's reference kernels (so a
// model runs before any kernel is ported). It is honest about that: op_supports claims what
// the reference kernels compute and nothing else, and the capability flags claim nothing it
// does not do (no asynchronous copies or execution, no stream priorities, no timing), so the
// framework adapts.
//
// Walkthrough, in the order the framework calls things:
//   1. pc_backend_probe      cheap: is the driver there? (no context creation)
//   2. pc_backend_get_api    hand out the table (static lifetime)
//   3. initialize            read parameters, initialise the vendor runtime
//   4. device_*              enumerate and open devices
//   5. mem_* / memcpy_*      device memory
//   6. stream_* / event_*    ordering; here trivially complete
//   7. op_supports/op_launch the compute domain
//
// Rules that keep a plugin well-behaved (see pc_backend.h):
//   - every exported function catches everything (polychip::sdk::Guard does it);
//   - errors are objects with a canonical code; RESOURCE_EXHAUSTED for out-of-memory;
//   - never claim a capability you do not have.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/op_counters.h"  // per-op counters: launches, time, bytes, FLOPs
#include "polychip/sdk/plugin_util.h"  // error objects, Guard
#include "polychip/sdk/ref_kernels.h"  // RefSupports / RefLaunch: every op, correct, slow

using polychip::sdk::Guard;
using polychip::sdk::MakeError;

// Opaque handles: define them however your runtime needs. VENDOR: keep your context, stream
// and event objects in these structs.
struct pc_device {
  int32_t ordinal;
  polychip::sdk::OpCounterTable op_counters;  // read by op_counters_read
};
struct pc_stream {
  pc_device* device;
};
struct pc_event {
  pc_device* device;
};

namespace {

constexpr uint64_t kAlignment = 64;          // VENDOR: your allocator's guarantee
const pc_host_services_t* g_host = nullptr;  // logger etc., valid until unload
bool g_open = false;                         // one handle per ordinal at a time

// The device's memory is the host's. VENDOR: query the device (total, and free right now).
uint64_t TotalMemory() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}
uint64_t FreeMemory() {
  return static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

pc_error_t* BadArg(const char* msg) { return MakeError(PC_CODE_INVALID_ARGUMENT, msg); }

void Log(pc_log_level_t level, const std::string& msg) {
  if (g_host && g_host->log) g_host->log(g_host->host_ctx, level, "template", msg.c_str());
}

// ---- lifetime ---------------------------------------------------------------------------

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  // VENDOR: initialise your runtime here. Unknown parameters are ignored with a warning.
  for (size_t i = 0; i < n_params; ++i) {
    Log(PC_LOG_WARNING, std::string("unknown parameter '") + (params[i].key ? params[i].key : "") +
                            "' ignored");
  }
  return nullptr;
}
void Shutdown() {}  // VENDOR: tear the runtime down

// ---- device domain ----------------------------------------------------------------------

pc_error_t* DeviceCount(int32_t* count) {
  if (!count) return BadArg("count is null");
  *count = 1;  // VENDOR: number of visible devices
  return nullptr;
}

pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* props) {
  return Guard([&]() -> pc_error_t* {
    if (!props || props->struct_size < sizeof(size_t)) return BadArg("props is null or too small");
    if (ordinal != 0) return BadArg("no such device ordinal");
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    std::snprintf(p.name, sizeof(p.name), "template device 0 (host memory)");
    std::snprintf(p.physical_id, sizeof(p.physical_id), "template:0");  // VENDOR: PCI bus id
    p.total_memory = TotalMemory();
    p.free_memory = FreeMemory();
    p.alignment = kAlignment;
    p.max_alloc_size = p.total_memory;  // VENDOR: your allocator's largest single block
    p.flags = PC_DEVICE_FLAG_HOST_ACCESSIBLE;  // nothing async, no priorities, no timing
    p.priority_low = p.priority_high = 0;
    p.compute_units = 1;
    // The caller's struct may be older (shorter) than ours: copy only what it declared.
    polychip::sdk::CopyToCallerStruct(p, props);
    return nullptr;
  });
}

pc_error_t* DeviceOpen(int32_t ordinal, pc_device_t** device) {
  return Guard([&]() -> pc_error_t* {
    if (!device) return BadArg("device is null");
    if (ordinal != 0) return BadArg("no such device ordinal");
    if (g_open) return MakeError(PC_CODE_FAILED_PRECONDITION, "device already open");
    g_open = true;
    *device = new pc_device{ordinal};  // VENDOR: create the context
    return nullptr;
  });
}

void DeviceClose(pc_device_t* device) {
  // VENDOR: wait for the device's work, destroy the context.
  if (device) g_open = false;
  delete device;
}

// ---- memory domain ----------------------------------------------------------------------

pc_error_t* MemAlloc(pc_device_t* device, uint64_t size, pc_devptr_t* out) {
  if (!device || !out) return BadArg("null argument");
  // The contract: a request above max_alloc_size is refused, never attempted.
  if (size > TotalMemory()) {
    return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "allocation larger than max_alloc_size");
  }
  // VENDOR: your device allocator. Round up so the size is a multiple of the alignment.
  const uint64_t rounded = (std::max<uint64_t>(size, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "out of device memory");
  *out = reinterpret_cast<uintptr_t>(p);
  return nullptr;
}

pc_error_t* MemFree(pc_device_t* device, pc_devptr_t ptr) {
  if (!device) return BadArg("device is null");
  std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(ptr)));  // VENDOR: sync, then free
  return nullptr;
}

pc_error_t* MemGetInfo(pc_device_t* device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!device || !free_bytes || !total_bytes) return BadArg("null argument");
  *free_bytes = FreeMemory();
  *total_bytes = TotalMemory();
  return nullptr;
}

void* Host(pc_devptr_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// Copies are "stream-ordered"; executed at once they trivially are. VENDOR: enqueue your
// runtime's asynchronous copy on the stream (and then set PC_DEVICE_FLAG_ASYNC_COPY).
pc_error_t* MemcpyH2D(pc_stream_t* s, pc_devptr_t dst, const void* src, uint64_t n) {
  if (!s) return BadArg("stream is null");
  if (n) std::memcpy(Host(dst), src, n);
  return nullptr;
}
pc_error_t* MemcpyD2H(pc_stream_t* s, void* dst, pc_devptr_t src, uint64_t n) {
  if (!s) return BadArg("stream is null");
  if (n) std::memcpy(dst, Host(src), n);
  return nullptr;
}
pc_error_t* MemcpyD2D(pc_stream_t* s, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
  if (!s) return BadArg("stream is null");
  if (n) std::memmove(Host(dst), Host(src), n);
  return nullptr;
}
pc_error_t* Memset(pc_stream_t* s, pc_devptr_t dst, uint8_t value, uint64_t n) {
  if (!s) return BadArg("stream is null");
  if (n) std::memset(Host(dst), value, n);
  return nullptr;
}

// ---- sync domain: everything completes before the call returns ------------------------

pc_error_t* StreamCreate(pc_device_t* device, int32_t priority, pc_stream_t** out) {
  if (!device || !out) return BadArg("null argument");
  *out = new (std::nothrow) pc_stream{device};  // VENDOR: create a stream
  return *out ? nullptr : MakeError(PC_CODE_RESOURCE_EXHAUSTED, "out of host memory");
}
void StreamDestroy(pc_stream_t* stream) { delete stream; }
pc_error_t* StreamSynchronize(pc_stream_t* stream) {
  return stream ? nullptr : BadArg("stream is null");
}
pc_error_t* EventCreate(pc_device_t* device, pc_event_t** out) {
  if (!device || !out) return BadArg("null argument");
  *out = new (std::nothrow) pc_event{device};
  return *out ? nullptr : MakeError(PC_CODE_RESOURCE_EXHAUSTED, "out of host memory");
}
void EventDestroy(pc_event_t* event) { delete event; }
pc_error_t* EventRecord(pc_event_t* e, pc_stream_t* s) {
  return e && s ? nullptr : BadArg("null argument");
}
pc_error_t* StreamWaitEvent(pc_stream_t* s, pc_event_t* e) {
  return e && s ? nullptr : BadArg("null argument");
}
pc_error_t* EventQuery(pc_event_t* e, int32_t* done) {
  if (!e || !done) return BadArg("null argument");
  *done = 1;
  return nullptr;
}
pc_error_t* EventSynchronize(pc_event_t* e) { return e ? nullptr : BadArg("event is null"); }

// ---- compute domain ---------------------------------------------------------------------
//
// Day one, every op runs on the SDK's reference kernels (scalar, readable: the semantics the
// conformance kit checks), so the plugin runs `polychip run` from its first build. Bring the
// chip up one kernel at a time: give the op its own branch in OpLaunch, run
// `polychip conformance --plugin <the .so> --filter '^op\.<op>'`, repeat.
//
// The reference kernels read operands through host pointers (IdentityMemory: device address ==
// host pointer), which holds while device memory is host memory, as here. Once mem_alloc hands
// out real device memory, an op not yet ported either reaches it through a DeviceMemory that
// maps device addresses into the host (ref_kernels.h; the emu plugin does that), or is no
// longer claimed by OpSupports, and the user runs with `--op-fallback cpu`: the framework then
// stages that op's operands through host memory to the cpu plugin.

int32_t OpSupports(pc_device_t* device, const pc_op_query_t* q) {
  // A 1.0/1.1 host's query ends at shape_class (and means the GGUF layout).
  if (!device || !PC_HAS_MEMBER(q, pc_op_query_t, shape_class)) return 0;
  // VENDOR: answer 1 for what your kernels run; the reference answers for the rest. A layout
  // other than PC_LAYOUT_GGUF (q->layout) names one of your weight_upload layouts: only your
  // kernels read it, the reference reads GGUF only.
  return polychip::sdk::RefSupports(*q) ? 1 : 0;
}

pc_error_t* OpLaunch(pc_stream_t* stream, pc_op_t op, const void* args) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("stream is null");
    // An op id newer than the SDK this plugin was built with: absent, not a bad argument.
    if (polychip::sdk::OpArgsSize(op) == 0) {
      return MakeError(PC_CODE_UNIMPLEMENTED, "op unknown to the template plugin");
    }
    // VENDOR: your kernels, one branch per op as you port them, enqueued on the stream; the SDK
    // checks the args struct (struct_size, shapes, dtypes) for you:
    //   if (op == PC_OP_MATMUL) {
    //     if (const char* why = polychip::sdk::ValidateOpArgs(op, args)) return BadArg(why);
    //     return ChipMatmul(stream, *static_cast<const pc_matmul_args_t*>(args));
    //   }
    // Every other op: the reference kernel, validated first, on the calling thread.
    // Per-op counters: here the kernel runs on the calling thread, so the host clock around it
    // is the op's time. VENDOR: on a device, take the time from device timestamps or events
    // around the kernel (see the Vulkan plugin) and record when the stream reaches them.
    const uint64_t start = polychip::sdk::OpCounterTable::Now();
    const polychip::sdk::DeviceMemory mem = polychip::sdk::IdentityMemory();
    const char* why = polychip::sdk::RefLaunch(op, args, mem);
    if (why) return BadArg(why);
    stream->device->op_counters.Record(op, polychip::sdk::OpCounterTable::Now() - start,
                                       polychip::sdk::OpWorkOf(op, args, &mem));
    return nullptr;
  });
}

// Per-op counters (ABI 1.3): launches, time, bytes and FLOPs of each op since device_open.
int32_t OpCountersRead(pc_device_t* device, pc_op_counters_t* out, int32_t capacity) {
  return device ? device->op_counters.Read(out, capacity) : -1;
}

const pc_backend_iface_t kIface = [] {
  pc_backend_iface_t t{};  // members left NULL are optional features we do not offer
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "template";
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
  t.op_counters_read = OpCountersRead;
  return t;
}();

}  // namespace

extern "C" {

// VENDOR: check that the driver library can be found (dlopen with RTLD_NOLOAD / a version
// query) and that a device is visible; score 0 and a reason otherwise.
PC_EXPORT void pc_backend_probe(pc_probe_result_t* result) {
  if (!result) return;
  result->score = 1;
  std::snprintf(result->reason, sizeof(result->reason), "template plugin (host memory)");
}

PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
                                                       uint32_t host_abi_minor,
                                                       const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;  // a different major cannot work
  g_host = host;
  return &kIface;
}

}  // extern "C"
