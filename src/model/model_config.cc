#include "model/model_config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "model/model_shapes.h"

namespace polychip::model {

const char* ArchName(Arch arch) {
  switch (arch) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kQwen3: return "qwen3";
    case Arch::kPhi3: return "phi3";
    case Arch::kQwen3Moe: return "qwen3moe";
    case Arch::kGemma3: return "gemma3";
  }
  return "?";
}

StatusOr<Arch> ArchFromName(std::string_view name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "qwen3") return Arch::kQwen3;
  if (name == "phi3") return Arch::kPhi3;
  if (name == "qwen3moe") return Arch::kQwen3Moe;
  if (name == "gemma3") return Arch::kGemma3;
  return Unimplemented(fmt::format("unsupported architecture {} (supported: llama, qwen2, qwen3, "
                                   "phi3, qwen3moe, gemma3)",
                                   name.empty() ? "(none)" : name));
}

const char* RopeScalingName(RopeScaling s) {
  switch (s) {
    case RopeScaling::kNone: return "none";
    case RopeScaling::kLinear: return "linear";
    case RopeScaling::kYarn: return "yarn";
  }
  return "?";
}

std::string LayerTensorName(int64_t layer, std::string_view suffix) {
  return fmt::format("blk.{}.{}", layer, suffix);
}

std::string ModelConfig::Summary() const {
  std::string s = fmt::format(
      "{} vocab={} ctx_train={} embd={} layers={} heads={} kv_heads={} head_dim={} ff={} "
      "rope(base={:g} dims={}",
      ArchName(arch), n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff,
      rope_freq_base, n_rot);
  if (rope_scaling != RopeScaling::kNone) {
    s += fmt::format(" {} x{:g}", RopeScalingName(rope_scaling), rope_scaling_factor);
  }
  if (has_rope_freqs) s += " llama3-freqs";
  if (has_rope_factors) s += fmt::format(" longrope(attn x{:g})", rope_attn_factor);
  if (sliding_window > 0) {
    s += fmt::format(" swa(window={} pattern={} base={:g})", sliding_window,
                     sliding_window_pattern, rope_freq_base_swa);
  }
  if (n_expert > 0) {
    s += fmt::format(") experts={} used={} expert_ff={}{}", n_expert, n_expert_used, n_ff_exp,
                     moe_norm_weights ? " norm-weights" : "");
  } else {
    s += ")";
  }
  return s + fmt::format(" eps={:g} {}{}{}", rms_eps, tied_output ? "tied" : "untied",
                         has_qkv_bias ? " qkv-bias" : "", has_qk_norm ? " qk-norm" : "");
}

namespace {

// An integer hyper-parameter; llama.cpp allows per-layer arrays for some of them, which we
// accept only when every layer has the same value.
StatusOr<int64_t> GetCount(const GgufFile& f, const std::string& key, bool required,
                           int64_t def) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    if (required) return InvalidArgument(fmt::format("missing hyper-parameter '{}'", key));
    return def;
  }
  int64_t x = 0;
  if (v->type == GgufType::kArray && v->raw != nullptr && IsGgufIntegerType(v->elem_type) &&
      v->count > 0) {
    x = v->IntAt(0);
    for (uint64_t k = 1; k < v->count; ++k) {
      if (v->IntAt(k) != x) {
        return Unimplemented(fmt::format("'{}' varies per layer, which is not supported", key));
      }
    }
  } else {
    PC_ASSIGN_OR_RETURN(x, f.GetI64(key));
  }
  // No real model has a dimension or a count near 2^31, and the bound keeps the product of any
  // two of them (a tensor's element count, q_dim) inside int64 before the tensors are checked.
  if (x < 0 || x > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(fmt::format("hyper-parameter '{}' = {} is out of range", key, x));
  }
  return x;
}

// A layer has at least kMinLayerTensors tensors (two norms, q/k/v/output, gate/up/down; 6 with
// phi3's fused attn_qkv and gate/up), so a block count the file's tensors cannot cover is refused
// before anything is sized by it: ArchTensors lists ~10 specs per layer, and block_count = 10^9
// used to allocate without bound.
constexpr int64_t kMinLayerTensors = 6;

