/*
 * polychip plugin ABI — the device plugin table.
 *
 * A device plugin is a shared library named libpolychip_backend_<name>.so exporting:
 *
 *   PC_EXPORT void pc_backend_probe(pc_probe_result_t* result);                 (optional)
 *   PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
 *                                                            uint32_t host_abi_minor,
 *                                                            const pc_host_services_t* host);
 *
 * pc_backend_probe must be cheap and must not create a context: it fills result->score (0 =
 * unusable) and result->reason. pc_backend_get_api returns a table with static lifetime, or
 * NULL when the plugin cannot serve a host of that major version. The host then checks
 * abi_major, struct_size and that every required member is non-NULL before using the table.
 *
 * Member annotations used below:
 *   [required] / [optional: may be NULL]
 *   [sync]   the call completes before it returns
 *   [stream]  stream-ordered: enqueued on the stream, completes later in stream order
 *   [any thread] may be called concurrently from several threads
 *   [one thread per stream]  calls naming the same stream must not race
 * Ownership: objects the plugin creates (devices, streams, events, allocations, errors) are
 * released through the matching destroy/free member of the same table.
 *
 * Optional members may depend on the plugin's parameters (since 1.5): initialize may set or
 * clear them in the table get_api returned (same address), and the host reads them only after
 * initialize. Required members never change.
 */
#ifndef POLYCHIP_PLUGIN_PC_BACKEND_H_
#define POLYCHIP_PLUGIN_PC_BACKEND_H_

#include "polychip/plugin/pc_common.h"
#include "polychip/plugin/pc_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pc_device pc_device_t; /* an opened device (a context on one physical device) */
typedef struct pc_stream pc_stream_t; /* an in-order queue of work on one device */
typedef struct pc_event pc_event_t;   /* a marker recorded on a stream */

/* Device capability flags (pc_device_props.flags). Honest by contract: a plugin that lacks a
 * feature reports it absent; the framework adapts (e.g. stages through host memory). */
#define PC_DEVICE_FLAG_HOST_ACCESSIBLE (1u << 0) /* device addresses are host pointers */
#define PC_DEVICE_FLAG_ASYNC_FREE (1u << 1)      /* mem_free_async is stream-ordered */
#define PC_DEVICE_FLAG_ASYNC_COPY (1u << 2)      /* copies run asynchronously to the host */
#define PC_DEVICE_FLAG_ASYNC_EXEC (1u << 3)      /* ops run asynchronously to the host */
#define PC_DEVICE_FLAG_STREAM_PRIORITY (1u << 4) /* stream priorities are honoured */
#define PC_DEVICE_FLAG_WEIGHT_REPACK (1u << 5)   /* weight_upload may choose a private layout */
#define PC_DEVICE_FLAG_TIMING (1u << 6)          /* event_elapsed_ms is supported */

typedef struct pc_device_props {
  size_t struct_size;
  char name[128];          /* human-readable, e.g. "emu device 1 (emulated accelerator)" */
  char physical_id[64];    /* stable across processes and plugins, e.g. a PCI bus id or UUID */
  uint64_t total_memory;   /* bytes */
  uint64_t free_memory;    /* bytes, at the time of the query */
  uint64_t alignment;      /* every allocation and every op operand offset is aligned to this */
  uint64_t max_alloc_size; /* largest single mem_alloc, bytes */
  uint32_t flags;          /* PC_DEVICE_FLAG_* */
  int32_t priority_low;    /* numerically: the lowest-priority stream value (e.g. 0) */
  int32_t priority_high;   /* the highest-priority value; equal to priority_low if unsupported */
  int32_t compute_units;   /* cores, SMs, clusters: a sizing hint */
} pc_device_props_t;

/* Result of weight_upload: where the weight lives and in which layout. */
typedef struct pc_weight {
  size_t struct_size;
  pc_devptr_t data;  /* allocation owned by the plugin; release with weight_free */
  uint32_t layout;   /* PC_LAYOUT_GGUF or a plugin-private tag, passed back in matmul args */
  uint64_t bytes;    /* device memory used */
} pc_weight_t;

/* Per-op counters (ABI 1.3): which members of a pc_op_counters record the plugin measures. A
 * member whose flag is absent reads 0 and means "not measured", never "took no time". */
#define PC_OP_COUNTERS_TIME (1u << 0)  /* device_ns */
#define PC_OP_COUNTERS_BYTES (1u << 1) /* bytes_read, bytes_written */
#define PC_OP_COUNTERS_FLOPS (1u << 2) /* flops */

/* What one device did for one op since the device was opened. Cumulative and never reset: a
 * reader that wants the cost of a step takes a snapshot before and after and subtracts, so
 * several readers (the metrics exporter, the scheduler, a profiler) never disturb each other.
 * A plugin may count a launch when it is enqueued or when it completes (its time only then);
 * either way a snapshot taken after stream_synchronize of every stream that launched includes
 * every launch made before it, time included. */
