// The gemma3 architecture (Gemma 3 text models, 270M to 27B), as llama.cpp reads its GGUF
// files: the token embeddings scaled by sqrt(n_embd); qwen3's per-head RMSNorm of q and k
// before NeoX RoPE, with a head size of its own (attention.key_length); the attention output
// and the feed-forward output each RMS-normed (post_attention_norm, post_ffw_norm) before their
// residual add; a GELU-gated feed-forward (tanh approximation, the GEGLU op); interleaved
// attention: five local layers of every six (attention.sliding_window_pattern) see only the
// last attention.sliding_window positions (ATTENTION's window) and rotate with base 10000
// (rope.freq_base_swa), while the global ones use rope.freq_base and the file's RoPE scaling.
// The attention scale is 1/sqrt(query_pre_attn_scalar), the head size but for the 27B. The
// norm weights are used as stored: the converter has already added Gemma's +1. Output tied.
#include "model/transformer.h"

namespace polychip::model {

ArchTraits Gemma3Traits() {
  ArchTraits t;
  t.name = "gemma3";
  t.rope_mode = runtime::RopeMode::kNeox;
  return t;
}

}  // namespace polychip::model
