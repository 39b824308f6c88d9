// The llama architecture (Llama 1/2/3, TinyLlama, Mistral 7B and Mistral-Nemo, which the
// converter writes as "llama"): the shared transformer as it is. RoPE rotates adjacent pairs of
// each head, over the whole head. Optional pieces (attention biases, rope_freqs for Llama-3
// frequency scaling, an untied output) are taken from the file.
#include <fmt/format.h>

#include "model/arch.h"

namespace polychip::model {
namespace {

Status Read(const HParams&, ModelConfig& c) {
  if (c.n_rot != c.head_dim) {
    return InvalidArgument(
        fmt::format("llama: rope dimension count {} must equal the head size "
                    "{}",
                    c.n_rot, c.head_dim));
  }
  return Status::Ok();
}

constexpr ArchShape kShapes[] = {
    // meta-llama/Llama-3.2-1B config.json: rope_scaling llama3, factor 32, original ctx 8192
    {"llama-3.2-1b",
     [] {
       ModelConfig c = BaseShape(Arch::kLlama, 16, 2048, 32, 8, 8192, 131072, 500000.0f, 1e-5f,
                                 /*tied=*/true);
       c.has_rope_freqs = true;
       return c;
     }},
    // TinyLlama/TinyLlama-1.1B-Chat-v1.0 config.json
    {"tinyllama-1.1b",
     [] {
       return BaseShape(Arch::kLlama, 22, 2048, 32, 4, 5632, 2048, 10000.0f, 1e-5f,
                        /*tied=*/false);
     }},
    // For tests: small enough to run anywhere, GQA, untied, rows of 128 and 256 (`gguf synth
    // --arch` makes it another architecture's).
    {"tiny",
     [] {
       return BaseShape(Arch::kLlama, 2, 128, 4, 2, 256, 2048, 10000.0f, 1e-5f, /*tied=*/false);
     }},
};

}  // namespace

const ArchDef& LlamaArch() {
  static const ArchDef def{
      .rope_mode = runtime::RopeMode::kNormal,
      .read = Read,
      .shapes = kShapes,
  };
  return def;
}

}  // namespace polychip::model
