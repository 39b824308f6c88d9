/*
 * polychip plugin ABI — common definitions shared by device and comm plugins.
 *
 * This is LAYER 2: the only contract between the framework (src/) and a plugin
 * (plugins/). It is plain C99 so that any toolchain can implement it.
 *
 * Versioning rules (see CHANGELOG.md beside this file):
 *   - Every table and every argument struct begins with `size_t struct_size`, set by whoever
 *     fills the struct to sizeof() of the struct as *they* compiled it.
 *   - Members are only ever appended. A reader accepts a larger struct and treats tail members
 *     that lie beyond the writer's struct_size as absent (NULL / zero).
 *   - PC_ABI_MAJOR changes only when something breaks; the host refuses a plugin whose major
 *     differs from its own. PC_ABI_MINOR grows with every append.
 *
 * Errors: a fallible call returns `pc_error_t*`; NULL means success. A non-NULL error is owned
 * by the caller, who must release it with the error_destroy member of the table of the plugin
 * that produced it. No C++ exception ever crosses this boundary.
 */
#ifndef POLYCHIP_PLUGIN_PC_COMMON_H_
#define POLYCHIP_PLUGIN_PC_COMMON_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PC_ABI_MAJOR 1
#define PC_ABI_MINOR 8

/* Exported symbols are marked so, whatever the visibility default of the plugin's build. */
#if defined(_WIN32)
#define PC_EXPORT __declspec(dllexport)
#else
#define PC_EXPORT __attribute__((visibility("default")))
#endif

/* True when `member` of struct pointer `s` lies within the struct_size the writer declared. */
#define PC_HAS_MEMBER(s, type, member) \
  ((s) != NULL && (s)->struct_size >= offsetof(type, member) + sizeof(((type*)0)->member))

/* ---------------------------------------------------------------------------------------------
 * Error objects
 * ------------------------------------------------------------------------------------------- */

/* Canonical codes. RESOURCE_EXHAUSTED is distinct because the scheduler reacts to it (it evicts
 * cached KV blocks or preempts a request and retries) instead of failing the request. */
typedef enum pc_code {
  PC_CODE_OK = 0,
  PC_CODE_INVALID_ARGUMENT = 1,
  PC_CODE_NOT_FOUND = 2,
  PC_CODE_RESOURCE_EXHAUSTED = 3,
  PC_CODE_UNIMPLEMENTED = 4,
  PC_CODE_UNAVAILABLE = 5,
  PC_CODE_FAILED_PRECONDITION = 6,
  PC_CODE_CANCELLED = 7,
  PC_CODE_INTERNAL = 8,
} pc_code_t;

/* Opaque, owned by the plugin that created it. */
typedef struct pc_error pc_error_t;

/* ---------------------------------------------------------------------------------------------
 * Element types. Quantized types use the block layouts of the GGUF format (the numbering
 * deliberately matches GGUF's ggml_type so a tensor's type can be passed through unchanged).
 * ------------------------------------------------------------------------------------------- */
