// The qwen2 architecture (Qwen1.5, Qwen2, Qwen2.5): the llama layout with biases on the q, k
// and v projections (loaded when present) and NeoX-style RoPE, which rotates the two halves of
// each head against each other instead of adjacent pairs.
#include "model/transformer.h"

namespace polychip::model {

ArchTraits Qwen2Traits() {
  ArchTraits t;
  t.name = "qwen2";
  t.rope_mode = runtime::RopeMode::kNeox;
  return t;
}

}  // namespace polychip::model
