// The qwen3moe architecture (Qwen3-30B-A3B, Qwen3-235B-A22B): qwen3's attention (per-head q/k
// RMSNorm, decoupled head size, NeoX RoPE, no biases) with every layer's feed-forward a
// mixture of experts. A router (ffn_gate_inp, kept F32) scores the n_expert experts; each token
// runs the expert_used_count experts of largest softmax probability, their weights renormalised
// to sum 1 (llama.cpp's norm_w for qwen3moe), and adds their weighted SwiGLU outputs. The
// experts are the 3-D tensors ffn_{gate,up,down}_exps, run by the MOE op, which groups the
// tokens by expert so that a step reads each chosen expert once. No shared expert (qwen2moe's).
#include "model/transformer.h"

namespace polychip::model {

ArchTraits Qwen3MoeTraits() {
  ArchTraits t;
  t.name = "qwen3moe";
  t.rope_mode = runtime::RopeMode::kNeox;
  return t;
}

}  // namespace polychip::model
