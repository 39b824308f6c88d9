/*
 * polychip embedding API — polychip inside your own program (libpolychip.so).
 *
 * Register device or comm plugins (by file or by a table your program defines), list plugins
 * and devices, load a model, tokenize, and generate with streaming callbacks. Several
 * generations may run at once from several threads: they are batched together by the engine
 * (continuous batching), not run one after another.
 *
 * Prefix: `polychip_`. The plugin ABI (include/polychip/plugin/) uses `pc_`; the two never share
 * a name, so a program may include both (one that defines a plugin table must). The plugin
 * tables appear here only as the incomplete types `struct pc_backend_iface` and
 * `struct pc_comm_iface`.
 *
 * Rules, the same as the plugin ABI's (CHANGELOG.md beside this file lists each version):
 *   - POLYCHIP_API_MAJOR is the soname's version (libpolychip.so.1): a program built against
 *     major 1 loads only a major-1 library. POLYCHIP_API_MINOR grows with every addition.
 *   - Every struct passed in begins with `size_t struct_size`, set by the caller to sizeof() of
 *     the struct as the caller compiled it (the *_init functions do that and fill defaults).
 *     Members are only ever appended; the library treats members beyond the caller's
 *     struct_size as their defaults, so a program built against an older header keeps working.
 *   - Objects are opaque handles freed by the matching *_free function.
 *   - A fallible call returns `polychip_error_t*`; NULL means success. A non-NULL error is owned
 *     by the caller and released with polychip_error_free. Its message is the one the
 *     `polychip` command line prints for the same failure (every plugin path tried and why it
 *     failed, the ops a device lacks, ...). No C++ exception ever leaves the library.
 *
 * Thread-safety is stated per function: [any thread] may be called concurrently with anything
 * else; [exclusive] must not run concurrently with another call on the same handle.
 */
#ifndef POLYCHIP_POLYCHIP_H_
#define POLYCHIP_POLYCHIP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define POLYCHIP_API_MAJOR 1
#define POLYCHIP_API_MINOR 1

#if defined(_WIN32)
#define POLYCHIP_API __declspec(dllimport)
#else
#define POLYCHIP_API __attribute__((visibility("default")))
#endif

struct pc_backend_iface; /* polychip/plugin/pc_backend.h */
struct pc_comm_iface;    /* polychip/plugin/pc_comm.h */

/* [any thread] The version of the library actually loaded (may be a newer minor than the
 * header the program was built with). */
POLYCHIP_API void polychip_api_version(uint32_t* major, uint32_t* minor);

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

/* The canonical codes; the same values as the plugin ABI's pc_code_t. */
typedef enum polychip_code {
  POLYCHIP_CODE_OK = 0,
  POLYCHIP_CODE_INVALID_ARGUMENT = 1,
  POLYCHIP_CODE_NOT_FOUND = 2,
  POLYCHIP_CODE_RESOURCE_EXHAUSTED = 3,
  POLYCHIP_CODE_UNIMPLEMENTED = 4,
  POLYCHIP_CODE_UNAVAILABLE = 5,
  POLYCHIP_CODE_FAILED_PRECONDITION = 6,
  POLYCHIP_CODE_CANCELLED = 7,
  POLYCHIP_CODE_INTERNAL = 8,
} polychip_code_t;

typedef struct polychip_error polychip_error_t;

/* [any thread] */
POLYCHIP_API polychip_code_t polychip_error_code(const polychip_error_t* error);
/* [any thread] Valid until polychip_error_free; never NULL for a non-NULL error. */
POLYCHIP_API const char* polychip_error_message(const polychip_error_t* error);
/* [any thread] NULL is accepted. */
POLYCHIP_API void polychip_error_free(polychip_error_t* error);

/* [any thread] Frees a string the library returned (polychip_list_plugins). NULL is accepted. */
POLYCHIP_API void polychip_string_free(char* text);

/* A key/value string parameter. The strings are read during the call only. */
typedef struct polychip_param {
  const char* key;
  const char* value;
} polychip_param_t;

/* ---------------------------------------------------------------------------------------------
 * Plugins. The registry is process-wide: a plugin registered here is what a later
 * polychip_model_load finds by name ("counting:0"). Plugins stay loaded until the process ends.
 * `params` go to the plugin's initialize (e.g. {"threads", "4"}).
 * ------------------------------------------------------------------------------------------- */

/* [any thread] Registers a device plugin table that the program defines (see
 * examples/embed.c). It is validated like a loaded plugin's (abi_major, struct_size, required
 * members) and initialized here. The table and everything it points to must stay valid until
 * the process ends. Listed with the origin "registered by the program". FAILED_PRECONDITION if
 * a backend of the same name is already loaded. */
