// The mistral3 architecture (the text model of Mistral-Small-3.1/3.2, as llama.cpp's converter
// writes Mistral3ForConditionalGeneration): the llama layout and RoPE (adjacent pairs, the
// whole head) with a head size of its own (attention.key_length: 32 heads of 128 over a width
// of 5120, as Mistral-Nemo has). Ministral 3's Llama-4 attention temperature scaling
// (attention.temperature_scale) is refused.
#include <fmt/format.h>

#include "model/arch.h"

namespace polychip::model {
namespace {

Status Read(const HParams& hp, ModelConfig& c) {
  if (c.n_rot != c.head_dim) {  // llama.cpp's mistral3 graph asserts it
    return InvalidArgument(
        fmt::format("mistral3: rope dimension count {} must equal the head "
                    "size {}",
                    c.n_rot, c.head_dim));
  }
  if (const float t = hp.F32("attention.temperature_scale", 0.0f); t != 0.0f) {
    return Unimplemented(
        fmt::format("'{}' = {:g}: attention temperature scaling is not "
                    "supported",
                    hp.Key("attention.temperature_scale"), t));
  }
  return Status::Ok();
}

// Heads of 128 whatever the width.
ModelConfig Shape(int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads, int64_t ff,
                  int64_t ctx, float rope_base, bool tied) {
  ModelConfig c =
      BaseShape(Arch::kMistral3, layers, embd, heads, kv_heads, ff, ctx, rope_base, 1e-5f, tied);
  c.head_dim = c.head_dim_v = c.n_rot = 128;
  return c;
}

constexpr ArchShape kShapes[] = {
    // mistralai/Mistral-Small-3.1-24B-Instruct-2503 config.json, text_config: 40 layers, 32
    // heads of 128 over 5120, GQA 8, RoPE base 1e9.
    {"mistral-small-3.1-24b",
     [] { return Shape(40, 5120, 32, 8, 32768, 131072, 1e9f, /*tied=*/false); }},
    // For tests: the decoupled head size (4 heads of 128 over a width of 256), rows multiples
    // of 256.
    {"mistral3-tiny", [] { return Shape(2, 256, 4, 2, 512, 2048, 1e6f, /*tied=*/false); }},
};

}  // namespace

const ArchDef& Mistral3Arch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNormal,
      .read = Read,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