typedef struct pc_op_counters {
  size_t struct_size;
  int32_t op;             /* pc_op_t */
  uint32_t flags;         /* PC_OP_COUNTERS_*: the members below that are measured */
  uint64_t launches;      /* op_launch calls accepted (that returned NULL) */
  uint64_t device_ns;     /* time the device spent running the op: device timestamps or events
                           * on an accelerator, the host's monotonic clock on a CPU plugin */
  uint64_t bytes_read;    /* operand bytes read (a weight at its stored size) */
  uint64_t bytes_written; /* operand bytes written */
  uint64_t flops;         /* arithmetic operations (a multiply-add counts as two) */
} pc_op_counters_t;

typedef struct pc_backend_iface {
  size_t struct_size;
  uint32_t abi_major; /* PC_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor; /* PC_ABI_MINOR the plugin was built with */
  const char* name;    /* [required] short name, e.g. "cpu"; static */
  const char* version; /* [required] the plugin's own version string; static */

  /* ---- errors ---------------------------------------------------------------------------- */
  pc_code_t (*error_code)(const pc_error_t* error);          /* [required][any thread] */
  const char* (*error_message)(const pc_error_t* error);     /* [required][any thread]
                                                                 valid until error_destroy */
  void (*error_destroy)(pc_error_t* error);                  /* [required][any thread] */

  /* ---- lifetime -------------------------------------------------------------------------- */
  /* [required][sync] Called once before anything else but get_api/probe. params come from the
   * config file or environment (e.g. {"devices","0,1"}, {"threads","2"}); unknown keys are
   * ignored with a warning through the host logger. */
  pc_error_t* (*initialize)(const pc_param_t* params, size_t n_params);
  /* [required][sync] Called once after every object of this plugin has been released. */
  void (*shutdown)(void);

  /* ---- device domain --------------------------------------------------------------------- */
  /* [required][sync][any thread] Number of physical devices visible to this process. */
  pc_error_t* (*device_count)(int32_t* count);
  /* [required][sync][any thread] props->struct_size is set by the caller. */
  pc_error_t* (*device_get_props)(int32_t ordinal, pc_device_props_t* props);
  /* [required][sync] Opens physical device `ordinal`; one handle per ordinal at a time. */
  pc_error_t* (*device_open)(int32_t ordinal, pc_device_t** device);
  /* [required][sync] Waits for all work on the device, then releases it. */
  void (*device_close)(pc_device_t* device);
  /* [optional] Name of the environment variable this plugin honours to restrict visible
   * devices (like CUDA_VISIBLE_DEVICES), or NULL. Static string. */
  const char* (*visible_devices_env)(void);

  /* ---- memory domain --------------------------------------------------------------------- */
  /* [required][sync][any thread] Allocates `size` bytes (<= max_alloc_size) aligned to the
   * device alignment. Returns RESOURCE_EXHAUSTED when the device is out of memory. */
  pc_error_t* (*mem_alloc)(pc_device_t* device, uint64_t size, pc_devptr_t* out);
  /* [required][sync] Frees after waiting for all work on the device that may use it. */
  pc_error_t* (*mem_free)(pc_device_t* device, pc_devptr_t ptr);
  /* [optional][stream] Frees once the stream reaches this point. Present only together with
   * PC_DEVICE_FLAG_ASYNC_FREE. */
  pc_error_t* (*mem_free_async)(pc_stream_t* stream, pc_devptr_t ptr);
  /* [optional since 1.5: may be NULL][sync] Current free and total bytes. Absent (Kunlun's XRE
   * has no memory query): the host takes props.total_memory as the device's size and counts
   * free memory as that less what it allocated itself (KV cache sizing). Required before 1.5. */
  pc_error_t* (*mem_get_info)(pc_device_t* device, uint64_t* free_bytes, uint64_t* total_bytes);

  /* [required][stream] Host->device copy. `src` must stay valid and unchanged until the copy
   * completes (synchronize the stream or an event recorded after it). */
  pc_error_t* (*memcpy_h2d)(pc_stream_t* stream, pc_devptr_t dst, const void* src, uint64_t n);
  /* [required][stream] Device->host copy; `dst` is written by the time the stream reaches it. */
  pc_error_t* (*memcpy_d2h)(pc_stream_t* stream, void* dst, pc_devptr_t src, uint64_t n);
  /* [required][stream] Device->device copy on one device; regions must not overlap. */
  pc_error_t* (*memcpy_d2d)(pc_stream_t* stream, pc_devptr_t dst, pc_devptr_t src, uint64_t n);
  /* [optional since 1.5: may be NULL][stream] Sets n bytes to `value`. Absent (XRE has no
   * memset): the host fills with memcpy_h2d from a static host buffer of the value, on the same
   * stream, so the fill keeps its place in stream order. Required before 1.5. */
  pc_error_t* (*memset)(pc_stream_t* stream, pc_devptr_t dst, uint8_t value, uint64_t n);

  /* [optional][sync] Page-locked host memory for faster staging; free with host_free. */
  pc_error_t* (*host_alloc)(pc_device_t* device, uint64_t size, void** out);
  void (*host_free)(pc_device_t* device, void* ptr);

  /* [optional][sync] Uploads a weight matrix [rows, cols] of dtype from host memory, possibly
   * repacked into a private layout. Absent: the framework allocates and copies the GGUF bytes
   * itself (layout PC_LAYOUT_GGUF). The host buffer may be released when this returns.
   * out->struct_size is set by the caller. */
  pc_error_t* (*weight_upload)(pc_device_t* device, pc_dtype_t dtype, int64_t rows, int64_t cols,
                               const void* host_data, uint64_t host_bytes, pc_weight_t* out);
  /* [optional, required with weight_upload][sync] */
  pc_error_t* (*weight_free)(pc_device_t* device, const pc_weight_t* weight);

  /* ---- sync domain ----------------------------------------------------------------------- */
  /* [required][sync] priority within [priority_low, priority_high]; out-of-range values are
   * clamped. A plugin without priorities accepts any value and ignores it. */
  pc_error_t* (*stream_create)(pc_device_t* device, int32_t priority, pc_stream_t** out);
  /* [required][sync] Waits for the stream's work, then releases it. */
  void (*stream_destroy)(pc_stream_t* stream);
  /* [required][sync] Blocks until all work enqueued so far has completed. Returns the first
   * asynchronous error the stream hit since the last synchronize, if any. */
  pc_error_t* (*stream_synchronize)(pc_stream_t* stream);

  pc_error_t* (*event_create)(pc_device_t* device, pc_event_t** out); /* [required][sync] */
  void (*event_destroy)(pc_event_t* event);                           /* [required][sync] */
  /* [required][stream] Marks the current end of the stream; re-recording moves the mark. */
  pc_error_t* (*event_record)(pc_event_t* event, pc_stream_t* stream);
  /* [required][stream] Work enqueued on `stream` after this waits for the event. The event
   * may belong to another stream of the same device. */
  pc_error_t* (*stream_wait_event)(pc_stream_t* stream, pc_event_t* event);
  /* [optional since 1.5: may be NULL][sync] *done = 1 if the event completed (or was never
   * recorded), else 0. Absent (XRE has no event query): the host takes a recorded event as not
   * known to be complete until event_synchronize returned, and waits where it must know (its
   * memory pool reuses a block freed on another stream only then). Required before 1.5. */
  pc_error_t* (*event_query)(pc_event_t* event, int32_t* done);
  /* [required][sync] Blocks until the event completes. */
  pc_error_t* (*event_synchronize)(pc_event_t* event);
  /* [optional][sync] Milliseconds between two completed events (PC_DEVICE_FLAG_TIMING). */
  pc_error_t* (*event_elapsed_ms)(pc_event_t* start, pc_event_t* end, float* ms);

  /* ---- compute domain -------------------------------------------------------------------- */
  /* [required][sync][any thread] 1 if the device can run the op with these dtypes, else 0. */
  int32_t (*op_supports)(pc_device_t* device, const pc_op_query_t* query);
  /* [required][stream] Enqueues op with its pc_*_args struct (see pc_ops.h). Argument errors
   * are returned at once (INVALID_ARGUMENT, UNIMPLEMENTED); errors during execution are
   * reported by the next stream_synchronize. */
  pc_error_t* (*op_launch)(pc_stream_t* stream, pc_op_t op, const void* args);

  /* ---- counters domain ------------------------------------------------------------------- */
  /* [optional][sync] Number of named performance counters of the device. */
  int32_t (*counter_count)(pc_device_t* device);
  /* [optional][sync] Name (static string) and current value of counter i. */
  pc_error_t* (*counter_get)(pc_device_t* device, int32_t i, const char** name, double* value);
  /* The two members above carry the plugin's own extras (cache hits of a repacked layout,
   * queue depth, allocated bytes); the framework exports them as they are. */

  /* ---- appended in ABI 1.3 ----------------------------------------------------------------- */
  /* [optional][sync][any thread] Per-op counters of the device (see pc_op_counters_t). The
   * caller sets out[0].struct_size to sizeof(pc_op_counters_t) as it was compiled; that is the
   * stride of the array. The plugin fills up to `capacity` records, one per op the device has
   * run at least once, in ascending op order, writing at most its own record size of each and
   * setting each record's struct_size to what it wrote. Returns the number of such ops (which
   * may exceed capacity: call again with a larger array), or -1 when counting is switched off
   * (for example by a plugin parameter), which the host reads as "absent". Counting must be
   * cheap enough to stay on in production. */
  int32_t (*op_counters_read)(pc_device_t* device, pc_op_counters_t* out, int32_t capacity);
} pc_backend_iface_t;

typedef void (*pc_backend_probe_fn)(pc_probe_result_t* result);
typedef const pc_backend_iface_t* (*pc_backend_get_api_fn)(uint32_t host_abi_major,
                                                           uint32_t host_abi_minor,
                                                           const pc_host_services_t* host);

#define PC_BACKEND_PROBE_SYMBOL "pc_backend_probe"
#define PC_BACKEND_GET_API_SYMBOL "pc_backend_get_api"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_PLUGIN_PC_BACKEND_H_ */