typedef enum pc_dtype {
  PC_DTYPE_F32 = 0,
  PC_DTYPE_F16 = 1,
  PC_DTYPE_Q4_0 = 2,  /* 32 weights/block: f16 scale + 16 bytes of nibbles          (18 B) */
  PC_DTYPE_Q4_1 = 3,  /* 32 weights/block: f16 scale, f16 min + 16 bytes of nibbles  (20 B) */
  PC_DTYPE_Q5_0 = 6,  /* 32 weights/block: f16 scale, 4 B high bits, 16 B nibbles     (22 B) */
  PC_DTYPE_Q5_1 = 7,  /* 32 weights/block: f16 scale, f16 min, 4 B high bits, 16 B    (24 B) */
  PC_DTYPE_Q8_0 = 8,  /* 32 weights/block: f16 scale + 32 int8                        (34 B) */
  PC_DTYPE_Q2_K = 10, /* 256 weights/super-block                                      (84 B) */
  PC_DTYPE_Q3_K = 11, /*                                                              (110 B) */
  PC_DTYPE_Q4_K = 12, /*                                                              (144 B) */
  PC_DTYPE_Q5_K = 13, /*                                                              (176 B) */
  PC_DTYPE_Q6_K = 14, /*                                                              (210 B) */
  PC_DTYPE_IQ4_NL = 20, /* 32 weights/block: f16 scale + 16 B nibbles indexing a 16-value
                            non-linear codebook (sdk kIq4nlValues)                  (18 B) */
  PC_DTYPE_IQ4_XS = 23, /* 256 weights: f16 d, u16 scales_h, 4 B scales_l (a 6-bit sub-scale
                            per 32, minus 32), 128 B nibbles into IQ4_NL's codebook (136 B) */
  PC_DTYPE_I8 = 24,
  PC_DTYPE_I16 = 25,
  PC_DTYPE_I32 = 26,
  PC_DTYPE_I64 = 27,
  PC_DTYPE_F64 = 28,
  PC_DTYPE_BF16 = 30,
  /* (1.6) 32 values/block: one E8M0 scale byte (2^(e - 127)) + 32 FP8 E4M3 codes (1 sign, 4
   * exponent bits biased by 7, 3 mantissa bits; no infinities; 0x7F/0xFF are NaN; largest
   * finite 448): value i = scale * e4m3(code i)                                       (33 B).
   * OCP's MX block (MXFP8 E4M3). Not a GGUF type: numbered above GGUF's range. KV caches only
   * (KV_STORE, ATTENTION); no plugin needs to read it as a weight. */
  PC_DTYPE_FP8_E4M3 = 100,
  PC_DTYPE_INVALID = -1,
  /* Not a type: widens the enum to 32 bits, as PC_OP_MAX_ENUM_ does for pc_op_t, so that a
   * GGUF type id this header does not know is still a valid value (refused, never undefined). */
  PC_DTYPE_MAX_ENUM_ = 0x7FFFFFFF,
} pc_dtype_t;

/* ---------------------------------------------------------------------------------------------
 * Host services: passed by the framework to get_api(); valid until the plugin is unloaded.
 * All members are thread-safe and may be called from any plugin thread.
 * ------------------------------------------------------------------------------------------- */
typedef enum pc_log_level {
  PC_LOG_DEBUG = 0,
  PC_LOG_INFO = 1,
  PC_LOG_WARNING = 2,
  PC_LOG_ERROR = 3,
} pc_log_level_t;

typedef struct pc_host_services {
  size_t struct_size;
  void* host_ctx; /* passed back as the first argument of every service */

  /* Required. Logs one line (no trailing newline needed). `source` names the plugin. */
  void (*log)(void* host_ctx, pc_log_level_t level, const char* source, const char* message);

  /* Required. A key-value store shared by every rank of a job, used to bootstrap communicators
   * (rank 0 publishes the unique id, the others read it). kv_get blocks until the key exists or
   * timeout_ms elapses (then returns PC_CODE_UNAVAILABLE). *value_size receives the stored size;
   * if it exceeds `capacity`, nothing is copied and PC_CODE_RESOURCE_EXHAUSTED is returned. */
  pc_code_t (*kv_set)(void* host_ctx, const char* key, const void* value, size_t size);
  pc_code_t (*kv_get)(void* host_ctx, const char* key, void* value, size_t capacity,
                      size_t* value_size, int64_t timeout_ms);

  /* Optional (may be NULL). Adds `delta` to a named counter the framework exports (Prometheus). */
  void (*counter_add)(void* host_ctx, const char* name, double delta);
} pc_host_services_t;

/* A key/value string parameter from the config file or the environment, e.g.
 * {"devices", "0,1"} or {"protocol", "ring"}. Strings are owned by the host and valid only
 * during the call that receives them. */
typedef struct pc_param {
  const char* key;
  const char* value;
} pc_param_t;

/* Probe result: cheap, creates no context. score 0 = unusable; the reason then says why
 * ("driver libfoo.so.2 not found", "no device visible"). Higher scores win auto-selection. */
typedef struct pc_probe_result {
  size_t struct_size;
  int32_t score;
  char reason[256];
} pc_probe_result_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_PLUGIN_PC_COMMON_H_ */
