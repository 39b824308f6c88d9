#include "model/model_shapes.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

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

namespace {

ModelConfig Make(Arch arch, int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads,
                 int64_t ff, int64_t ctx, float base, float eps, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = layers;
  c.n_embd = embd;
  c.n_head = heads;
  c.n_head_kv = kv_heads;
  c.n_ff = ff;
  c.n_ctx_train = ctx;
  c.head_dim = c.head_dim_v = c.n_rot = embd / heads;
  c.rope_freq_base = base;
  c.rms_eps = eps;
  c.tied_output = tied;
  return c;
}

}  // namespace

std::vector<std::string> ShapePresetNames() {
  return {"qwen2.5-0.5b", "qwen3-0.6b",   "phi-3-mini-4k", "llama-3.2-1b",  "tinyllama-1.1b",
          "tiny",         "qwen3-tiny",   "phi3-tiny",     "qwen3moe-1.5b", "qwen3moe-tiny",
          "gemma3-1b",    "gemma3-tiny"};
}

StatusOr<ModelConfig> ShapePreset(std::string_view name) {
  ModelConfig c;
  if (name == "qwen2.5-0.5b") {
    // Qwen/Qwen2.5-0.5B config.json
    c = Make(Arch::kQwen2, 24, 896, 14, 2, 4864, 32768, 1e6f, 1e-6f, /*tied=*/true);
    c.has_qkv_bias = true;
  } else if (name == "qwen3-0.6b") {
    // Qwen/Qwen3-0.6B config.json: head_dim 128 with 16 heads, so q is 2048 wide over a
    // hidden size of 1024.
    c = Make(Arch::kQwen3, 28, 1024, 16, 8, 3072, 40960, 1e6f, 1e-6f, /*tied=*/true);
    c.head_dim = c.head_dim_v = c.n_rot = 128;
    c.has_qk_norm = true;
  } else if (name == "phi-3-mini-4k") {
    // microsoft/Phi-3-mini-4k-instruct config.json: fused qkv and gate/up, full rotary.
    c = Make(Arch::kPhi3, 32, 3072, 32, 32, 8192, 4096, 10000.0f, 1e-5f, /*tied=*/false);
    c.fused_qkv = c.fused_gate_up = true;
  } else if (name == "llama-3.2-1b") {
    // meta-llama/Llama-3.2-1B config.json: rope_scaling llama3, factor 32, original ctx 8192
    c = Make(Arch::kLlama, 16, 2048, 32, 8, 8192, 131072, 500000.0f, 1e-5f, /*tied=*/true);
    c.has_rope_freqs = true;
  } else if (name == "tinyllama-1.1b") {
    // TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json
    c = Make(Arch::kLlama, 22, 2048, 32, 4, 5632, 2048, 10000.0f, 1e-5f, /*tied=*/false);
  } else if (name == "tiny") {
    // For tests: small enough to run anywhere, GQA, untied, rows of 128 and 256.
    c = Make(Arch::kLlama, 2, 128, 4, 2, 256, 2048, 10000.0f, 1e-5f, /*tied=*/false);
  } else if (name == "qwen3-tiny") {
    // For tests: qwen3's decoupled head size (4 heads of 128 over a width of 256), every row a
    // multiple of 256 so that the K-quants apply to every matrix (no fallback types).
    c = Make(Arch::kQwen3, 2, 256, 4, 2, 512, 2048, 1e6f, 1e-6f, /*tied=*/false);
    c.head_dim = c.head_dim_v = c.n_rot = 128;
    c.has_qk_norm = true;
  } else if (name == "phi3-tiny") {
    // For tests: phi3's fused matrices, partial rotary (32 of 64 dims, as Phi-4-mini rotates
    // 96 of 128) and LongRoPE factors; rows multiples of 256.
    c = Make(Arch::kPhi3, 2, 256, 4, 2, 512, 4096, 10000.0f, 1e-5f, /*tied=*/false);
    c.n_rot = 32;
    c.fused_qkv = c.fused_gate_up = true;
    c.has_rope_factors = true;
    c.rope_orig_ctx = 1024;
    c.rope_attn_factor = 1.1f;
  } else if (name == "qwen3moe-1.5b") {
    // Qwen3-30B-A3B (48 layers, width 2048, 32 heads of 128, GQA 8, 128 experts of 768, 8
    // used) scaled down to about 1.5B parameters, 0.3B active: 12 layers, width 1024, 16 heads
    // of 128, GQA 4, 64 experts of 512 with 8 used. The CPU benchmark shape of issue 14.
    c = Make(Arch::kQwen3Moe, 12, 1024, 16, 4, 3072, 40960, 1e6f, 1e-6f, /*tied=*/false);
    c.head_dim = c.head_dim_v = c.n_rot = 128;
    c.has_qk_norm = true;
    c.n_expert = 64, c.n_expert_used = 8, c.n_ff_exp = 512, c.moe_norm_weights = true;
  } else if (name == "qwen3moe-tiny") {
    // For tests: qwen3's attention (4 heads of 128 over 256) and 8 experts of 256 with 2 used,
    // every row a multiple of 256 (the K-quants apply to every matrix).
    c = Make(Arch::kQwen3Moe, 2, 256, 4, 2, 512, 2048, 1e6f, 1e-6f, /*tied=*/false);
    c.head_dim = c.head_dim_v = c.n_rot = 128;
    c.has_qk_norm = true;
    c.n_expert = 8, c.n_expert_used = 2, c.n_ff_exp = 256, c.moe_norm_weights = true;
  } else if (name == "gemma3-1b") {
    // google/gemma-3-1b-pt config.json: 4 heads of 256 over a width of 1152, one KV head,
    // sliding window 512 on five layers of every six, local RoPE base 10000.
    c = Make(Arch::kGemma3, 26, 1152, 4, 1, 6912, 32768, 1e6f, 1e-6f, /*tied=*/true);
    c.head_dim = c.head_dim_v = c.n_rot = 256;
    c.sliding_window = 512;
  } else if (name == "gemma3-tiny") {
    // For tests: 7 layers, so that both kinds appear (layer 5 global, the others local), 4
    // heads of 128 over 256, a window of 16 (shorter than the tests' prompts and contexts),
    // rows multiples of 256.
    c = Make(Arch::kGemma3, 7, 256, 4, 2, 512, 2048, 1e6f, 1e-6f, /*tied=*/true);
    c.head_dim = c.head_dim_v = c.n_rot = 128;
    c.sliding_window = 16;
  } else {
    std::string names;
    for (const std::string& n : ShapePresetNames()) names += (names.empty() ? "" : ", ") + n;
    return InvalidArgument(fmt::format("unknown shape '{}' (known: {})", name, names));
  }
  if (c.arch == Arch::kGemma3) {  // what ModelConfig::FromGguf derives for gemma3
    c.has_qk_norm = c.has_post_norms = c.gelu_ffn = true;
    c.sliding_window_pattern = 6;
    c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  }
  c.name = std::string(name);
  return c;
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
