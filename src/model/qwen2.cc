// The qwen2 architecture (Qwen1.5, Qwen2, Qwen2.5): the llama layout with biases on the q, k
// and v projections (loaded when present) and NeoX-style RoPE, which rotates the two halves of
// each head against each other instead of adjacent pairs.
#include "model/arch.h"

namespace polychip::model {
namespace {

Status Adopt(ModelConfig& c) {
  c.has_qkv_bias = true;  // every qwen2 model has q/k/v biases
  return Status::Ok();
}

constexpr ArchShape kShapes[] = {
    // Qwen/Qwen2.5-0.5B config.json
    {"qwen2.5-0.5b",
     [] {
       ModelConfig c = BaseShape(Arch::kQwen2, 24, 896, 14, 2, 4864, 32768, 1e6f, 1e-6f,
                                 /*tied=*/true);
       c.has_qkv_bias = true;
       return c;
     }},
};

}  // namespace

const ArchDef& Qwen2Arch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNeox,
      .adopt = Adopt,
      .usual_rope_base = 1e6f,
      .usual_rms_eps = 1e-6f,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
