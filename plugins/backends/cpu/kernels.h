// The cpu plugin's kernel table: one implementation per instruction set (kernels_scalar.cc,
// kernels_avx2.cc, kernels_avx512.cc, each compiled with its own -m flags), chosen at run time
// from CPUID or forced with the plugin parameter `isa`. The ops (cpu_ops.cc) call through the
// table, so every variant computes the same thing in the same layout and tests can compare
// them one by one against the SDK reference.
#pragma once

#include <cstdint>

#include "packed.h"
#include "panel.h"

namespace polychip::cpu {

// Splits m activation rows into tiles of 16, then one of 8, 4 and the last 1-3, calling
// run.template operator()<MT>(i) for each (MT the tile's rows, i its first row): the packed
// kernels' register tiles, sized at compile time.
template <typename Run>
inline void ForEachRowTile(int64_t m, Run&& run) {
  int64_t i = 0;
  for (; m - i >= 16; i += 16) run.template operator()<16>(i);
  if (m - i >= 8) run.template operator()<8>(i), i += 8;
  if (m - i >= 4) run.template operator()<4>(i), i += 4;
  switch (m - i) {
    case 3: run.template operator()<3>(i); break;
    case 2: run.template operator()<2>(i); break;
    case 1: run.template operator()<1>(i); break;
    default: break;
  }
}

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct KernelTable {
  const char* name;
  Isa isa;

  // ---- quantized weights (packed layout, packed.h) ----
  // x [k] -> k/32 activation blocks, each scale_block (32 or 256, ActScaleBlock) consecutive
  // activations sharing one scale; k is a multiple of scale_block.
  void (*quantize_row)(const float* x, int64_t k, int64_t scale_block, ActBlock* out);
  // One group of kPackRows weight rows against m activation rows:
  //   tile[i * kPackRows + r] = sum_e W[r, e] * x_i[e]
  // group: the group's first block; x: m rows of kb blocks, x_stride blocks apart.
  void (*gemm_packed)(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                      int64_t x_stride, int64_t m, float* tile);

  // ---- float ----
  float (*dot_f32)(const float* x, const float* y, int64_t n);
  // out[r] = dot(x, w[r]) for 4 rows: x is loaded once for four weight rows.
  void (*dot4_f32)(const float* x, const float* w0, const float* w1, const float* w2,
                   const float* w3, int64_t n, float* out);
  // out[i * 4 + r] = dot(x[i], w[r]) for 4 activation rows and 4 weight rows.
  void (*dot4x4_f32)(const float* const* x, const float* const* w, int64_t n, float* out);
  float (*dot_f16)(const float* x, const uint16_t* w, int64_t n);
  float (*dot_bf16)(const float* x, const uint16_t* w, int64_t n);
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n);
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n);  // round to nearest even
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n);  // y += a * x
  void (*scale_f32)(float a, float* y, int64_t n);                 // y *= a
  void (*swiglu)(const float* gate, const float* up, float* out, int64_t n);
  // out = gelu_tanh(gate) * up (sdk::GeluTanh)
  void (*geglu)(const float* gate, const float* up, float* out, int64_t n);
  // dst[r * n + e] = element e of the row at cache + offsets[r], as f32, in a KV cache of
  // dtype (F16, BF16, F32).
  void (*cache_rows_to_f32)(pc_dtype_t dtype, const uint8_t* cache, const int64_t* offsets,
                            int64_t n_rows, int64_t n, float* dst);
  // y[i] = exp(x[i] - shift) for x[i] <= shift (y may alias x); returns the sum of y.
  float (*exp_sum)(const float* x, float shift, float* y, int64_t n);
  // out = x / sqrt(mean(x^2) + eps) * w (w may be null)
  void (*rms_norm)(const float* x, const float* w, float* out, int64_t n, float eps);

  // Float GEMM on transposed activations (prefill with F16/BF16/F32 weights), or nullptr where
  // the ISA has none (the ops then use dot4x4_f32). For j < nw (1..kGemmTRows), i < 32:
  //   acc[j * ldc + i] += sum_{e < n} w[j * ldw + e] * xt[e * ldx + i]
  // Each weight value is broadcast and multiplies 32 activation rows held in two vectors, so
  // one load feeds two FMAs and the accumulators stay in registers for the whole K-block.
  void (*gemm_t_f32)(const float* w, int64_t ldw, int64_t nw, const float* xt, int64_t ldx,
                     int64_t n, float* acc, int64_t ldc) = nullptr;

  // Float weights in panels (panel.h), or nullptr where the ISA has none (float weights then
  // stay in GGUF layout). One panel's K-block P of `dtype` (F16, BF16 or F32) against m
  // (1..kPanelTileRows) activation rows: for i < m, r < 32,
  //   acc[i * 32 + r] += sum_{e < k} x[i * ldx + e] * P[e * 32 + r]
  void (*gemm_panel)(pc_dtype_t dtype, const void* panel, int64_t k, const float* x,
                     int64_t ldx, int64_t m, float* acc) = nullptr;

  // Decode's packed GEMM, or nullptr where the ISA has none (gemm_packed with m = 1 then): one
  // activation row x (kb blocks) against n_streams (1..kMaxWeightStreams) groups, group s at
  // group + s * stream_stride, read block by block in lockstep:
  //   tile[s * kPackRows + r] = sum_e W_s[r, e] * x[e]
  // each group's sums exactly as gemm_packed computes them. One sequential read per core leaves
  // DRAM bandwidth unused (the hardware prefetcher follows each stream separately; Zen 5 VM, 2
  // threads, bench/membw.c: ~53 GB/s with one stream per thread, ~65 with two), so decode
  // walks several far-apart parts of a matrix at once (cpu_ops.cc, MatmulPacked:
  // OpContext::weight_streams runs per thread). prefetch: software prefetch a few cells ahead
  // of each stream, which some hosts need and others are slowed by (StreamsTuner decides).
  void (*gemm_packed_streams)(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                              int n_streams, int64_t kb, const ActBlock* x, float* tile,
                              bool prefetch) = nullptr;

  // cache_rows_to_f32, transposed: dst[e * ld + r] = element e of row r, for r < n_rows,
  // e < n. Attention decode's K rows, so that a GQA group's scores are one GEMM over positions.
  void (*cache_rows_to_f32_t)(pc_dtype_t dtype, const uint8_t* cache, const int64_t* offsets,
                              int64_t n_rows, int64_t n, float* dst, int64_t ld) = nullptr;
};

