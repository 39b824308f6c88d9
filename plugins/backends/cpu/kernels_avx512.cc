// AVX-512 kernel table (F, BW, VL, DQ, VNNI): integer dot products with vpdpbusd on the packed
// layout (packed.h), 16 weight rows per instruction, activations broadcast 4 bytes at a time.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c; only
// called when CPUID reports those (kernels_dispatch.cc).
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "kquant.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace avx512 {

#include "kernels_float.inc"

void QuantizeRow(const float* x, int64_t k, int64_t scale_block, ActBlock* out) {
  const __m512 sign = _mm512_set1_ps(-0.f);
  for (int64_t g = 0; g < k / scale_block; ++g) {
    const float* xg = x + g * scale_block;
    __m512 amax = _mm512_setzero_ps();
    for (int64_t i = 0; i < scale_block; i += 16)
      amax = _mm512_max_ps(amax, _mm512_andnot_ps(sign, _mm512_loadu_ps(xg + i)));
    float d, inv;
    ActScale(_mm512_reduce_max_ps(amax), scale_block, &d, &inv);
    const __m512 id = _mm512_set1_ps(inv);
    for (int64_t b = 0; b < scale_block / kBlock; ++b) {
      // cvtps rounds to nearest even under the default MXCSR, as nearbyint does.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + b * kBlock), id));
      const __m512i q1 =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + b * kBlock + 16), id));
      ActBlock& a = out[g * (scale_block / kBlock) + b];
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.q + 16), _mm512_cvtsepi32_epi8(q1));
      a.d = d;
      a.sum[0] = _mm512_reduce_add_epi32(q0);
      a.sum[1] = _mm512_reduce_add_epi32(q1);
    }
  }
}

inline __m512i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The IQ4 codebook as unsigned bytes (value + 128) in each 128-bit lane, for vpshufb.
inline __m512i CodebookLut() {
  alignas(16) uint8_t u[16];
  for (int i = 0; i < 16; ++i) u[i] = static_cast<uint8_t>(sdk::kIq4nlValues[i] + 128);
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(u)));
}

// How far ahead (in cells) the first tile of a group prefetches the weights. The hardware
// prefetcher alone leaves one core at ~5 GB/s on this access pattern (measured on Zen 5:
// 2-3x slower batched decode); 8-16 cells (2-5 KiB) ahead lets it stream at compute speed.
constexpr int64_t kPrefetchCells = 12;
// Q8_0's cells are twice as long (544 bytes): 12 cells is ~100 lines ahead into L1, and its
// decode streamed at ~0.8 of a plain read of the same buffers (the 4-bit formats ~0.9-1.0), so
// it prefetches only 4 cells ahead. A second prefetch into L2 24 cells ahead (session 8) cost
// more than it gave: the qwen2.5-0.5b output matrix (151936 x 896) streamed at 0.66-0.73 of a
// plain read with it and 0.87-0.94 without (session 9, configurations alternated within one
// process, Zen 5 VM, 2 threads).
constexpr int64_t kPrefetchCellsQ8 = 4;

