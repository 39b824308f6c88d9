// The qwen3 architecture (Qwen3 dense, 0.6B to 32B): qwen2's NeoX-style RoPE without the q/k/v
// biases, and an RMSNorm over each head of q and k before RoPE (attn_q_norm, attn_k_norm, one
// [head_dim] weight shared by all heads), which keeps the attention logits bounded. The head
// size is its own hyper-parameter (attention.key_length): Qwen3-0.6B has 16 heads of 128 over a
// hidden size of 1024. The output is tied or untied, as the file says.
#include "model/transformer.h"

namespace polychip::model {

ArchTraits Qwen3Traits() {
  ArchTraits t;
  t.name = "qwen3";
  t.rope_mode = runtime::RopeMode::kNeox;
  return t;
}

}  // namespace polychip::model