// Most groups one gemm_packed_streams call reads at once.
constexpr int kMaxWeightStreams = 4;

// Calls run.template operator()<NS>() with NS = n_streams (1..kMaxWeightStreams), so that the
// streams kernels size their accumulators at compile time (as ForEachRowTile does the rows).
template <typename Run>
inline void ForStreamCount(int n_streams, Run&& run) {
  switch (n_streams) {
    case 4: return run.template operator()<4>();
    case 3: return run.template operator()<3>();
    case 2: return run.template operator()<2>();
    default: return run.template operator()<1>();
  }
}

// x . row for a row of n F32, F16 or BF16 elements (`dtype`; other types read as F32): the
// table's dot for that type.
inline float DotFloatRow(const KernelTable& k, pc_dtype_t dtype, const float* x,
                         const uint8_t* row, int64_t n) {
  switch (dtype) {
    case PC_DTYPE_F16: return k.dot_f16(x, reinterpret_cast<const uint16_t*>(row), n);
    case PC_DTYPE_BF16: return k.dot_bf16(x, reinterpret_cast<const uint16_t*>(row), n);
    default: return k.dot_f32(x, reinterpret_cast<const float*>(row), n);
  }
}

// Activation rows of one gemm_panel call.
constexpr int64_t kPanelTileRows = 8;

// Weight rows (and activation columns) of one gemm_t_f32 call.
constexpr int64_t kGemmTRows = 8;
constexpr int64_t kGemmTCols = 32;

const KernelTable& ScalarKernels();
const KernelTable& Avx2Kernels();
const KernelTable& Avx512Kernels();

// What this CPU supports (CPUID).
bool CpuHasAvx2();
bool CpuHasAvx512();
// The best table for this CPU, or the named one ("scalar", "avx2", "avx512"); nullptr if the
// name is unknown or the CPU lacks the instructions.
const KernelTable* SelectKernels(const char* isa_name);

}  // namespace polychip::cpu
