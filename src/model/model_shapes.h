// The tensors of the shared transformer (names and shapes as in llama.cpp's GGUF files), as the
// structure flags an architecture's file sets choose them, and the named shapes of real models
// (each in its architecture's file), used to validate loaded files and to synthesize
// random-weight models of a real shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_config.h"
#include "util/status.h"

namespace polychip::model {

enum class TensorRole {
  kEmbedding,  // token_embd.weight
  kOutput,     // output.weight (untied models)
  kMatrix,     // attention and FFN weights
  kNorm,       // RMSNorm weights (1D)
  kBias,       // 1D biases
  kRopeFreqs,  // rope_freqs.weight (1D, llama-3 scaling)
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the row length
  TensorRole role;
};

// Every tensor a model with this configuration has, in the order llama.cpp's converter writes
// them (embedding, layers, output norm, output). Flags in `c` (tied_output, has_qkv_bias,
// has_output_bias, has_rope_freqs, has_qk_norm, fused_qkv, fused_gate_up, has_rope_factors,
// n_expert, has_post_norms)
// decide which tensors are listed.
std::vector<TensorSpec> ArchTensors(const ModelConfig& c);

// Named shapes of real models and tiny test ones, each defined in its architecture's file
// (ArchDef::shapes): "qwen2.5-0.5b", "llama-3.2-1b", "tiny" (llama; `gguf synth --arch` makes it
// another's), "qwen3-tiny", "gemma3-tiny", ... n_vocab is left 0: it comes from the vocabulary
// file.
StatusOr<ModelConfig> ShapePreset(std::string_view name);
std::vector<std::string> ShapePresetNames();

// Llama-3 RoPE frequency divisors, as Meta's reference and llama.cpp's converter compute them:
// [n_rot / 2] factors in [1, factor].
struct Llama3RopeScaling {
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_context = 8192;
};
std::vector<float> Llama3RopeFreqs(int64_t n_rot, float freq_base, const Llama3RopeScaling& s);

}  // namespace polychip::model
