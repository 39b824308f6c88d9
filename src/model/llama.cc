// The llama architecture (Llama 1/2/3, TinyLlama, Mistral-style files with arch "llama"):
// RoPE rotates adjacent pairs of each head. Optional pieces (attention biases, rope_freqs for
// Llama-3 frequency scaling, an untied output) are taken from the file by the loader.
#include "model/transformer.h"

namespace polychip::model {

ArchTraits LlamaTraits() {
  ArchTraits t;
  t.name = "llama";
  t.rope_mode = runtime::RopeMode::kNormal;
  return t;
}

}  // namespace polychip::model
