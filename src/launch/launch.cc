#include "launch/launch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dist/kv_budget.h"
#include "model/hot_reload.h"
#include "runtime/dtype.h"

namespace polychip::launch {
namespace {

// Without a device to ask, or when it cannot say, the KV cache gets this many tokens.
constexpr int64_t kFallbackKvTokens = 65536;
// A model file that names no trained context is served at this many positions at most.
constexpr int64_t kUnknownTrainedContext = 4096;

std::string MiB(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", bytes / 1048576.0);
  return buf;
}

// The bytes of the weights `model` uploads to one rank's device (an even share of tp x pp).
uint64_t WeightBytes(const model::ModelFile& model, int ranks) {
  uint64_t total = 0;
  for (const model::GgufTensor& t : model.file->tensors()) total += t.n_bytes;
  return total / std::max(1, ranks);
}

// Whether `draft` has every matrix of `target` with the same name and shape, so that an adapter
// checked against the target fits the draft as well (what LoraAdapter::Open checks depends on
// nothing else).
bool SameMatrices(const model::ModelConfig& target, const model::ModelConfig& draft) {
  const model::ModelConfig &a = target, &b = draft;
  return a.arch == b.arch && a.n_vocab == b.n_vocab && a.n_embd == b.n_embd &&
         a.n_layer == b.n_layer && a.n_head == b.n_head && a.n_head_kv == b.n_head_kv &&
         a.head_dim == b.head_dim && a.head_dim_v == b.head_dim_v && a.n_ff == b.n_ff &&
         a.fused_qkv == b.fused_qkv && a.fused_gate_up == b.fused_gate_up &&
         a.tied_output == b.tied_output && a.n_expert == b.n_expert && a.n_ff_exp == b.n_ff_exp;
}

}  // namespace

std::string KvSizing::Describe() const {
  std::string s = "context " + std::to_string(context_length) + " (" + context_why +
                  "); KV cache " + std::to_string(kv_tokens) + " tokens x " +
                  std::to_string(token_bytes) +
                  " bytes = " + MiB(uint64_t(kv_tokens) * token_bytes) + ", room for " +
                  std::to_string(concurrency()) + " sequence" + (concurrency() == 1 ? "" : "s") +
                  " of the full context at once";
  if (!budget.empty()) s += "; " + budget;
  return s;
}

StatusOr<runtime::RuntimeConfig> RuntimeConfigOf(const LaunchSpec& spec) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(spec.config_path, spec.device));
  if (config.backend) {
    for (auto& p : model::ThreadsParams(spec.threads)) config.backend->params.push_back(p);
  }
  return config;
}

Status Validate(const LaunchSpec& spec) {
  for (const std::string* t : {&spec.kv_cache_dtype, &spec.kv_cache_dtype_k,
                                &spec.kv_cache_dtype_v}) {
    if (t->empty() && t != &spec.kv_cache_dtype) continue;
    const std::optional<DType> d = DTypeFromName(*t);
    if (!d || !model::IsKvCacheDtype(*d)) {
      return InvalidArgument("unknown KV cache type '" + *t +
                             "' (f16, bf16, f32, q8_0, q4_0, fp8_e4m3 or auto)");
    }
  }
  if (spec.pooling != "mean" && spec.pooling != "last") {
    return InvalidArgument("--pooling must be mean or last, not '" + spec.pooling + "'");
  }
  PC_RETURN_IF_ERROR(engine::ParseSchedulePolicy(spec.schedule_policy).status());
  if (spec.page_size < 1) return InvalidArgument("--page-size must be at least 1");
  if (spec.max_running_requests < 1) {
    return InvalidArgument("--max-running-requests must be at least 1");
  }
  if (spec.tp_size < 1 || spec.pp_size < 1) {
    return InvalidArgument("--tp-size and --pp-size must be at least 1");
  }
  if (spec.mem_fraction_static > 1) {
    return InvalidArgument("--mem-fraction-static must be in [0, 1]");
  }
  if (spec.speculative_algorithm != "auto") {
    PC_RETURN_IF_ERROR(engine::ParseSpecAlgorithm(spec.speculative_algorithm).status());
  }
  if (spec.speculative_algorithm == "draft" && spec.speculative_draft_model.empty()) {
    return InvalidArgument(
        "--speculative-algorithm draft needs --speculative-draft-model FILE.gguf");
  }
  // A flag that would be read by nothing is refused rather than ignored: the user would
  // believe it in effect.
  if (spec.speculative_algorithm == "ngram" && !spec.speculative_draft_model.empty()) {
    return InvalidArgument(
        "--speculative-draft-model is not used by --speculative-algorithm ngram (prompt "
        "lookup drafts without a model); give one of them");
  }
  if (!spec.speculative_draft_device.empty() && spec.speculative_draft_model.empty()) {
    return InvalidArgument(
        "--speculative-draft-device needs --speculative-draft-model FILE.gguf (it places the "
        "draft model)");
  }
  return Status::Ok();
}

