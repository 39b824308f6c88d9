// The launch builder: every entry point that starts a model (serve, run, bench, profile,
// perplexity, the C API, hot reload) describes what it wants as a LaunchSpec — filled from the
// command line, the YAML file given with --config and the environment — and gets back a
// ResolvedLaunch: the runtime config, the runner options, the engine options and the KV cache's
// size, decided here and nowhere else. The defaults live in LaunchSpec's initializers and the
// option table (launch_options.h) once; `polychip serve --help` and `--print-config` print
// them from there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dist/parallel.h"
#include "engine/engine.h"
#include "model/hot_reload.h"
#include "model/lora.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "server/http_limits.h"
#include "util/status.h"

namespace polychip::launch {

// The engine's own defaults (a function, not a global: LaunchSpecs are built during static
// initialization too).
inline const engine::EngineOptions& EngineDefaults() {
  static const engine::EngineOptions defaults;
  return defaults;
}

// What the user asked for. Fields left at their "auto" value (0, or kAuto) are decided by
// Resolve from the model and the device.
struct LaunchSpec {
  static constexpr double kAuto = -1;

  // Where the model runs.
  std::string model_path;
  std::string device;       // --device backend:i[,j...]; empty: env, config, discovery
  std::string config_path;  // --config FILE.yaml
  std::string op_fallback;  // --op-fallback BACKEND ("none" turns the config's off)
  int threads = 0;          // the cpu plugin's threads; 0: its own choice
  std::string kv_cache_dtype = "f16";  // K's and V's
  std::string kv_cache_dtype_k;        // empty: kv_cache_dtype
  std::string kv_cache_dtype_v;        // empty: kv_cache_dtype
  int tp_size = 1;
  int pp_size = 1;
  dist::LaunchFlags dist;  // multi-node launch and comm pins
  // LoRA adapters (model/lora.h): NAME=PATH[:SCALE] each (--lora, repeated). serve serves each
  // under its name; run, perplexity and bench apply the first to every sequence.
  std::vector<std::string> lora;
  // Adapters resident on the device, the most one step uses (SGLang's --max-loras-per-batch).
  int max_loras_per_batch = 8;

  // The KV cache and the scheduler.
  int64_t context_length = 0;    // 0: the model's trained context, bounded by the KV budget
  int64_t max_total_tokens = 0;  // KV cache tokens; 0: from the KV budget
  // Share of the device's free memory (less weights and comm buffers) the KV cache may take;
  // kAuto: kDeviceMemFraction on a device with its own memory, kHostMemFraction on host memory.
  double mem_fraction_static = kAuto;
  int page_size = 16;
  double swa_full_tokens_ratio = 0.5;
  // The scheduler's and the speculator's defaults are the engine's own (EngineDefaults).
  int max_running_requests = EngineDefaults().max_running_requests;
  int max_queued_requests = EngineDefaults().max_queued_requests;
  int chunked_prefill_size = EngineDefaults().chunked_prefill_size;
  double max_itl_ms = EngineDefaults().max_itl_ms;
  bool disable_radix_cache = false;
  std::string schedule_policy = "fcfs";
  // Speculative decoding (engine/speculative.h, docs/speculative-decoding.md).
  std::string speculative_algorithm = "auto";  // auto: draft with a draft model, else none
  std::string speculative_draft_model;         // a GGUF of the target's vocabulary
  std::string speculative_draft_device;        // backend:i; empty: the target's device
  int speculative_num_draft_tokens = EngineDefaults().speculative.num_draft_tokens;
  bool speculative_adaptive = EngineDefaults().speculative.adaptive;
  int speculative_disable_batch_size = EngineDefaults().speculative.disable_batch_size;
  int speculative_ngram_max = EngineDefaults().speculative.ngram_max;

  // Activation workspace rows per forward step; 0: chunked_prefill_size (at least 64) plus one
  // decoding token per running request. Set by the offline commands, not a flag.
  int64_t max_tokens_per_step = 0;

