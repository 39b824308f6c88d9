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
#include <fmt/format.h>

#include <cmath>

#include "model/arch.h"

namespace polychip::model {
namespace {

// What every gemma3 model has, given its sizes (llama.cpp's src/models/gemma3.cpp).
void Structure(ModelConfig& c) {
  c.has_qk_norm = c.has_post_norms = c.gelu_ffn = true;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  // Gemma's query_pre_attn_scalar is the head size, except for the 27B (62 layers), whose
  // n_embd / n_head differs from it; the files do not carry it, llama.cpp infers it so.
  const int64_t scalar = c.n_layer == 62 ? c.n_embd / c.n_head : c.head_dim;
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(scalar));
}

Status Read(const HParams& hp, ModelConfig& c) {
  Structure(c);
  PC_ASSIGN_OR_RETURN(c.sliding_window, hp.Count("attention.sliding_window", false, 0));
  if (c.sliding_window > 0) {
    PC_ASSIGN_OR_RETURN(c.sliding_window_pattern,
                        hp.Count("attention.sliding_window_pattern", false, 6));
    PC_ASSIGN_OR_RETURN(c.rope_freq_base_swa, hp.Positive("rope.freq_base_swa", 10000.0f));
  }
  const float softcap = hp.F32("final_logit_softcapping", 0.0f);
  if (softcap != 0.0f) {
    return Unimplemented(fmt::format("'{}' = {:g}: logit soft-capping is not supported",
                                     hp.Key("final_logit_softcapping"), softcap));
  }
  return Status::Ok();
}

Status Adopt(ModelConfig& c) {
  if (c.arch != Arch::kGemma3) {
    return InvalidArgument(
        "gemma3: give --shape gemma3-tiny or gemma3-1b (the window and the "
        "norms come from a shape)");
  }
  c.has_qk_norm = true;
  return Status::Ok();
}

// Heads of 256 or 128, a window on five layers of every six (as the converter writes the
// files: the pattern and the local base implied).
ModelConfig Shape(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads, int64_t ff,
                  int64_t ctx, int64_t head_dim, int64_t window) {
  ModelConfig c = BaseShape(Arch::kGemma3, layers, embd, heads, kv_heads, ff, ctx, 1e6f, 1e-6f,
                            /*tied=*/true);
  c.head_dim = c.head_dim_v = c.n_rot = head_dim;
  c.sliding_window = window;
  c.sliding_window_pattern = 6;
  Structure(c);
  return c;
}

constexpr ArchShape kShapes[] = {
    // google/gemma-3-1b-pt config.json: 4 heads of 256 over a width of 1152, one KV head,
    // sliding window 512 on five layers of every six, local RoPE base 10000.
    {"gemma3-1b", [] { return Shape(26, 1152, 4, 1, 6912, 32768, 256, 512); }},
    // For tests: 7 layers, so that both kinds appear (layer 5 global, the others local), 4
    // heads of 128 over 256, a window of 16 (shorter than the tests' prompts and contexts),
    // rows multiples of 256.
    {"gemma3-tiny", [] { return Shape(7, 256, 4, 2, 512, 2048, 128, 16); }},
};

}  // namespace

const ArchDef& Gemma3Arch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNeox,
      .read = Read,
      .adopt = Adopt,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
