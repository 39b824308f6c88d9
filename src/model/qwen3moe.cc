// The qwen3moe architecture (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head q/k
// RMSNorm, decoupled head size, NeoX RoPE, no biases) with every layer's feed-forward a
// mixture of experts. A router (ffn_gate_inp, kept F32) scores the n_expert experts; each token
// runs the expert_used_count experts of largest softmax probability, their weights renormalised
// to sum 1 (llama.cpp's norm_w for qwen3moe), and adds their weighted SwiGLU outputs. The
// experts are the 3-D tensors ffn_{gate,up,down}_exps, run by the MOE op, which groups the
// tokens by expert so that a step reads each chosen expert once. No shared expert (qwen2moe's).
#include <fmt/format.h>

#include "model/arch.h"

namespace polychip::model {
namespace {

Status Read(const HParams& hp, ModelConfig& c) {
  c.has_qk_norm = true;
  // As llama.cpp: the expert size defaults to the dense size over the experts used, and
  // qwen3moe always renormalises the chosen experts' weights.
  PC_ASSIGN_OR_RETURN(c.n_expert, hp.Count("expert_count", true));
  PC_ASSIGN_OR_RETURN(c.n_expert_used, hp.Count("expert_used_count", true));
  if (c.n_expert <= 0 || c.n_expert_used <= 0 || c.n_expert_used > c.n_expert) {
    return InvalidArgument(fmt::format("invalid experts: {} = {}, {} = {}", hp.Key("expert_count"),
                                       c.n_expert, hp.Key("expert_used_count"), c.n_expert_used));
  }
  PC_ASSIGN_OR_RETURN(c.n_ff_exp,
                      hp.Count("expert_feed_forward_length", false, c.n_ff / c.n_expert_used));
  if (c.n_ff_exp <= 0) {
    return InvalidArgument(
        fmt::format("invalid '{}' {}", hp.Key("expert_feed_forward_length"), c.n_ff_exp));
  }
  c.moe_norm_weights = true;
  return Status::Ok();
}

Status Adopt(ModelConfig& c) {
  c.has_qk_norm = true;
  if (c.n_expert == 0) {
    return InvalidArgument(
        "qwen3moe: give --shape qwen3moe-tiny or qwen3moe-1.5b (the expert "
        "counts come from a shape)");
  }
  return Status::Ok();
}

// Heads of 128; n_expert experts of n_ff_exp rows, n_used of them run per token.
ModelConfig Shape(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads, int64_t ff,
                  int64_t ctx, int64_t n_expert, int64_t n_used, int64_t n_ff_exp) {
  ModelConfig c = BaseShape(Arch::kQwen3Moe, layers, embd, heads, kv_heads, ff, ctx, 1e6f, 1e-6f,
                            /*tied=*/false);
  c.head_dim = c.head_dim_v = c.n_rot = 128;
  c.has_qk_norm = true;
  c.n_expert = n_expert, c.n_expert_used = n_used, c.n_ff_exp = n_ff_exp;
  c.moe_norm_weights = true;
  return c;
}

constexpr ArchShape kShapes[] = {
    // Qwen3-30B-A3B (48 layers, width 2048, 32 heads of 128, GQA 8, 128 experts of 768, 8
    // used) scaled down to about 1.5B parameters, 0.3B active: 12 layers, width 1024, 16 heads
    // of 128, GQA 4, 64 experts of 512 with 8 used. The CPU benchmark shape of issue 14.
    {"qwen3moe-1.5b", [] { return Shape(12, 1024, 16, 4, 3072, 40960, 64, 8, 512); }},
    // For tests: qwen3's attention (4 heads of 128 over 256) and 8 experts of 256 with 2 used,
    // every row a multiple of 256 (the K-quants apply to every matrix).
    {"qwen3moe-tiny", [] { return Shape(2, 256, 4, 2, 512, 2048, 8, 2, 256); }},
};

}  // namespace

const ArchDef& Qwen3MoeArch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNeox,
      .read = Read,
      .adopt = Adopt,
      .usual_rope_base = 1e6f,
      .usual_rms_eps = 1e-6f,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