// MT activation rows against one group: the group's weight vectors are loaded (and, for 4-bit,
// unpacked) once per block and reused for every row of the tile. With MT = 16 a batched decode
// step of 16 sequences reads each weight byte once, straight from DRAM, with `prefetch` set.
// LUT: the 4-bit quants are codebook indices (PackedFormat::codebook), looked up with one
// in-lane byte shuffle per vector.
//
// NS > 1 (decode, MT = 1): NS groups stream_stride bytes apart, block by block in lockstep, so
// each thread keeps NS weight streams in flight (KernelTable::gemm_packed_streams);
// tile[s * kPackRows + r] is group s's row r.
template <int MT, bool Q4, bool HALF, bool MIN, bool LUT = false, int NS = 1>
void Tile(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
          int64_t x_stride, float* tile, bool prefetch, int64_t stream_stride = 0) {
  static_assert(NS == 1 || MT == 1, "several streams for a single activation row only");
  const int64_t stride = f.block_bytes();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i lut = CodebookLut();
  __m512 acc[MT * NS];
  for (int i = 0; i < MT * NS; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    // Unrolled, so each stream's accumulators stay in registers (GCC kept them on the stack).
#pragma GCC unroll 4
    for (int st = 0; st < NS; ++st) {
      const uint8_t* cell = group + st * stream_stride + b * stride;
      if (prefetch) {
        // Past the end of the matrix this is harmless: prefetches do not fault.
        const char* ahead =
            reinterpret_cast<const char*>(cell + (Q4 ? kPrefetchCells : kPrefetchCellsQ8) * stride);
        for (int64_t off = 0; off < stride; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
      }
      __m512i w[8];
      if constexpr (Q4) {
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(cell + 64 * c);
          w[c] = _mm512_and_si512(v, low4);
          w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          if constexpr (LUT) {
            w[c] = _mm512_shuffle_epi8(lut, w[c]);
            w[c + 4] = _mm512_shuffle_epi8(lut, w[c + 4]);
          }
        }
      } else {
        for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(cell + 64 * c);
      }
      const uint16_t* sp = reinterpret_cast<const uint16_t*>(cell + (Q4 ? 256 : 512));
      const __m512 s0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp)));
      __m512 s1 = s0, mn = s0;
      if constexpr (HALF)
        s1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 16)));
      if constexpr (MIN)
        mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + 16)));
      for (int i = 0; i < MT; ++i) {
        const ActBlock& a = x[i * x_stride + b];
        __m512& acc_i = acc[st * MT + i];
        const __m512 dx = _mm512_set1_ps(a.d);
        if constexpr (HALF) {
          __m512i p0 = _mm512_set1_epi32(-f.offset * a.sum[0]);
          __m512i p1 = _mm512_set1_epi32(-f.offset * a.sum[1]);
          for (int c = 0; c < 4; ++c) {
            p0 = _mm512_dpbusd_epi32(p0, w[c], Bcast(a.q + 4 * c));
            p1 = _mm512_dpbusd_epi32(p1, w[c + 4], Bcast(a.q + 16 + 4 * c));
          }
          acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(s0, dx), acc_i);
          acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(s1, dx), acc_i);
        } else {
          // Two chains, so the eight dependent vpdpbusd of a block overlap.
          __m512i p0 = _mm512_set1_epi32(-f.offset * (a.sum[0] + a.sum[1]));
          __m512i p1 = _mm512_setzero_si512();
          for (int c = 0; c < 8; c += 2) {
            p0 = _mm512_dpbusd_epi32(p0, w[c], Bcast(a.q + 4 * c));
            p1 = _mm512_dpbusd_epi32(p1, w[c + 1], Bcast(a.q + 4 * c + 4));
          }
          acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)),
                                   _mm512_mul_ps(s0, dx), acc_i);
        }
        if constexpr (MIN) {
          acc_i = _mm512_fnmadd_ps(mn, _mm512_set1_ps(a.d * float(a.sum[0] + a.sum[1])), acc_i);
        }
      }
    }
  }
  for (int i = 0; i < MT * NS; ++i) _mm512_storeu_ps(tile + i * kPackRows, acc[i]);
}

// Tiles of 16 rows, then 8, 4 and the last 1-3; only the first tile prefetches (the group is
// in L1/L2 for the others).
template <bool Q4, bool HALF, bool MIN, bool LUT = false>
void GemmFormat(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  ForEachRowTile(m, [&]<int MT>(int64_t i) {
    Tile<MT, Q4, HALF, MIN, LUT>(f, group, kb, x + i * x_stride, x_stride, tile + i * kPackRows,
                                 i == 0);
  });
}

// Calls run.template operator()<Q4, HALF, MIN, LUT>() for f, a packed format outside the
// plane layout.
template <typename Run>
void ForPackedFormat(const PackedFormat& f, Run&& run) {
  if (f.q4) {
    if (f.codebook) return run.template operator()<true, false, false, true>();
    if (f.has_min) return run.template operator()<true, false, true, false>();
    return run.template operator()<true, false, false, false>();
  }
  if (f.half_scales) return run.template operator()<false, true, false, false>();
  return run.template operator()<false, false, false, false>();
}

