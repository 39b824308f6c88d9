// The cpu plugin's fast ops: matmul (packed quantized weights, float weights, any GGUF type),
// paged attention, rope, rms_norm, swiglu, the routed experts (moe) and LoRA terms (lora), parallel on the plugin's thread pool through the
// selected kernel table, and embedding from packed tables. Other ops use the SDK reference
// kernels. Arguments are validated by the caller; each function returns nullptr on success or
// a static message.
#pragma once

#include "kernels.h"
#include "streams_tuner.h"
#include "polychip/plugin/pc_ops.h"
#include "thread_pool.h"

namespace polychip::cpu {

struct OpContext {
  ThreadPool* pool;
  const KernelTable* k;
  // Weight streams per thread of a decode matmul (KernelTable::gemm_packed_streams; 1: one
  // sequential read per task) where there is no tuner: the plugin parameter weight_streams
  // set to a number. Which count is best depends on the host (three on the Zen 5 VMs, one on a
  // Zen 4: docs/performance.md "Decode weight streams"), hence the tuner by default.
  int weight_streams = 3;
  // When set (the plugin's default, weight_streams=auto), decode matmuls take their streams and
  // prefetching from the tuner, which measures them, instead of weight_streams and
  // weight_prefetch.
  StreamsTuner* streams_tuner = nullptr;
  // Whether decode's streams kernel prefetches in software (plugin parameter weight_prefetch).
  bool weight_prefetch = true;
};

const char* Matmul(const OpContext& c, const pc_matmul_args_t& a);
const char* Attention(const OpContext& c, const pc_attention_args_t& a);
const char* Rope(const OpContext& c, const pc_rope_args_t& a);
const char* KvStore(const OpContext& c, const pc_kv_store_args_t& a);
const char* RmsNorm(const OpContext& c, const pc_rms_norm_args_t& a);
const char* Swiglu(const OpContext& c, const pc_swiglu_args_t& a);
const char* Geglu(const OpContext& c, const pc_geglu_args_t& a);
// MOE, each weight in any of the plugin's layouts (moe.cc); a.*_layout are not validated here.
const char* Moe(const OpContext& c, const pc_moe_args_t& a);
// LORA, A and B each in any of the plugin's layouts (lora.cc); a.*_layout are not validated
// here.
const char* Lora(const OpContext& c, const pc_lora_args_t& a);
// Whether Lora(c, a) succeeds on the calling thread alone, using no pool (a decode step's
// launches of a small adapter): the plugin may then run it on a worker beside the next ones.
bool LoraRunsAlone(const OpContext& c, const pc_lora_args_t& a);
// Weight rows [j0, j0 + 4) of an [n, k] GGUF-layout matrix (row_bytes each; past row n - 1
// the last row repeats) in f32 for dot4x4/dot4: pointers into the matrix for F32, else
// converted or dequantized into buf [4, k]. False for a dtype with no f32 form.
bool FourWeightRows(const OpContext& c, pc_dtype_t dtype, const uint8_t* w, int64_t row_bytes,
                    int64_t j0, int64_t n, int64_t k, float* buf, const float* rows[4]);

// Rows [i0, i1) of x (x_stride apart) against four weight rows of length k: emit(i, v), v the
// row's four dot products, four rows of x at a time (dot4x4) from i0 and the rest one at a
// time (dot4), so a row's sums depend only on its place among the fours from i0.
template <typename Emit>
void DotFourRows(const KernelTable& kt, const float* x, int64_t x_stride, int64_t i0, int64_t i1,
                 const float* const rows[4], int64_t k, Emit&& emit) {
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    float v[16];
    const float* xr[4] = {x + i * x_stride, x + (i + 1) * x_stride, x + (i + 2) * x_stride,
                          x + (i + 3) * x_stride};
    kt.dot4x4_f32(xr, rows, k, v);
    for (int64_t ii = 0; ii < 4; ++ii) emit(i + ii, v + ii * 4);
  }
  for (; i < i1; ++i) {
    float v[4];
    kt.dot4_f32(x + i * x_stride, rows[0], rows[1], rows[2], rows[3], k, v);
    emit(i, v);
  }
}

// EMBEDDING whose table is in one of the plugin's layouts (kLayoutPacked or kLayoutPanel;
// a.table_layout is ignored), embedding.cc; GGUF tables use the SDK's.
const char* EmbeddingPacked(const pc_embedding_args_t& a, uint32_t layout);

// Repacks a GGUF [n, k] matrix of a packable dtype into dst (PackedBytes long), in parallel.
void PackParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n, int64_t k,
                  void* dst);
// Rearranges a GGUF [n, k] float matrix (F16/BF16/F32) into panels (PanelBytes long), in
// parallel.
void PackPanelsParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n,
                        int64_t k, void* dst);

}  // namespace polychip::cpu