Status RefuseSpeculation(const LaunchSpec& spec, std::string_view command,
                         std::string_view why) {
  std::vector<std::string> given;
  if (spec.speculative_algorithm != "auto" && spec.speculative_algorithm != "none") {
    given.push_back("--speculative-algorithm " + spec.speculative_algorithm);
  }
  if (!spec.speculative_draft_model.empty()) given.push_back("--speculative-draft-model");
  if (!spec.speculative_draft_device.empty()) given.push_back("--speculative-draft-device");
  if (given.empty()) return Status::Ok();
  std::string flags;
  for (const std::string& g : given) flags += (flags.empty() ? "" : ", ") + g;
  return InvalidArgument(std::string(command) + " does not speculate (" + std::string(why) +
                         "): drop " + flags +
                         "; polychip run and polychip serve (with polychip bench-serving) "
                         "measure speculative decoding");
}

model::KvCacheDtypes KvCacheDtypesOf(const LaunchSpec& spec) {
  auto of = [&](const std::string& t) {
    return *DTypeFromName(t.empty() ? spec.kv_cache_dtype : t);
  };
  return {of(spec.kv_cache_dtype_k), of(spec.kv_cache_dtype_v)};
}

uint64_t KvTokenBytes(const model::ModelConfig& cfg, const model::KvCacheDtypes& kv_dtypes,
                      double swa_ratio, int tp_size, int pp_size) {
  // A token of the main pool costs every layer's K and V rows in their types (a block type's
  // scales included), less the sliding layers' share beyond the window pool's ratio (where that
  // pool is used). A head size the type cannot split is refused later, by the runner.
  const int64_t k_row = model::KvRowBytes(kv_dtypes.k, cfg.n_head_kv, cfg.head_dim);
  const int64_t v_row =
      model::KvRowBytes(kv_dtypes.v, cfg.n_head_kv, std::max(cfg.head_dim_v, cfg.head_dim));
  const double per_layer = double(std::max<int64_t>(k_row, 1) + std::max<int64_t>(v_row, 1));
  const double ratio = std::clamp(swa_ratio, 0.0, 1.0);
  const int64_t sliding = ratio > 0 ? cfg.NumSlidingLayers() : 0;
  const double all = per_layer * (double(cfg.n_layer - sliding) + ratio * double(sliding));
  // Each rank holds its heads of its stage's layers.
  return std::max<uint64_t>(1, uint64_t(all / std::max(1, tp_size * pp_size)));
}

