#include "model/model_config.h"

#include <fmt/format.h>

#include <cmath>

#include "model/arch.h"
#include "model/model_shapes.h"

namespace polychip::model {

namespace {

struct ArchEntry {
  Arch arch;
  const char* name;
};
constexpr ArchEntry kArchs[] = {
#define PC_ARCH(Name, name) {Arch::k##Name, name},
#include "model/archs.def"
#undef PC_ARCH
};

}  // namespace

const char* ArchName(Arch arch) {
  for (const ArchEntry& e : kArchs) {
    if (e.arch == arch) return e.name;
  }
  return "?";
}

std::string ArchNames(std::string_view separator) {
  std::string names;
  for (const ArchEntry& e : kArchs) names += (names.empty() ? "" : std::string(separator)) + e.name;
  return names;
}

StatusOr<Arch> ArchFromName(std::string_view name) {
  for (const ArchEntry& e : kArchs) {
    if (name == e.name) return e.arch;
  }
  return Unimplemented(fmt::format("unsupported architecture {} (supported: {})",
                                   name.empty() ? "(none)" : name, ArchNames(", ")));
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
  const HParams hp(f, a);
  auto key = [&hp](std::string_view k) { return hp.Key(k); };

  PC_ASSIGN_OR_RETURN(c.n_ctx_train, hp.Count("context_length", true, 0));
  PC_ASSIGN_OR_RETURN(c.n_embd, hp.Count("embedding_length", true, 0));
  PC_ASSIGN_OR_RETURN(c.n_layer, hp.Count("block_count", true, 0));
  PC_ASSIGN_OR_RETURN(c.n_ff, hp.Count("feed_forward_length", true, 0));
  PC_ASSIGN_OR_RETURN(c.n_head, hp.Count("attention.head_count", true, 0));
  PC_ASSIGN_OR_RETURN(c.n_head_kv, hp.Count("attention.head_count_kv", false, c.n_head));
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
  PC_ASSIGN_OR_RETURN(c.head_dim, hp.Count("attention.key_length", false, c.n_embd / c.n_head));
  PC_ASSIGN_OR_RETURN(c.head_dim_v, hp.Count("attention.value_length", false, c.head_dim));
  PC_ASSIGN_OR_RETURN(c.n_rot, hp.Count("rope.dimension_count", false, c.head_dim));
  if (c.head_dim <= 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return InvalidArgument(fmt::format("invalid head size {} / rope dimension count {}",
                                       c.head_dim, c.n_rot));
  }
  if (c.head_dim_v != c.head_dim) {
    return Unimplemented(fmt::format("value head size {} differs from key head size {}",
                                     c.head_dim_v, c.head_dim));
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
  PC_ASSIGN_OR_RETURN(c.rope_orig_ctx,
                      hp.Count("rope.scaling.original_context_length", false, c.n_ctx_train));

  // Vocabulary size: <arch>.vocab_size, else the tokenizer's list, else the embedding.
  const GgufTensor* embd = f.FindTensor("token_embd.weight");
  if (f.Has(key("vocab_size"))) {
    PC_ASSIGN_OR_RETURN(c.n_vocab, hp.Count("vocab_size", true, 0));
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
  // What is the architecture's own: its structure and its keys (src/model/<arch>.cc).
  if (const ArchDef& def = GetArch(c.arch); def.read != nullptr) {
    PC_RETURN_IF_ERROR(def.read(hp, c));
  }
  if (!c.fused_qkv && f.FindTensor(LayerTensorName(0, "attn_qkv.weight")) != nullptr) {
    return Unimplemented(fmt::format("{}: fused attn_qkv weights are not supported (separate "
                                     "q/k/v expected)",
                                     a));
  }
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
