// The qwen3 architecture (Qwen3 dense, 0.6B to 32B): qwen2's NeoX-style RoPE without the q/k/v
// biases, and an RMSNorm over each head of q and k before RoPE (attn_q_norm, attn_k_norm, one
// [head_dim] weight shared by all heads), which keeps the attention logits bounded. The head
// size is its own hyper-parameter (attention.key_length): Qwen3-0.6B has 16 heads of 128 over a
// hidden size of 1024. The output is tied or untied, as the file says.
#include "model/arch.h"

namespace polychip::model {
namespace {

Status QkNorm(ModelConfig& c) {
  c.has_qk_norm = true;
  return Status::Ok();
}
Status Read(const HParams&, ModelConfig& c) { return QkNorm(c); }

ModelConfig Shape(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads, int64_t ff,
                  int64_t ctx, bool tied) {
  ModelConfig c =
      BaseShape(Arch::kQwen3, layers, embd, heads, kv_heads, ff, ctx, 1e6f, 1e-6f, tied);
  c.head_dim = c.head_dim_v = c.n_rot = 128;
  c.has_qk_norm = true;
  return c;
}

constexpr ArchShape kShapes[] = {
    // Qwen/Qwen3-0.6B config.json: head_dim 128 with 16 heads, so q is 2048 wide over a hidden
    // size of 1024.
    {"qwen3-0.6b", [] { return Shape(28, 1024, 16, 8, 3072, 40960, /*tied=*/true); }},
    // For tests: qwen3's decoupled head size (4 heads of 128 over a width of 256), every row a
    // multiple of 256 so that the K-quants apply to every matrix (no fallback types).
    {"qwen3-tiny", [] { return Shape(2, 256, 4, 2, 512, 2048, /*tied=*/false); }},
};

}  // namespace

const ArchDef& Qwen3Arch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNeox,
      .read = Read,
      .adopt = QkNorm,
      .usual_rope_base = 1e6f,
      .usual_rms_eps = 1e-6f,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
