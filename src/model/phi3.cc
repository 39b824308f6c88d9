// The phi3 architecture (Phi-3, Phi-3.5, Phi-4-mini): the llama layout with NeoX-style RoPE,
// q/k/v fused in one attn_qkv matrix and gate/up in one ffn_up (the loader cuts both into the
// separate matrices by rows, so the forward pass is the shared one), a rotary part smaller than
// the head where the file says so (rope.dimension_count; Phi-4-mini rotates 96 of 128), and the
// LongRoPE factors (rope_factors_short/long, chosen by the context length) with their
// rope.scaling.attn_factor.
#include "model/arch.h"

namespace polychip::model {
namespace {

Status Read(const HParams& hp, ModelConfig& c) {
  // q/k/v fused or separate, as the file has them; gate and up always fused.
  c.fused_qkv = hp.file().FindTensor(LayerTensorName(0, "attn_qkv.weight")) != nullptr;
  c.fused_gate_up = true;
  c.has_rope_factors = hp.file().FindTensor("rope_factors_long.weight") != nullptr;
  return Status::Ok();
}

Status Adopt(ModelConfig& c) {
  c.fused_qkv = c.fused_gate_up = true;  // as phi3 writes them
  return Status::Ok();
}

constexpr ArchShape kShapes[] = {
    // microsoft/Phi-3-mini-4k-instruct config.json: fused qkv and gate/up, full rotary.
    {"phi-3-mini-4k",
     [] {
       ModelConfig c = BaseShape(Arch::kPhi3, 32, 3072, 32, 32, 8192, 4096, 10000.0f, 1e-5f,
                                 /*tied=*/false);
       c.fused_qkv = c.fused_gate_up = true;
       return c;
     }},
    // For tests: phi3's fused matrices, partial rotary (32 of 64 dims, as Phi-4-mini rotates
    // 96 of 128) and LongRoPE factors; rows multiples of 256.
    {"phi3-tiny",
     [] {
       ModelConfig c = BaseShape(Arch::kPhi3, 2, 256, 4, 2, 512, 4096, 10000.0f, 1e-5f,
                                 /*tied=*/false);
       c.n_rot = 32;
       c.fused_qkv = c.fused_gate_up = true;
       c.has_rope_factors = true;
       c.rope_orig_ctx = 1024;
       c.rope_attn_factor = 1.1f;
       return c;
     }},
};

}  // namespace

const ArchDef& Phi3Arch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNeox,
      .read = Read,
      .adopt = Adopt,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