Status CheckLayerCount(const GgufFile& f, int64_t n_layer, const std::string& key) {
  const auto n_tensors = static_cast<int64_t>(f.tensors().size());
  if (n_layer > n_tensors / kMinLayerTensors) {
    return InvalidArgument(fmt::format("'{}' = {} but the file has {} tensors; {} layers need at "
                                       "least {} (corrupt metadata?)",
                                       key, n_layer, n_tensors, n_layer,
                                       n_layer * kMinLayerTensors));
  }
  return Status::Ok();
}

bool IsMatrixDType(DType t) {
  switch (t) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kQ4_0: case DType::kQ4_1:
    case DType::kQ5_0: case DType::kQ5_1: case DType::kQ8_0: case DType::kQ2_K: case DType::kQ3_K:
    case DType::kQ4_K: case DType::kQ5_K: case DType::kQ6_K: case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

bool IsVectorDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// gemma3's hyper-parameters, as llama.cpp reads them (src/models/gemma3.cpp).
template <typename Key>
Status ReadGemma3(const GgufFile& f, const Key& key, ModelConfig& c) {
  c.has_post_norms = true;
  c.gelu_ffn = true;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // Gemma's query_pre_attn_scalar is the head size, except for the 27B (62 layers), whose
  // n_embd / n_head differs from it; the files do not carry it, llama.cpp infers it so.
  const int64_t scalar = c.n_layer == 62 ? c.n_embd / c.n_head : c.head_dim;
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
  PC_ASSIGN_OR_RETURN(c.sliding_window, GetCount(f, key("attention.sliding_window"), false, 0));
  if (c.sliding_window > 0) {
    PC_ASSIGN_OR_RETURN(c.sliding_window_pattern,
                        GetCount(f, key("attention.sliding_window_pattern"), false, 6));
    c.rope_freq_base_swa = f.GetF32(key("rope.freq_base_swa"), 10000.0f);
    if (!(c.rope_freq_base_swa > 0) || !std::isfinite(c.rope_freq_base_swa)) {
      return InvalidArgument(fmt::format("'{}' {} is invalid", key("rope.freq_base_swa"),
                                         c.rope_freq_base_swa));
    }
  }
  const float softcap = f.GetF32(key("final_logit_softcapping"), 0.0f);
  if (softcap != 0.0f) {
    return Unimplemented(fmt::format("'{}' = {:g}: logit soft-capping is not supported",
                                     key("final_logit_softcapping"), softcap));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& f) {
  ModelConfig c;
  const GgufValue* arch_value = f.Find("general.architecture");
  if (arch_value == nullptr || arch_value->type != GgufType::kString) {
    return InvalidArgument("missing general.architecture: not a model file (a vocabulary-only "
                           "GGUF?)");
  }
  std::string a(arch_value->str);
  PC_ASSIGN_OR_RETURN(c.arch, ArchFromName(a));
  c.name = f.GetString("general.name", "");
  auto key = [&a](std::string_view k) { return fmt::format("{}.{}", a, k); };

  PC_ASSIGN_OR_RETURN(c.n_ctx_train, GetCount(f, key("context_length"), true, 0));
  PC_ASSIGN_OR_RETURN(c.n_embd, GetCount(f, key("embedding_length"), true, 0));
  PC_ASSIGN_OR_RETURN(c.n_layer, GetCount(f, key("block_count"), true, 0));
  PC_ASSIGN_OR_RETURN(c.n_ff, GetCount(f, key("feed_forward_length"), true, 0));
  PC_ASSIGN_OR_RETURN(c.n_head, GetCount(f, key("attention.head_count"), true, 0));
  PC_ASSIGN_OR_RETURN(c.n_head_kv, GetCount(f, key("attention.head_count_kv"), false, c.n_head));
  // A context of 0 used to become 4096 without a word; a file that says so is broken.
  if (c.n_ctx_train <= 0) {
    return InvalidArgument(fmt::format("hyper-parameter '{}' is 0", key("context_length")));
  }
  if (c.n_embd <= 0 || c.n_layer <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_ff <= 0) {
    return InvalidArgument(fmt::format("invalid hyper-parameters: embd={} layers={} heads={} "
                                       "kv_heads={} ff={}",
                                       c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.n_ff));
  }
  // The first tensor ValidateTensors asks for, asked before the layer count: a vocabulary-only
  // file is told so, rather than that its block count exceeds its (zero) tensors.
  if (f.FindTensor("token_embd.weight") == nullptr) {
    return InvalidArgument(fmt::format("{} model is missing tensor 'token_embd.weight'",
                                       ArchName(c.arch)));
  }
  PC_RETURN_IF_ERROR(CheckLayerCount(f, c.n_layer, key("block_count")));
  if (c.n_head % c.n_head_kv != 0) {
    return InvalidArgument(fmt::format("head_count {} is not a multiple of head_count_kv {}",
                                       c.n_head, c.n_head_kv));
  }
  PC_ASSIGN_OR_RETURN(c.head_dim, GetCount(f, key("attention.key_length"), false,
                                           c.n_embd / c.n_head));
  PC_ASSIGN_OR_RETURN(c.head_dim_v, GetCount(f, key("attention.value_length"), false,
                                             c.head_dim));
  PC_ASSIGN_OR_RETURN(c.n_rot, GetCount(f, key("rope.dimension_count"), false, c.head_dim));
  if (c.head_dim <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return InvalidArgument(fmt::format("invalid head size {} / rope dimension count {}",
                                       c.head_dim, c.n_rot));
  }
  if (c.head_dim_v != c.head_dim) {
    return Unimplemented(fmt::format("value head size {} differs from key head size {}",
                                     c.head_dim_v, c.head_dim));
  }
  if (c.arch == Arch::kLlama && c.n_rot != c.head_dim) {
    return InvalidArgument(fmt::format("llama: rope dimension count {} must equal the head size "
                                       "{}",
                                       c.n_rot, c.head_dim));
  }

  auto eps = f.GetF32(key("attention.layer_norm_rms_epsilon"));
  if (!eps.ok()) return InvalidArgument(fmt::format("missing or invalid '{}'",
                                                    key("attention.layer_norm_rms_epsilon")));
  c.rms_eps = *eps;
  if (!(c.rms_eps > 0 && c.rms_eps < 1)) {
    return InvalidArgument(fmt::format("rms epsilon {} is out of range", c.rms_eps));
  }

  // RoPE: freq base, then the scaling type and factor (llama.cpp reads rope.scaling.factor,
  // falling back to the older rope.scale_linear).
  c.rope_freq_base = f.GetF32(key("rope.freq_base"), 10000.0f);
  if (!(c.rope_freq_base > 0) || !std::isfinite(c.rope_freq_base)) {
    return InvalidArgument(fmt::format("rope freq base {} is invalid", c.rope_freq_base));
  }
  float factor = f.GetF32(key("rope.scaling.factor"), 0.0f);
  if (factor == 0.0f) factor = f.GetF32(key("rope.scale_linear"), 0.0f);
  std::string scaling = f.GetString(key("rope.scaling.type"), factor != 0.0f ? "linear" : "none");
  if (scaling == "none") {
    c.rope_scaling = RopeScaling::kNone;
  } else if (scaling == "linear") {
    c.rope_scaling = RopeScaling::kLinear;
  } else if (scaling == "yarn") {
    c.rope_scaling = RopeScaling::kYarn;
  } else {
    return Unimplemented(fmt::format("unsupported rope scaling type '{}' (supported: none, "
                                     "linear, yarn)",
                                     scaling));
  }
  if (factor < 0 || !std::isfinite(factor)) {
    return InvalidArgument(fmt::format("rope scaling factor {} is invalid", factor));
  }
  c.rope_scaling_factor = factor == 0.0f ? 1.0f : factor;
  if (c.rope_scaling == RopeScaling::kLinear && c.rope_scaling_factor == 1.0f) {
    c.rope_scaling = RopeScaling::kNone;
  }
  PC_ASSIGN_OR_RETURN(c.rope_orig_ctx, GetCount(f, key("rope.scaling.original_context_length"),
                                                false, c.n_ctx_train));

  // Vocabulary size: <arch>.vocab_size, else the tokenizer's list, else the embedding.
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (f.Has(key("vocab_size"))) {
    PC_ASSIGN_OR_RETURN(c.n_vocab, GetCount(f, key("vocab_size"), true, 0));
  } else if (const GgufValue* toks = f.Find("tokenizer.ggml.tokens");
             toks != nullptr && toks->type == GgufType::kArray) {
    c.n_vocab = static_cast<int64_t>(toks->count);
  } else if (embd != nullptr && embd->dims.size() == 2) {
    c.n_vocab = embd->dims[1];
  }
  if (c.n_vocab <= 0) return InvalidArgument("cannot determine the vocabulary size");

  c.tied_output = f.FindTensor("output.weight") == nullptr;
  c.has_output_bias = f.FindTensor("output.bias") != nullptr;
  c.has_qkv_bias = f.FindTensor(LayerTensorName(0, "attn_q.bias")) != nullptr;
  c.has_rope_freqs = f.FindTensor("rope_freqs.weight") != nullptr;
  c.has_qk_norm = c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe || c.arch == Arch::kGemma3;
  if (c.arch == Arch::kGemma3) PC_RETURN_IF_ERROR(ReadGemma3(f, key, c));
  if (c.arch == Arch::kQwen3Moe) {
    // As llama.cpp: the expert size defaults to the dense size over the experts used, and
    // qwen3moe always renormalises the chosen experts' weights.
    PC_ASSIGN_OR_RETURN(c.n_expert, GetCount(f, key("expert_count"), true, 0));
    PC_ASSIGN_OR_RETURN(c.n_expert_used, GetCount(f, key("expert_used_count"), true, 0));
    if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert) {
      return InvalidArgument(fmt::format("invalid experts: {} = {}, {} = {}", key("expert_count"),
                                         c.n_expert, key("expert_used_count"), c.n_expert_used));
    }
    PC_ASSIGN_OR_RETURN(c.n_ff_exp, GetCount(f, key("expert_feed_forward_length"), false,
                                             c.n_ff / c.n_expert_used));
    if (c.n_ff_exp <= 0) {
      return InvalidArgument(fmt::format("invalid '{}' {}", key("expert_feed_forward_length"),
                                         c.n_ff_exp));
    }
    c.moe_norm_weights = true;
  }
  c.fused_qkv = f.FindTensor(LayerTensorName(0, "attn_qkv.weight")) != nullptr;
  if (c.fused_qkv && c.arch != Arch::kPhi3) {
    return Unimplemented(fmt::format("{}: fused attn_qkv weights are not supported (separate "
                                     "q/k/v expected)",
                                     a));
  }
  c.fused_gate_up = c.arch == Arch::kPhi3;
  c.has_rope_factors = c.arch == Arch::kPhi3 && f.FindTensor("rope_factors_long.weight") != nullptr;
  c.rope_attn_factor = f.GetF32(key("rope.scaling.attn_factor"), 1.0f);
  if (!(c.rope_attn_factor > 0) || !std::isfinite(c.rope_attn_factor)) {
    return InvalidArgument(fmt::format("rope attn factor {} is invalid", c.rope_attn_factor));
  }
  PC_RETURN_IF_ERROR(c.ValidateTensors(f));
  return c;
}

Status ModelConfig::ValidateTensors(const GgufFile& f) const {
  for (const TensorSpec& spec : ArchTensors(*this)) {
    const GgufTensor* t = f.FindTensor(spec.name);
    if (t == nullptr) {
      return InvalidArgument(fmt::format("{} model is missing tensor '{}'", ArchName(arch),
                                         spec.name));
    }
    // Trailing dims of 1 are equivalent (some writers store [n] as [n, 1]).
    std::vector<int64_t> dims = t->dims;
    while (dims.size() > spec.dims.size() && dims.back() == 1) dims.pop_back();
    if (dims != spec.dims) {
      GgufTensor want;
      want.dims = spec.dims;
      return InvalidArgument(fmt::format("tensor '{}' has shape {}, expected {}", spec.name,
                                         t->ShapeString(), want.ShapeString()));
    }
    bool vector = spec.role == TensorRole::kNorm || spec.role == TensorRole::kBias ||
                  spec.role == TensorRole::kRopeFreqs;
    if (vector ? !IsVectorDType(t->dtype) : !IsMatrixDType(t->dtype)) {
      return Unimplemented(fmt::format("tensor '{}' has unsupported type {}", spec.name,
                                       DTypeName(t->dtype)));
    }
  }
  return Status::Ok();
}

}  // namespace polychip::model