POLYCHIP_API polychip_error_t* polychip_register_backend_table(
    const struct pc_backend_iface* table, const polychip_param_t* params, size_t n_params);
/* [any thread] Loads a device plugin from a file (libpolychip_backend_<name>.so). The error
 * says why it cannot be loaded (dlopen with the missing libraries, symbol, ABI pair, probe). */
POLYCHIP_API polychip_error_t* polychip_register_backend_path(const char* path,
                                                              const polychip_param_t* params,
                                                              size_t n_params);
/* [any thread] The same for comm plugins. */
POLYCHIP_API polychip_error_t* polychip_register_comm_table(const struct pc_comm_iface* table,
                                                            const polychip_param_t* params,
                                                            size_t n_params);
POLYCHIP_API polychip_error_t* polychip_register_comm_path(const char* path,
                                                           const polychip_param_t* params,
                                                           size_t n_params);

/* Flags of polychip_list_plugins. */
#define POLYCHIP_LIST_DISCOVER (1u << 0) /* also load every plugin found on the search path */
#define POLYCHIP_LIST_JSON (1u << 1)     /* JSON (as `polychip devices --json`), else text */

/* [any thread] The loaded and registered plugins with their devices, as `polychip devices`
 * prints them: each plugin's name, version, ABI, path and origin ("registered by the program",
 * "discovered", "selected by ..."), each device's properties; with POLYCHIP_LIST_DISCOVER also
 * the plugin files on the search path (POLYCHIP_PLUGIN_PATH, <libdir>/polychip) and why each
 * unusable one failed. *text is freed with polychip_string_free. */
POLYCHIP_API polychip_error_t* polychip_list_plugins(uint32_t flags, char** text);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

typedef struct polychip_model polychip_model_t;

typedef struct polychip_model_params {
  size_t struct_size;
  /* "cpu:0", as `--device`; NULL: POLYCHIP_DEVICE_BACKEND or the config file, else the best
   * plugin discovered. A backend registered by the program is found by its table's name. */
  const char* device;
  /* A YAML runtime config (`--config`); NULL: none. */
  const char* config_path;
  /* Further settings: `polychip serve`'s options by their config key, with the flag's checks
   * and defaults (docs/configuration.md): threads, context_length, max_total_tokens,
   * mem_fraction_static, kv_cache_dtype (f16, bf16, f32, q8_0, q4_0, fp8_e4m3, auto; K's and
   * V's; kv_cache_dtype_k and kv_cache_dtype_v for one alone), max_running_requests,
   * chunked_prefill_size, page_size, disable_radix_cache (true/false, 1/0), ... An unknown key
   * or a bad value is INVALID_ARGUMENT. The backend's own parameters apply when it is first
   * loaded. Since 1.1: lora, a LoRA adapter NAME=PATH[:SCALE] (GGUF, checked against the model
   * at load; repeat the key for more), which a request then names (polychip_request_t::lora),
   * and max_loras_per_batch, how many stay resident on the device (default 8). */
  const polychip_param_t* params;
  size_t n_params;
} polychip_model_params_t;

/* [any thread] Zeroes *params and sets struct_size. */
POLYCHIP_API void polychip_model_params_init(polychip_model_params_t* params);

/* [any thread] Loads a GGUF model onto the device, checks that the device runs every op the
 * model needs, and starts its engine thread. */
POLYCHIP_API polychip_error_t* polychip_model_load(const char* path,
                                                   const polychip_model_params_t* params,
                                                   polychip_model_t** model);
/* [exclusive] Cancels what is still generating (those polychip_generate calls return
 * CANCELLED), stops the engine and frees the model. No call on it may be running. */
POLYCHIP_API void polychip_model_free(polychip_model_t* model);

/* [any thread] */
POLYCHIP_API int32_t polychip_model_vocab_size(const polychip_model_t* model);
/* [any thread] Positions per sequence (prompt + generated). */
POLYCHIP_API int64_t polychip_model_context_length(const polychip_model_t* model);
/* [any thread] A one-line description ("llama 2 layers ... on cpu:0"); owned by the model. */
POLYCHIP_API const char* polychip_model_describe(const polychip_model_t* model);

/* [any thread] Text -> token ids. add_special: BOS/EOS as the vocabulary says; parse_special:
 * control tokens written in the text are recognised (`polychip run` sets both). *n_tokens
 * receives the count; when it exceeds `capacity` nothing is copied and the error is
 * RESOURCE_EXHAUSTED (call again with a larger buffer). */
