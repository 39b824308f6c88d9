// The architecture registry: what each architecture is beyond the shared transformer
// (transformer.h), defined in its own file (src/model/<arch>.cc) and listed in archs.def.
//
// An architecture's file holds everything that is its own: its RoPE mode, the hyper-parameters
// it reads from the GGUF file and the structure they imply (the ModelConfig flags the shared
// forward pass and tensor list follow: per-head q/k norms, experts, fused matrices, ...), what
// `gguf synth --arch` gives a shape of another architecture, and its named shapes (real models
// and tiny test models). What every architecture shares (sizes, RoPE base and scaling, epsilon,
// vocabulary, optional biases and output) is read once, in ModelConfig::FromGguf.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"
#include "runtime/ops.h"
#include "util/status.h"

namespace polychip::model {

// An architecture's view of its file's hyper-parameters: every key is "<arch>.<key>", as
// llama.cpp's llama-arch.cpp names them.
class HParams {
 public:
  HParams(const GgufFile& file, std::string_view arch) : file_(file), arch_(arch) {}
  const GgufFile& file() const { return file_; }
  std::string Key(std::string_view key) const;  // "gemma3.attention.sliding_window"
  // An integer in [0, 2^31) (`def` when absent and not required). llama.cpp allows per-layer
  // arrays for some counts; one is accepted when every layer has the same value.
  StatusOr<int64_t> Count(std::string_view key, bool required, int64_t def = 0) const;
  // A float that must be positive and finite when present (`def` when absent).
  StatusOr<float> Positive(std::string_view key, float def) const;
  float F32(std::string_view key, float def) const { return file_.GetF32(Key(key), def); }

 private:
  const GgufFile& file_;
  std::string arch_;
};

// A named shape for `gguf synth --shape`: a real model's hyper-parameters (its config.json), or
// a tiny one for tests. n_vocab is left 0: it comes from the vocabulary file.
struct ArchShape {
  const char* name;
  ModelConfig (*make)();
};

struct ArchDef {
  runtime::RopeMode rope_mode = runtime::RopeMode::kNormal;
  // Reads what is the architecture's own, after the shared hyper-parameters are in `c`: sets
  // the structure flags every file of it has and reads its own keys. Null: nothing of its own.
  Status (*read)(const HParams& hp, ModelConfig& c) = nullptr;
  // `gguf synth --arch`: what every file of this architecture has, given to a shape `c` that
  // may be of another architecture (c.arch is still the shape's). Fails when a shape of another
  // architecture cannot be made one (the expert counts of a mixture come from a shape).
  Status (*adopt)(ModelConfig& c) = nullptr;
  // The RoPE base and epsilon of the family, which `gguf synth --arch` gives a shape of
  // another architecture (0: keep the shape's).
  float usual_rope_base = 0.0f;
  float usual_rms_eps = 0.0f;
  std::span<const ArchShape> shapes;
};

// The definition of `arch` (its file's <Name>Arch()).
const ArchDef& GetArch(Arch arch);
std::vector<Arch> AllArchs();  // in archs.def order

// A shape's common part, as a config.json gives it: head size, value head size and rotary
// dims all n_embd / n_head (set them after for a decoupled head size or partial rotary).
ModelConfig BaseShape(Arch arch, int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads,
                      int64_t ff, int64_t ctx, float rope_base, float rms_eps, bool tied);

// `gguf synth --arch`: makes the shape `c` one of `arch`'s (its usual settings when `c` is of
// another architecture, then ArchDef::adopt); q/k/v biases and per-head q/k norms are the
// architecture's to decide, whatever the shape had.
Status AdoptArch(Arch arch, ModelConfig& c);

}  // namespace polychip::model
