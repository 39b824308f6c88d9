// Our quantizer (the role of llama-quantize): converts a GGUF model's weights to another type.
//
// Policy, a simplified version of llama-quantize's:
//  - 2D (and higher) weight matrices, token_embd.weight and output.weight included, take the
//    target type;
//  - 1D tensors (norms, biases) and rope_freqs.weight are always F32;
//  - a matrix whose row length is not a multiple of the target's block size falls back to a
//    compatible type with a warning: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
//    Q6_K -> Q8_0, IQ4_XS -> IQ4_NL (as llama-quantize), and F16 when even the 32-element
//    block does not fit;
//  - a tensor already of its chosen type is copied byte for byte (no requantization).
//
// A named mixture (llama-quantize's Q3_K_S ... Q5_K_M) keeps most matrices at its base type and
// gives the tensors that matter most more bits, by the same rules as llama-quantize for dense
// models: the output matrix (or the tied embedding) Q6_K; attn_v and ffn_down Q6_K on the
// "more bits" layers of the _M mixes (the first and last eighth, and every third between);
// Q3_K_M's attn_output Q4_K, and so on (MixTensorType in quantize.cc). The plain type names
// (Q4_K, ...) stay uniform: every matrix that type.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

// Types `polychip quantize` accepts: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K..Q6_K IQ4_NL
// IQ4_XS.
bool IsQuantizeTarget(DType type);
std::string QuantizeTargetNames();  // "F32, F16, ..." for error messages

// The type a tensor gets under the policy above. Sets *warning when a fallback happened.
DType ChooseTensorType(const std::string& name, const std::vector<int64_t>& dims, DType target,
                       std::string* warning);

// llama.cpp's general.file_type value (enum llama_ftype) for a whole-model target type.
uint32_t LlamaFileType(DType target);
// The scheme name ("Q4_K_M", "Q8_0") of a general.file_type value that polychip writes; empty
// for the others.
std::string LlamaFileTypeName(uint32_t file_type);

enum class QuantMix { kUniform, kQ3_K_S, kQ3_K_M, kQ3_K_L, kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M };

// What `polychip quantize` and `gguf synth --type` take: a base type and a mixture.
struct QuantScheme {
  DType type = DType::kQ8_0;  // the type of every matrix no rule of the mixture singles out
  QuantMix mix = QuantMix::kUniform;
};
// "Q4_K_M", "Q3_K_S", ... or the name of a type IsQuantizeTarget accepts (uniform).
StatusOr<QuantScheme> ParseQuantScheme(std::string_view name);
std::string QuantSchemeName(const QuantScheme& scheme);
std::string QuantSchemeNames();  // every accepted name, for help and error messages
uint32_t LlamaFileType(const QuantScheme& scheme);

// What a mixture's rules read about the model.
struct MixModel {
  int64_t n_layer = 0;
  int64_t n_gqa = 1;            // query heads per KV head
  bool tied_embeddings = false;  // no output.weight: token_embd serves as the output
};

// The type of one tensor under `scheme` (the policy above, then the row-length fallbacks).
DType ChooseTensorType(const std::string& name, const std::vector<int64_t>& dims,
                       const QuantScheme& scheme, const MixModel& model, std::string* warning);

// Number of worker threads to use when `requested` is 0 (the hardware concurrency).
int ResolveThreads(int requested);

// Runs fn(begin_row, end_row) over [0, n_rows) split across `threads` threads.
void ParallelRows(int64_t n_rows, int threads, const std::function<void(int64_t, int64_t)>& fn);

// Converts n_rows rows of row_len elements from `src_type` to `dst_type` (through F32).
Status ConvertRows(DType src_type, const uint8_t* src, DType dst_type, uint8_t* dst,
                   int64_t row_len, int64_t n_rows, int threads);

// Quantizes rows produced by `gen(row, out[row_len])` into `dst` (used by the synthesizer to
// generate and quantize one row at a time, never holding a whole F32 tensor).
Status QuantizeGeneratedRows(const std::function<void(int64_t, float*)>& gen, DType dst_type,
                             uint8_t* dst, int64_t row_len, int64_t n_rows, int threads);

struct QuantizeOptions {
  DType type = DType::kQ8_0;
  QuantMix mix = QuantMix::kUniform;  // with `type` as its base type
  int threads = 0;  // 0: hardware concurrency
  bool progress = true;  // "[  i/N] name ..." lines on stderr
};

// Reads `in`, writes `out` with every tensor converted by the policy; metadata is copied, with
// general.file_type and general.quantization_version updated.
Status QuantizeFile(const std::string& in, const std::string& out, const QuantizeOptions& opts);

}  // namespace polychip::model
