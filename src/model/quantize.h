// Our quantizer (the role of llama-quantize): converts a GGUF model's weights to another type.
//
// Policy, a simplified version of llama-quantize's:
//  - 2D (and higher) weight matrices, token_embd.weight and output.weight included, take the
//    target type;
//  - 1D tensors (norms, biases) and rope_freqs.weight are always F32;
//  - a matrix whose row length is not a multiple of the target's block size falls back to a
//    compatible type with a warning: Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
//    Q6_K -> Q8_0 (as llama-quantize), and F16 when even the 32-element block does not fit;
//  - a tensor already of its chosen type is copied byte for byte (no requantization).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

// Types `polychip quantize` accepts: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K..Q6_K.
bool IsQuantizeTarget(DType type);
std::string QuantizeTargetNames();  // "F32, F16, ..." for error messages

// The type a tensor gets under the policy above. Sets *warning when a fallback happened.
DType ChooseTensorType(const std::string& name, const std::vector<int64_t>& dims, DType target,
                       std::string* warning);

// llama.cpp's general.file_type value (enum llama_ftype) for a whole-model target type.
uint32_t LlamaFileType(DType target);

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
  int threads = 0;  // 0: hardware concurrency
  bool progress = true;  // "[  i/N] name ..." lines on stderr
};

// Reads `in`, writes `out` with every tensor converted by the policy; metadata is copied, with
// general.file_type and general.quantization_version updated.
Status QuantizeFile(const std::string& in, const std::string& out, const QuantizeOptions& opts);

}  // namespace polychip::model