  // The HTTP server.
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string admin_key;
  std::string chat_template;         // a built-in chat format instead of the model's template
  std::string chat_template_file;    // a Jinja template file instead of the model's
  std::string chat_template_kwargs;  // a JSON object of extra template variables
  // How a chat answer's reasoning is found: auto (the chat template's format), none, or a
  // format's name (server/tool_format.h).
  std::string reasoning_parser = "auto";
  int http_threads = 320;
  std::string pooling = "last";
  double shutdown_timeout = 5;
  server::HttpLimits http_limits;
  std::string log_level = "info";
  bool enable_metrics = true;  // /metrics (SGLang's --enable-metrics; on by default here)
  bool vllm_metrics = true;    // the vllm: families beside ours
};

// The KV budget's defaults: SGLang's --mem-fraction-static is ~0.88 of a GPU; on host memory
// (the cpu plugin) the cache shares RAM with everything else on the machine, so it takes less.
inline constexpr double kDeviceMemFraction = 0.85;
inline constexpr double kHostMemFraction = 0.25;

// How the KV cache and the context length were decided, for the start-up log.
struct KvSizing {
  int64_t context_length = 0;
  int64_t kv_tokens = 0;
  uint64_t token_bytes = 0;   // one token's K and V over this rank's layers
  uint64_t budget_bytes = 0;  // 0 when the size was given (--max-total-tokens) or fixed
  std::string budget;         // "KV budget: 21000.0 MiB free - ... = 512.0 MiB"
  std::string context_why;    // "the model's trained context", ...
  // Sequences of the full context the cache holds at once.
  int64_t concurrency() const { return context_length > 0 ? kv_tokens / context_length : 0; }
  std::string Describe() const;
};

struct ResolvedLaunch {
  LaunchSpec spec;
  runtime::RuntimeConfig runtime;  // the config file, env and --device, threads appended
  model::RunnerOptions runner;
  model::RunnerOptions draft_runner;  // the draft model's (speculative algorithm draft)
  engine::EngineOptions engine;
  dist::ParallelOptions parallel;
  KvSizing kv;
};

// The runtime config of a launch: ResolveRuntimeConfig(config, device) with the spec's threads
// passed to the backend as its "threads" parameter (the one place that is done).
StatusOr<runtime::RuntimeConfig> RuntimeConfigOf(const LaunchSpec& spec);

// Checks the values no flag check covers (pooling, schedule policy, KV type, sizes).
Status Validate(const LaunchSpec& spec);

// For a command that runs no engine (bench, perplexity, profile), which would ignore the
// speculative flags: an error naming those given and `why` the command cannot use them; Ok when
// none is given (or --speculative-algorithm none).
Status RefuseSpeculation(const LaunchSpec& spec, std::string_view command, std::string_view why);

// The KV cache's bytes per token for `config` on one rank of tp x pp (K and V of every layer,
// sliding layers at the window pool's ratio).
uint64_t KvTokenBytes(const model::ModelConfig& config, const model::KvCacheDtypes& kv_dtypes,
                      double swa_ratio, int tp_size, int pp_size);

// K's and V's KV cache types of a spec that passed Validate.
model::KvCacheDtypes KvCacheDtypesOf(const LaunchSpec& spec);

// Decides everything. `device`: the device the runner will use (its free memory sizes the KV
// cache); may be null when the spec fixes the KV size (max_total_tokens > 0), else the
// budget falls back to a fixed 65536 tokens.
StatusOr<ResolvedLaunch> Resolve(const LaunchSpec& spec, const model::ModelFile& model,
                                 const runtime::Device* device);

// The runner of a resolved launch: one rank, a plain runner on `device` (opened here when
// null); tp x pp > 1, dist::CreateRunner (which never returns on a follower rank).
StatusOr<std::unique_ptr<engine::ModelRunner>> CreateRunner(
    const ResolvedLaunch& launch, const model::ModelFile& model,
    std::shared_ptr<runtime::Device> device);

// The single-rank runner a server can hot reload, on `device` (already open; pass the only
// reference: a reload must be able to close it and unload its plugin).
StatusOr<std::unique_ptr<model::ReloadableRunner>> CreateReloadableRunner(
    const ResolvedLaunch& launch, const model::ModelFile& model,
    std::shared_ptr<runtime::Device> device);

// The draft model of speculative decoding: its file and its runner.
struct DraftModel {
  model::ModelFile file;
  std::unique_ptr<engine::ModelRunner> runner;
};

// Opens --speculative-draft-model, checks that it shares `target`'s vocabulary (the same token
// for every id both have, sizes at most 128 apart) and loads it on --speculative-draft-device
// (default: the target's device; with tp x pp ranks, rank 0's). Null when the launch speculates
// without a draft model.
StatusOr<std::unique_ptr<DraftModel>> CreateDraft(const ResolvedLaunch& launch,
                                                  const model::ModelFile& target);

// Checks that `draft` can draft for `target`: the same token text for every id both
// vocabularies have, sizes at most 128 apart (padding rows).
Status CheckDraftVocabulary(const model::Tokenizer& target, const model::Tokenizer& draft);

// "GGUF only" for a path that is not a GGUF file (a folder, a Hugging Face model id, a
// safetensors file), with how to convert it; Ok for anything that may be one.
Status CheckModelPath(const std::string& path);

// Opens each adapter of spec.lora against the registry's base and adds it, in order; an error
// names the flag's value and the first mismatch.
Status LoadLoras(const LaunchSpec& spec, model::LoraRegistry& registry);

// run, perplexity and bench: the first adapter of spec.lora (null: none), applied to every
// sequence at its NAME=PATH:SCALE scale.
struct OfflineLora {
  std::shared_ptr<const model::LoraAdapter> adapter;
  float scale = 1;
  void Apply(engine::SequenceStep& step) const {
    step.adapter = adapter.get();
    step.adapter_scale = scale;
  }
};
StatusOr<OfflineLora> LoadOfflineLora(const LaunchSpec& spec, const model::ModelConfig& config);

}  // namespace polychip::launch