POLYCHIP_API polychip_error_t* polychip_tokenize(const polychip_model_t* model, const char* text,
                                                 size_t text_len, int32_t add_special,
                                                 int32_t parse_special, int32_t* tokens,
                                                 size_t capacity, size_t* n_tokens);
/* [any thread] Token ids -> text (not NUL-terminated). render_special: print control tokens'
 * text. *text_len and capacity as in polychip_tokenize. */
POLYCHIP_API polychip_error_t* polychip_detokenize(const polychip_model_t* model,
                                                   const int32_t* tokens, size_t n_tokens,
                                                   int32_t render_special, char* text,
                                                   size_t capacity, size_t* text_len);

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

typedef struct polychip_sampling {
  size_t struct_size;
  float temperature;        /* 0: greedy (the default, as `polychip run`) */
  int32_t top_k;            /* 0: off */
  float top_p;              /* 1: off */
  float min_p;              /* 0: off */
  float repetition_penalty; /* 1: off */
  float frequency_penalty;  /* 0: off */
  float presence_penalty;   /* 0: off */
  int64_t seed;             /* < 0: random */
  int32_t max_tokens;       /* generated tokens at most (clipped to the context) */
  int32_t ignore_eos;       /* non-zero: continue past end-of-generation tokens */
  const char* const* stop;  /* stop strings, not included in the output */
  size_t n_stop;
} polychip_sampling_t;

/* [any thread] Sets struct_size and the defaults: greedy, max_tokens 128, no penalties. */
POLYCHIP_API void polychip_sampling_init(polychip_sampling_t* sampling);

/* Called once per generated token, on the thread that called polychip_generate. `piece` is the
 * new text (valid UTF-8, not NUL-terminated, valid during the call), possibly empty: a token
 * that ends mid-character or may begin a stop string holds its text back for a later call.
 * Text left at the end comes with token -1. Return non-zero to cancel the generation. */
typedef int32_t (*polychip_token_callback)(void* user_data, int32_t token, const char* piece,
                                           size_t piece_len);

typedef enum polychip_finish {
  POLYCHIP_FINISH_STOP = 0,      /* an end-of-generation token or a stop string */
  POLYCHIP_FINISH_LENGTH = 1,    /* max_tokens or the context was reached */
  POLYCHIP_FINISH_CANCELLED = 2, /* the callback returned non-zero */
} polychip_finish_t;

typedef struct polychip_request {
  size_t struct_size;
  /* The prompt as text (tokenized with add_special and parse_special, as `polychip run`), or,
   * when prompt_tokens is not NULL, as token ids. */
  const char* prompt;
  size_t prompt_len;
  const int32_t* prompt_tokens;
  size_t n_prompt_tokens;
  const polychip_sampling_t* sampling; /* NULL: polychip_sampling_init's defaults */
  polychip_token_callback on_token;    /* NULL: none (the result still counts tokens) */
  void* user_data;
  int32_t priority; /* larger runs first with schedule policy "priority" */
  /* Since 1.1. A LoRA adapter loaded with the model (its `lora` setting), by NAME or PATH;
   * NULL: the base model. Requests of different adapters share the engine's steps. An unknown
   * name is NOT_FOUND. */
  const char* lora;
  /* Since 1.1. The adapter's scale for this request; 0: the one its setting gave (default 1).
   * (To run the base model, leave lora NULL.) */
  float lora_scale;
} polychip_request_t;

/* [any thread] Zeroes *request and sets struct_size. */
POLYCHIP_API void polychip_request_init(polychip_request_t* request);

typedef struct polychip_result {
  size_t struct_size;
  polychip_finish_t finish;
  int32_t prompt_tokens;
  int32_t completion_tokens;
  int32_t cached_tokens; /* prompt tokens found in the prefix cache */
} polychip_result_t;

/* [any thread] Generates for one request and returns when it is finished. Many threads may
 * call it at once on the same model: their requests share the engine's steps (continuous
 * batching). result may be NULL; else the caller sets result->struct_size. A cancelled
 * generation returns NULL with finish CANCELLED. Errors: INVALID_ARGUMENT (empty prompt, longer
 * than the context), UNAVAILABLE (the queue is full), or what the device reported. */
POLYCHIP_API polychip_error_t* polychip_generate(polychip_model_t* model,
                                                 const polychip_request_t* request,
                                                 polychip_result_t* result);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* POLYCHIP_POLYCHIP_H_ */
