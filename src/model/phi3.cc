// The phi3 architecture (Phi-3, Phi-3.5, Phi-4-mini): the llama layout with NeoX-style RoPE,
// q/k/v fused in one attn_qkv matrix and gate/up in one ffn_up (the loader cuts both into the
// separate matrices by rows, so the forward pass is the shared one), a rotary part smaller than
// the head where the file says so (rope.dimension_count; Phi-4-mini rotates 96 of 128), and the
// LongRoPE factors (rope_factors_short/long, chosen by the context length) with their
// rope.scaling.attn_factor.
#include "model/transformer.h"

namespace polychip::model {

ArchTraits Phi3Traits() {
  ArchTraits t;
  t.name = "phi3";
  t.rope_mode = runtime::RopeMode::kNeox;
  return t;
}

}  // namespace polychip::model
