#include "model/model_shapes.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "model/arch.h"

namespace polychip::model {

std::vector<TensorSpec> ArchTensors(const ModelConfig& c) {
  std::vector<TensorSpec> t;
  t.push_back({"token_embd.weight", {c.n_embd, c.n_vocab}, TensorRole::kEmbedding});
  if (c.has_rope_freqs) t.push_back({"rope_freqs.weight", {c.n_rot / 2}, TensorRole::kRopeFreqs});
  if (c.has_rope_factors) {
    t.push_back({"rope_factors_long.weight", {c.n_rot / 2}, TensorRole::kRopeFreqs});
    t.push_back({"rope_factors_short.weight", {c.n_rot / 2}, TensorRole::kRopeFreqs});
  }
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto n = [l](std::string_view s) { return LayerTensorName(l, s); };
    t.push_back({n("attn_norm.weight"), {c.n_embd}, TensorRole::kNorm});
    if (c.fused_qkv) {
      t.push_back({n("attn_qkv.weight"), {c.n_embd, c.q_dim() + c.kv_dim() + c.v_dim()},
                   TensorRole::kMatrix});
    } else {
      t.push_back({n("attn_q.weight"), {c.n_embd, c.q_dim()}, TensorRole::kMatrix});
      t.push_back({n("attn_k.weight"), {c.n_embd, c.kv_dim()}, TensorRole::kMatrix});
      t.push_back({n("attn_v.weight"), {c.n_embd, c.v_dim()}, TensorRole::kMatrix});
    }
    if (c.has_qkv_bias) {
      t.push_back({n("attn_q.bias"), {c.q_dim()}, TensorRole::kBias});
      t.push_back({n("attn_k.bias"), {c.kv_dim()}, TensorRole::kBias});
      t.push_back({n("attn_v.bias"), {c.v_dim()}, TensorRole::kBias});
    }
    t.push_back({n("attn_output.weight"), {c.n_head * c.head_dim_v, c.n_embd}, TensorRole::kMatrix});
    if (c.has_qk_norm) {
      t.push_back({n("attn_q_norm.weight"), {c.head_dim}, TensorRole::kNorm});
      t.push_back({n("attn_k_norm.weight"), {c.head_dim}, TensorRole::kNorm});
    }
    if (c.has_post_norms) {
      t.push_back({n("post_attention_norm.weight"), {c.n_embd}, TensorRole::kNorm});
    }
    t.push_back({n("ffn_norm.weight"), {c.n_embd}, TensorRole::kNorm});
    if (c.n_expert > 0) {  // qwen3moe: the router and the experts' 3-D tensors
      t.push_back({n("ffn_gate_inp.weight"), {c.n_embd, c.n_expert}, TensorRole::kMatrix});
      t.push_back({n("ffn_gate_exps.weight"), {c.n_embd, c.n_ff_exp, c.n_expert},
                   TensorRole::kMatrix});
      t.push_back({n("ffn_down_exps.weight"), {c.n_ff_exp, c.n_embd, c.n_expert},
                   TensorRole::kMatrix});
      t.push_back({n("ffn_up_exps.weight"), {c.n_embd, c.n_ff_exp, c.n_expert},
                   TensorRole::kMatrix});
      continue;
    }
    if (c.fused_gate_up) {
      t.push_back({n("ffn_up.weight"), {c.n_embd, 2 * c.n_ff}, TensorRole::kMatrix});
    } else {
      t.push_back({n("ffn_gate.weight"), {c.n_embd, c.n_ff}, TensorRole::kMatrix});
      t.push_back({n("ffn_up.weight"), {c.n_embd, c.n_ff}, TensorRole::kMatrix});
    }
    t.push_back({n("ffn_down.weight"), {c.n_ff, c.n_embd}, TensorRole::kMatrix});
    if (c.has_post_norms) t.push_back({n("post_ffw_norm.weight"), {c.n_embd}, TensorRole::kNorm});
  }
  t.push_back({"output_norm.weight", {c.n_embd}, TensorRole::kNorm});
  if (!c.tied_output) t.push_back({"output.weight", {c.n_embd, c.n_vocab}, TensorRole::kOutput});
  if (c.has_output_bias) t.push_back({"output.bias", {c.n_vocab}, TensorRole::kBias});
  return t;
}

std::vector<std::string> ShapePresetNames() {
  std::vector<std::string> names;
  for (Arch arch : AllArchs()) {
    for (const ArchShape& shape : GetArch(arch).shapes) names.push_back(shape.name);
  }
  return names;
}

StatusOr<ModelConfig> ShapePreset(std::string_view name) {
  for (Arch arch : AllArchs()) {
    for (const ArchShape& shape : GetArch(arch).shapes) {
      if (name != shape.name) continue;
      ModelConfig c = shape.make();
      c.name = std::string(name);
      return c;
    }
  }
  std::string names;
  for (const std::string& n : ShapePresetNames()) names += (names.empty() ? "" : ", ") + n;
  return InvalidArgument(fmt::format("unknown shape '{}' (known: {})", name, names));
}

std::vector<float> Llama3RopeFreqs(int64_t n_rot, float freq_base, const Llama3RopeScaling& s) {
  const double low_wavelen = s.original_context / s.low_freq_factor;
  const double high_wavelen = s.original_context / s.high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < n_rot; i += 2) {
    double freq = 1.0 / std::pow(static_cast<double>(freq_base), static_cast<double>(i) / n_rot);
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < high_wavelen) {
      factors.push_back(1.0f);  // high frequencies: unchanged
    } else if (wavelen > low_wavelen) {
      factors.push_back(s.factor);  // low frequencies: fully scaled
    } else {  // in between: interpolate smoothly
      double smooth = (s.original_context / wavelen - s.low_freq_factor) /
                      (s.high_freq_factor - s.low_freq_factor);
      factors.push_back(static_cast<float>(1.0 / ((1 - smooth) / s.factor + smooth)));
    }
  }
  return factors;
}

}  // namespace polychip::model