void GemmPacked(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  if (f.planes) return GemmPlanes(f, group, kb, x, x_stride, m, tile);  // kquant.h
  ForPackedFormat(f, [&]<bool Q4, bool HALF, bool MIN, bool LUT>() {
    GemmFormat<Q4, HALF, MIN, LUT>(f, group, kb, x, x_stride, m, tile);
  });
}

void GemmPackedStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                       int n_streams, int64_t kb, const ActBlock* x, float* tile, bool prefetch) {
  if (f.planes)
    return GemmPlanesStreams(f, group, stream_stride, n_streams, kb, x, tile, prefetch);
  ForPackedFormat(f, [&]<bool Q4, bool HALF, bool MIN, bool LUT>() {
    ForStreamCount(n_streams, [&]<int NS>() {
      Tile<1, Q4, HALF, MIN, LUT, NS>(f, group, kb, x, kb, tile, prefetch, stream_stride);
    });
  });
}

float DotF16(const float* x, const uint16_t* w, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
    const __m512 w1 =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16)));
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), w0, a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), w1, a1);
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * _cvtsh_ss(w[i]);
  return s;
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i,
                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i))));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

// 16 elements from e of a cache row of dtype (F16, BF16, F32) as f32.
inline __m512 LoadCacheRow16(pc_dtype_t dtype, const uint8_t* row, int64_t e) {
  if (dtype == PC_DTYPE_F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * e)));
  if (dtype == PC_DTYPE_BF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * e));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + e);
}

// Transposes the 16 x 16 floats in r (row i in r[i]) in place: three rounds of in-lane
// unpacks and 128-bit lane shuffles.
inline void Transpose16(__m512* r) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // lane L: rows 2i, 2i+1 of columns 4L, 4L+1 (and 4L+2, 4L+3)
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  const auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
  for (int i = 0; i < 4; ++i) {  // u[4i + k], lane L: rows 4i..4i+3 of column 4L + k
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
  }
  for (int k = 0; k < 4; ++k) {  // column 4L + k: lane L of u[k], u[4 + k], u[8 + k], u[12 + k]
    const __m512 ab_lo = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44);
    const __m512 ab_hi = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
    const __m512 cd_lo = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44);
    const __m512 cd_hi = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0x88);
    r[4 + k] = _mm512_shuffle_f32x4(ab_lo, cd_lo, 0xDD);
    r[8 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(ab_hi, cd_hi, 0xDD);
  }
}