StatusOr<ResolvedLaunch> Resolve(const LaunchSpec& spec, const model::ModelFile& model,
                                 const runtime::Device* device) {
  PC_RETURN_IF_ERROR(Validate(spec));
  ResolvedLaunch r;
  r.spec = spec;
  PC_ASSIGN_OR_RETURN(r.runtime, RuntimeConfigOf(spec));
  r.parallel.tp_size = spec.tp_size;
  r.parallel.pp_size = spec.pp_size;
  r.parallel.launch = spec.dist;
  const model::KvCacheDtypes kv_dtypes = KvCacheDtypesOf(spec);
  const model::ModelConfig& cfg = model.config;
  const int ranks = spec.tp_size * spec.pp_size;

  KvSizing& kv = r.kv;
  kv.token_bytes =
      KvTokenBytes(cfg, kv_dtypes, spec.swa_full_tokens_ratio, spec.tp_size, spec.pp_size);

  // Speculative decoding. A draft model on the model's device takes its weights from the KV
  // budget, and keeps as many KV tokens as the model (each budgeted token pays for both).
  // With tp x pp ranks the engine, the proposer and the draft live on rank 0, and every rank
  // runs the verification steps (multi-position steps, as a prefill's). The draft's share is
  // taken from every rank's budget all the same: all ranks must hold the same number of KV
  // blocks, since rank 0 hands out their ids.
  engine::SpeculativeOptions& so = r.engine.speculative;
  const std::string algorithm =
      spec.speculative_algorithm != "auto"        ? spec.speculative_algorithm
      : spec.speculative_draft_model.empty() ? "none"
                                                  : "draft";
  so.algorithm = *engine::ParseSpecAlgorithm(algorithm);
  so.num_draft_tokens = spec.speculative_num_draft_tokens;
  so.adaptive = spec.speculative_adaptive;
  so.disable_batch_size = spec.speculative_disable_batch_size;
  so.ngram_max = spec.speculative_ngram_max;
  uint64_t draft_weight_bytes = 0;
  if (so.algorithm == engine::SpecAlgorithm::kDraft) {
    PC_RETURN_IF_ERROR(CheckModelPath(spec.speculative_draft_model));
    PC_ASSIGN_OR_RETURN(auto draft_file, model::GgufFile::Open(spec.speculative_draft_model));
    PC_ASSIGN_OR_RETURN(model::ModelConfig draft_cfg, model::ModelConfig::FromGguf(*draft_file));
    so.draft_takes_adapters = SameMatrices(cfg, draft_cfg);
    if (spec.speculative_draft_device.empty()) {
      kv.token_bytes += KvTokenBytes(draft_cfg, kv_dtypes, 0, 1, 1);
      for (const model::GgufTensor& t : draft_file->tensors()) draft_weight_bytes += t.n_bytes;
    }
  }
  const int64_t trained = cfg.n_ctx_train > 0 ? cfg.n_ctx_train : kUnknownTrainedContext;
  // The most the cache could ever be used for: every running request at the full context.
  const int64_t want_ctx = spec.context_length > 0 ? spec.context_length : trained;
  const int64_t cap = int64_t(spec.max_running_requests) * want_ctx;
  if (spec.max_total_tokens > 0) {
    kv.kv_tokens = spec.max_total_tokens;
    kv.budget = "KV size given (--max-total-tokens)";
  } else if (device != nullptr) {
    uint64_t free_bytes = 0, total_bytes = 0;
    PC_RETURN_IF_ERROR(device->MemoryInfo(&free_bytes, &total_bytes));
    PC_ASSIGN_OR_RETURN(dist::CommBuffers comm,
                        dist::RunCommBuffers(spec.config_path, spec.device, r.parallel, *device));
    const double fraction = spec.mem_fraction_static >= 0     ? spec.mem_fraction_static
                            : device->props().host_accessible ? kHostMemFraction
                                                              : kDeviceMemFraction;
    const dist::KvBudget budget =
        dist::ComputeKvBudget(free_bytes, fraction, comm,
                              WeightBytes(model, ranks) + draft_weight_bytes);
    kv.budget_bytes = budget.kv_bytes;
    kv.budget = budget.Describe();
    kv.kv_tokens = int64_t(budget.kv_bytes / kv.token_bytes);
    if (kv.kv_tokens > cap) {
      kv.kv_tokens = cap;
      kv.budget += ", of which " + std::to_string(spec.max_running_requests) + " requests x " +
                   std::to_string(want_ctx) + " tokens can be used";
    }
    if (kv.kv_tokens < spec.page_size) {
      return ResourceExhausted(kv.budget + ": no room for a KV cache on " + device->props().name +
                               "; lower --context-length, give "
                               "--max-total-tokens, or raise --mem-fraction-static");
    }
  } else {
    kv.kv_tokens = std::min(kFallbackKvTokens, cap);
    kv.budget = "no device to size it from: a fixed " + std::to_string(kv.kv_tokens) + " tokens";
  }
  if (spec.context_length > 0) {
    kv.context_length = spec.context_length;
    kv.context_why = "--context-length";
  } else if (kv.kv_tokens >= trained) {
    kv.context_length = trained;
    kv.context_why =
        cfg.n_ctx_train > 0 ? "the model's trained context" : "the model names no trained context";
  } else {
    kv.context_length = kv.kv_tokens / spec.page_size * spec.page_size;
    kv.context_why = "the model's trained " + std::to_string(trained) +
                     " bounded by the KV cache; raise --mem-fraction-static or "
                     "--max-total-tokens for more";
  }
  // One sequence of the full context always fits.
  kv.kv_tokens = std::max(kv.kv_tokens, kv.context_length);

  model::RunnerOptions& ro = r.runner;
  ro.context_length = kv.context_length;
  ro.kv_tokens = kv.kv_tokens;
  ro.block_size = spec.page_size;
  ro.kv_dtypes = kv_dtypes;
  ro.swa_full_tokens_ratio = spec.swa_full_tokens_ratio;
  ro.max_loras = spec.max_loras_per_batch;
  ro.max_tokens_per_step = spec.max_tokens_per_step > 0 ? spec.max_tokens_per_step
                                                        : std::max(spec.chunked_prefill_size, 64) +
                                                              int64_t(spec.max_running_requests);
  // The config's memory.arena_mb where it sets one, else the runner's own default.
  if (r.runtime.arena_bytes != runtime::RuntimeConfig{}.arena_bytes) {
    ro.arena_bytes = r.runtime.arena_bytes;
  }

  // The draft's KV pool holds as many tokens as the model's, in blocks the proposer hands
  // out itself (no window pool: it keeps every position).
  r.draft_runner = ro;
  r.draft_runner.swa_full_tokens_ratio = 0;

  engine::EngineOptions& eo = r.engine;
  eo.max_running_requests = spec.max_running_requests;
  eo.max_queued_requests = spec.max_queued_requests;
  eo.chunked_prefill_size = spec.chunked_prefill_size;
  eo.max_itl_ms = spec.max_itl_ms;
  eo.context_length = static_cast<int32_t>(kv.context_length);
  eo.enable_prefix_cache = !spec.disable_radix_cache;
  eo.policy = *engine::ParseSchedulePolicy(spec.schedule_policy);
  eo.max_adapters_per_step = spec.max_loras_per_batch;
  return r;
}

