/*
 * embed.c: polychip inside a C program, through libpolychip.so alone.
 *
 * The program registers a device plugin table that it defines itself: "counting", a wrapper
 * around the cpu plugin's table that counts every op launch (what a chip team's harness might
 * do to trace or fault-inject). The program is the cpu plugin's host here: it opens the plugin
 * file and asks it for its table, as polychip would, so polychip must not load the cpu plugin
 * on its own as well (one host per plugin). Then it lists the plugins, loads a model on
 * counting:0 and generates greedily, streaming the text.
 *
 *   embed MODEL.gguf CPU_PLUGIN.so [PROMPT] [N_TOKENS]
 *
 * stdout: the plugin listing, then "tokens: <ids>", "text: <generated text>", "launches: <n>".
 * Build: cc embed.c $(pkg-config --cflags --libs polychip) -ldl, or find_package(polychip) and
 * link polychip::polychip (examples/CMakeLists.txt).
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "polychip/plugin/pc_backend.h"
#include "polychip/polychip.h"

/* ---- the program's plugin table ------------------------------------------------------------ */

static const pc_backend_iface_t* g_inner; /* the cpu plugin's table */
static pc_backend_iface_t g_counting;     /* ours: the same members, but op_launch counts */
static atomic_long g_launches;

static pc_error_t* CountingLaunch(pc_stream_t* stream, pc_op_t op, const void* args) {
  atomic_fetch_add(&g_launches, 1);
  return g_inner->op_launch(stream, op, args);
}

static void HostLog(void* ctx, pc_log_level_t level, const char* source, const char* message) {
  (void)ctx;
  if (level >= PC_LOG_WARNING) fprintf(stderr, "[%s] %s\n", source, message);
}
/* One process, no communicators: the key-value store is never needed. */
static pc_code_t HostKvSet(void* ctx, const char* key, const void* value, size_t size) {
  (void)ctx, (void)key, (void)value, (void)size;
  return PC_CODE_UNAVAILABLE;
}
static pc_code_t HostKvGet(void* ctx, const char* key, void* value, size_t capacity,
                           size_t* value_size, int64_t timeout_ms) {
  (void)ctx, (void)key, (void)value, (void)capacity, (void)value_size, (void)timeout_ms;
  return PC_CODE_UNAVAILABLE;
}
static const pc_host_services_t kHost = {sizeof(pc_host_services_t), NULL, HostLog, HostKvSet,
                                         HostKvGet, NULL};

/* Builds g_counting from the cpu plugin in `path`; returns 0 on success. */
static int MakeCountingTable(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "embed: %s\n", dlerror());
    return 1;
  }
  pc_backend_get_api_fn get_api = (pc_backend_get_api_fn)dlsym(lib, PC_BACKEND_GET_API_SYMBOL);
  g_inner = get_api ? get_api(PC_ABI_MAJOR, PC_ABI_MINOR, &kHost) : NULL;
  if (!g_inner || g_inner->abi_major != PC_ABI_MAJOR) {
    fprintf(stderr, "embed: %s has no usable pc_backend_get_api\n", path);
    return 1;
  }
  /* A plugin built against an older ABI has a shorter table: its missing tail stays NULL. */
  size_t n = g_inner->struct_size < sizeof(g_counting) ? g_inner->struct_size : sizeof(g_counting);
  memcpy(&g_counting, g_inner, n);
  g_counting.struct_size = sizeof(g_counting);
  g_counting.name = "counting";
  g_counting.version = "1.0";
  g_counting.op_launch = CountingLaunch;
  return 0;
}

/* ---- generation ------------------------------------------------------------------------------ */

typedef struct {
  int32_t tokens[4096];
  size_t n_tokens;
  char text[65536];
  size_t text_len;
} Output;

static int32_t OnToken(void* user_data, int32_t token, const char* piece, size_t piece_len) {
  Output* out = (Output*)user_data;
  if (token >= 0 && out->n_tokens < sizeof(out->tokens) / sizeof(out->tokens[0])) {
    out->tokens[out->n_tokens++] = token;
  }
  if (out->text_len + piece_len < sizeof(out->text)) {
    memcpy(out->text + out->text_len, piece, piece_len);
    out->text_len += piece_len;
  }
  return 0; /* non-zero would cancel */
}

static int Fail(polychip_error_t* error) {
  fprintf(stderr, "embed: %s\n", polychip_error_message(error));
  polychip_error_free(error);
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL.gguf CPU_PLUGIN.so [PROMPT] [N_TOKENS]\n", argv[0]);
    return 2;
  }
  const char* prompt = argc > 3 ? argv[3] : "In the beginning";
  const int n_tokens = argc > 4 ? atoi(argv[4]) : 16;

  if (MakeCountingTable(argv[2]) != 0) return 1;
  polychip_error_t* error = polychip_register_backend_table(&g_counting, NULL, 0);
  if (error) return Fail(error);

  char* listing = NULL;
  if ((error = polychip_list_plugins(0, &listing))) return Fail(error);
  fputs(listing, stdout);
  polychip_string_free(listing);

  polychip_model_params_t params;
  polychip_model_params_init(&params);
  params.device = "counting:0";
  polychip_model_t* model = NULL;
  if ((error = polychip_model_load(argv[1], &params, &model))) return Fail(error);
  fprintf(stderr, "model: %s\n", polychip_model_describe(model));

  polychip_sampling_t sampling;
  polychip_sampling_init(&sampling); /* greedy */
  sampling.max_tokens = n_tokens;
  static Output out;
  polychip_request_t request;
  polychip_request_init(&request);
  request.prompt = prompt;
  request.prompt_len = strlen(prompt);
  request.sampling = &sampling;
  request.on_token = OnToken;
  request.user_data = &out;
  polychip_result_t result;
  memset(&result, 0, sizeof(result));
  result.struct_size = sizeof(result);
  if ((error = polychip_generate(model, &request, &result))) return Fail(error);

  printf("tokens:");
  for (size_t i = 0; i < out.n_tokens; ++i) printf(" %d", out.tokens[i]);
  printf("\ntext: %.*s\nlaunches: %ld\n", (int)out.text_len, out.text,
         (long)atomic_load(&g_launches));
  polychip_model_free(model);
  return 0;
}