// KernelTable::cache_rows_to_f32_t: 16 x 16 tiles converted in registers and transposed; the
// ragged rows and elements one at a time.
void CacheRowsToF32TTiles(pc_dtype_t dtype, const uint8_t* cache, const int64_t* offsets,
                     int64_t n_rows, int64_t n, float* dst, int64_t ld) {
  if (dtype != PC_DTYPE_F16 && dtype != PC_DTYPE_BF16 && dtype != PC_DTYPE_F32) {
    return CacheRowsToF32T(dtype, cache, offsets, n_rows, n, dst, ld);  // the block types
  }
  const auto scalar = [&](int64_t r, int64_t e) {
    const uint8_t* row = cache + offsets[r];
    const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
    dst[e * ld + r] = dtype == PC_DTYPE_F16    ? _cvtsh_ss(h[e])
                      : dtype == PC_DTYPE_BF16 ? std::bit_cast<float>(uint32_t{h[e]} << 16)
                                               : reinterpret_cast<const float*>(row)[e];
  };
  int64_t r0 = 0;
  for (; r0 + 16 <= n_rows; r0 += 16) {
    int64_t e0 = 0;
    for (; e0 + 16 <= n; e0 += 16) {
      __m512 v[16];
      for (int r = 0; r < 16; ++r) v[r] = LoadCacheRow16(dtype, cache + offsets[r0 + r], e0);
      Transpose16(v);
      for (int e = 0; e < 16; ++e) _mm512_storeu_ps(dst + (e0 + e) * ld + r0, v[e]);
    }
    for (; e0 < n; ++e0)
      for (int64_t r = r0; r < r0 + 16; ++r) scalar(r, e0);
  }
  for (; r0 < n_rows; ++r0)
    for (int64_t e = 0; e < n; ++e) scalar(r0, e);
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

template <int NW>
void GemmTRows(const float* w, int64_t ldw, const float* xt, int64_t ldx, int64_t n, float* acc,
               int64_t ldc) {
  __m512 c0[NW], c1[NW];
  for (int j = 0; j < NW; ++j) {
    c0[j] = _mm512_loadu_ps(acc + j * ldc);
    c1[j] = _mm512_loadu_ps(acc + j * ldc + 16);
  }
  for (int64_t e = 0; e < n; ++e) {
    const __m512 x0 = _mm512_loadu_ps(xt + e * ldx);
    const __m512 x1 = _mm512_loadu_ps(xt + e * ldx + 16);
    for (int j = 0; j < NW; ++j) {
      const __m512 b = _mm512_set1_ps(w[j * ldw + e]);
      c0[j] = _mm512_fmadd_ps(b, x0, c0[j]);
      c1[j] = _mm512_fmadd_ps(b, x1, c1[j]);
    }
  }
  for (int j = 0; j < NW; ++j) {
    _mm512_storeu_ps(acc + j * ldc, c0[j]);
    _mm512_storeu_ps(acc + j * ldc + 16, c1[j]);
  }
}

void GemmTF32(const float* w, int64_t ldw, int64_t nw, const float* xt, int64_t ldx, int64_t n,
              float* acc, int64_t ldc) {
  static_assert(kGemmTRows == 8 && kGemmTCols == 32);
  switch (nw) {
    case 8: return GemmTRows<8>(w, ldw, xt, ldx, n, acc, ldc);
    case 7: return GemmTRows<7>(w, ldw, xt, ldx, n, acc, ldc);
    case 6: return GemmTRows<6>(w, ldw, xt, ldx, n, acc, ldc);
    case 5: return GemmTRows<5>(w, ldw, xt, ldx, n, acc, ldc);
    case 4: return GemmTRows<4>(w, ldw, xt, ldx, n, acc, ldc);
    case 3: return GemmTRows<3>(w, ldw, xt, ldx, n, acc, ldc);
    case 2: return GemmTRows<2>(w, ldw, xt, ldx, n, acc, ldc);
    case 1: return GemmTRows<1>(w, ldw, xt, ldx, n, acc, ldc);
    default: return;
  }
}

// One column of a panel (32 rows' values of one element index) as two f32 vectors.
template <pc_dtype_t DT>
inline void LoadPanelColumn(const uint8_t* p, __m512* w0, __m512* w1) {
  if constexpr (DT == PC_DTYPE_F16) {
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  } else if constexpr (DT == PC_DTYPE_BF16) {
    const __m512i v0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i v1 =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16));
    *w1 = _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16));
  } else {
    *w0 = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    *w1 = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16);
  }
}