StatusOr<std::unique_ptr<engine::ModelRunner>> CreateRunner(
    const ResolvedLaunch& launch, const model::ModelFile& model,
    std::shared_ptr<runtime::Device> device) {
  const LaunchSpec& s = launch.spec;
  if (s.tp_size * s.pp_size == 1 && !dist::IsFollowerRank(s.dist)) {
    if (!device) {
      PC_ASSIGN_OR_RETURN(device, model::OpenDevice(s.config_path, s.device, s.threads));
    }
    PC_ASSIGN_OR_RETURN(auto runner, model::TransformerRunner::Create(*model.file, model.config,
                                                                      device, launch.runner));
    return std::unique_ptr<engine::ModelRunner>(std::move(runner));
  }
  return dist::CreateRunner(model, s.config_path, s.device, s.threads, launch.runner,
                            launch.parallel);
}

StatusOr<std::unique_ptr<model::ReloadableRunner>> CreateReloadableRunner(
    const ResolvedLaunch& launch, const model::ModelFile& model,
    std::shared_ptr<runtime::Device> device) {
  std::shared_ptr<runtime::Backend> backend = device->backend();
  device.reset();  // the runner holds it from now on; a reload must be able to close it
  return model::ReloadableRunner::Create(*model.file, model.config, launch.runtime,
                                         std::move(backend), launch.runner);
}

