// Random-weight models of a real shape: no registry here ships trained weights, so tests and
// benchmarks run on models we write ourselves, with the real tokenizer of a vocabulary GGUF.
#pragma once

#include <cstdint>
#include <string>

#include "model/model_config.h"
#include "model/model_shapes.h"
#include "model/quantize.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

struct SynthOptions {
  std::string vocab_path;  // a GGUF with tokenizer.* metadata (e.g. ggml-vocab-qwen2.gguf)
  ModelConfig config;      // the shape; n_vocab is taken from the vocabulary
  DType type = DType::kF16;  // weight type (policy of quantize.h)
  QuantMix mix = QuantMix::kUniform;  // a llama-quantize mixture over `type` (Q4_K_M: Q4_K)
  uint64_t seed = 42;
  float weight_std = 0.02f;  // matrices and biases ~ N(0, std); norms ~ 1 + N(0, std)
  Llama3RopeScaling llama3;  // used when config.has_rope_freqs (llama-3.2-1b: factor 32)
  int threads = 0;
  bool progress = true;
  // Written as tokenizer.chat_template when not empty, in place of the vocabulary's (tests
  // give a synthesized model a real model's template).
  std::string chat_template;
};

// Writes the model to `out`. Deterministic: the same options give the same bytes, whatever
// the thread count (each row draws from its own generator seeded by seed, tensor and row).
Status SynthesizeModel(const SynthOptions& opts, const std::string& out);

}  // namespace polychip::model