// MT activation rows x the panel's 32 rows, 2 * MT accumulators: each column is loaded (and
// converted) once and feeds 2 * MT FMAs with broadcast activations.
template <int MT, pc_dtype_t DT>
void PanelTile(const uint8_t* panel, int64_t k, const float* x, int64_t ldx, float* acc) {
  constexpr int64_t kColBytes = 32 * (DT == PC_DTYPE_F32 ? 4 : 2);
  __m512 c0[MT], c1[MT];
  for (int i = 0; i < MT; ++i) {
    c0[i] = _mm512_loadu_ps(acc + i * 32);
    c1[i] = _mm512_loadu_ps(acc + i * 32 + 16);
  }
  int64_t e = 0;
  if constexpr (MT == 1) {
    // Decode: a second pair of accumulators so consecutive FMAs do not wait on each other.
    __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
    for (; e + 2 <= k; e += 2) {
      __m512 w0, w1, v0, v1;
      LoadPanelColumn<DT>(panel + e * kColBytes, &w0, &w1);
      LoadPanelColumn<DT>(panel + (e + 1) * kColBytes, &v0, &v1);
      const __m512 b = _mm512_set1_ps(x[e]), b1 = _mm512_set1_ps(x[e + 1]);
      c0[0] = _mm512_fmadd_ps(b, w0, c0[0]);
      c1[0] = _mm512_fmadd_ps(b, w1, c1[0]);
      d0 = _mm512_fmadd_ps(b1, v0, d0);
      d1 = _mm512_fmadd_ps(b1, v1, d1);
    }
    c0[0] = _mm512_add_ps(c0[0], d0);
    c1[0] = _mm512_add_ps(c1[0], d1);
  }
  for (; e < k; ++e) {
    __m512 w0, w1;
    LoadPanelColumn<DT>(panel + e * kColBytes, &w0, &w1);
    for (int i = 0; i < MT; ++i) {
      const __m512 b = _mm512_set1_ps(x[i * ldx + e]);
      c0[i] = _mm512_fmadd_ps(b, w0, c0[i]);
      c1[i] = _mm512_fmadd_ps(b, w1, c1[i]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    _mm512_storeu_ps(acc + i * 32, c0[i]);
    _mm512_storeu_ps(acc + i * 32 + 16, c1[i]);
  }
}

template <pc_dtype_t DT>
void GemmPanelOf(const uint8_t* panel, int64_t k, const float* x, int64_t ldx, int64_t m,
                 float* acc) {
  static_assert(kPanelTileRows == 8);
  switch (m) {
    case 8: return PanelTile<8, DT>(panel, k, x, ldx, acc);
    case 7: return PanelTile<7, DT>(panel, k, x, ldx, acc);
    case 6: return PanelTile<6, DT>(panel, k, x, ldx, acc);
    case 5: return PanelTile<5, DT>(panel, k, x, ldx, acc);
    case 4: return PanelTile<4, DT>(panel, k, x, ldx, acc);
    case 3: return PanelTile<3, DT>(panel, k, x, ldx, acc);
    case 2: return PanelTile<2, DT>(panel, k, x, ldx, acc);
    case 1: return PanelTile<1, DT>(panel, k, x, ldx, acc);
    default: return;
  }
}

void GemmPanel(pc_dtype_t dtype, const void* panel, int64_t k, const float* x, int64_t ldx,
               int64_t m, float* acc) {
  const auto* p = static_cast<const uint8_t*>(panel);
  switch (dtype) {
    case PC_DTYPE_F16: return GemmPanelOf<PC_DTYPE_F16>(p, k, x, ldx, m, acc);
    case PC_DTYPE_BF16: return GemmPanelOf<PC_DTYPE_BF16>(p, k, x, ldx, m, acc);
    default: return GemmPanelOf<PC_DTYPE_F32>(p, k, x, ldx, m, acc);
  }
}

}  // namespace avx512

const KernelTable& Avx512Kernels() {
  static const KernelTable t = {
      "avx512",          Isa::kAvx512,       avx512::QuantizeRow, avx512::GemmPacked,
      avx512::DotF32,    avx512::Dot4F32, avx512::Dot4x4F32,    avx512::DotF16,      avx512::DotBf16,
      avx512::F16ToF32Row, avx512::Bf16ToF32Row, avx512::F32ToF16Row, avx512::AxpyF32,
      avx512::ScaleF32,
      avx512::Swiglu,    avx512::Geglu,    avx512::CacheRowsToF32, avx512::ExpSum,
      avx512::RmsNorm,   avx512::GemmTF32,
      avx512::GemmPanel, avx512::GemmPackedStreams, avx512::CacheRowsToF32TTiles,
  };
  return t;
}

}  // namespace polychip::cpu