Status CheckDraftVocabulary(const model::Tokenizer& target, const model::Tokenizer& draft) {
  constexpr int32_t kMaxVocabDifference = 128;
  const int32_t nt = target.n_vocab(), nd = draft.n_vocab();
  if (std::abs(nt - nd) > kMaxVocabDifference) {
    return InvalidArgument("the draft model's vocabulary has " + std::to_string(nd) +
                           " tokens and the model's " + std::to_string(nt) +
                           ": a draft model must share the model's vocabulary");
  }
  for (int32_t i = 0; i < std::min(nt, nd); ++i) {
    if (target.TokenText(i) != draft.TokenText(i)) {
      return InvalidArgument("token " + std::to_string(i) + " is '" + target.TokenText(i) +
                             "' in the model and '" + draft.TokenText(i) +
                             "' in the draft model: a draft model must share the model's "
                             "vocabulary");
    }
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<DraftModel>> CreateDraft(const ResolvedLaunch& launch,
                                                  const model::ModelFile& target) {
  if (launch.engine.speculative.algorithm != engine::SpecAlgorithm::kDraft) {
    return std::unique_ptr<DraftModel>();
  }
  const LaunchSpec& s = launch.spec;
  const std::string& path = s.speculative_draft_model;
  PC_RETURN_IF_ERROR(CheckModelPath(path));
  auto d = std::make_unique<DraftModel>();
  PC_ASSIGN_OR_RETURN(d->file, model::OpenModelFile(path));
  if (Status v = CheckDraftVocabulary(*target.tokenizer, *d->file.tokenizer); !v.ok()) {
    return InvalidArgument(path + ": " + v.message());
  }
  // Without a device of its own the draft shares the model's: with several ranks, rank 0's
  // (the first of --device), where the engine that drafts runs.
  const bool own_device = !s.speculative_draft_device.empty();
  PC_ASSIGN_OR_RETURN(auto device,
                      model::OpenDevice(own_device ? "" : s.config_path,
                                        own_device ? s.speculative_draft_device : s.device,
                                        s.threads));
  PC_ASSIGN_OR_RETURN(auto runner, model::TransformerRunner::Create(
                                       *d->file.file, d->file.config, device, launch.draft_runner));
  spdlog::info("speculative decoding: draft model {} ({}) on {}, up to {} draft tokens per step",
               path, d->file.config.Summary(), device->props().name,
               launch.engine.speculative.num_draft_tokens);
  d->runner = std::move(runner);
  return d;
}

Status CheckModelPath(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string how =
      ": GGUF only: convert a Hugging Face model with llama.cpp's "
      "convert_hf_to_gguf.py (python convert_hf_to_gguf.py MODEL_DIR --outfile model.gguf), "
      "or download a .gguf file";
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return InvalidArgument(path + " is a folder" + how);
  }
  if (!fs::exists(path, ec)) {
    // "org/name" with no such file: a Hugging Face model id.
    const size_t slash = path.find('/');
    if (slash != std::string::npos && slash > 0 && path.find('/', slash + 1) == std::string::npos &&
        path.front() != '.' && path.size() > slash + 1 && path.find(".gguf") == std::string::npos) {
      return NotFound(path + " is not a file (a Hugging Face model id?)" + how);
    }
    return NotFound("model file " + path + " not found");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Ok();  // unreadable: the loader names the reason
  char magic[4] = {};
  if (!in.read(magic, 4) || std::string(magic, 4) != "GGUF") {  // shorter than a magic, too
    return InvalidArgument(path + " is not a GGUF file (no GGUF magic)" + how);
  }
  return Status::Ok();
}

Status LoadLoras(const LaunchSpec& spec, model::LoraRegistry& registry) {
  for (const std::string& text : spec.lora) {
    PC_ASSIGN_OR_RETURN(model::LoraSpec l, model::ParseLoraSpec(text));
    if (auto a = registry.Load(l); !a.ok()) return InvalidArgument("--lora " + text + ": " + a.status().message());
  }
  return Status::Ok();
}

StatusOr<OfflineLora> LoadOfflineLora(const LaunchSpec& spec, const model::ModelConfig& config) {
  OfflineLora o;
  if (spec.lora.empty()) return o;
  model::LoraRegistry registry(config);
  LaunchSpec first = spec;
  first.lora.resize(1);
  PC_RETURN_IF_ERROR(LoadLoras(first, registry));
  o.adapter = registry.List().front();
  o.scale = o.adapter->default_scale();
  return o;
}

}  // namespace polychip::launch
