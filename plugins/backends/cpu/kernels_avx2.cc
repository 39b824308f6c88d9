// AVX2 kernel table (AVX2, FMA, F16C): the packed layout with 256-bit vectors, 8 weight rows
// per vector (a 16-row group is two halves). Without VNNI, u8 x s8 products go through
// vpmaddubsw (saturating 16-bit pair sums) then vpmaddwd: safe for 4- and 6-bit quants; 8-bit
// quants (offset 128) are turned back into signed bytes and multiplied with the sign trick.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "kquant.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace avx2 {

#include "kernels_float.inc"

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int32_t HSumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

void QuantizeRow(const float* x, int64_t k, int64_t scale_block, ActBlock* out) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t g = 0; g < k / scale_block; ++g) {
    const float* xg = x + g * scale_block;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = 0; i < scale_block; i += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xg + i)));
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    float d, inv;
    ActScale(_mm_cvtss_f32(m), scale_block, &d, &inv);
    const __m256 id = _mm256_set1_ps(inv);
    for (int64_t b = 0; b < scale_block / kBlock; ++b) {
      __m256i q[4];
      for (int j = 0; j < 4; ++j)
        q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + b * kBlock + 8 * j), id));
      ActBlock& a = out[g * (scale_block / kBlock) + b];
      a.d = d;
      a.sum[0] = HSumI(_mm256_add_epi32(q[0], q[1]));
      a.sum[1] = HSumI(_mm256_add_epi32(q[2], q[3]));
      // Pack 32 int32 to 32 int8 (packs interleave 128-bit lanes; the permute restores order).
      const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
      const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
      __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a.q), p8);
    }
  }
}

inline __m256i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// u8 weights x s8 activations, 4 per int32 lane.
template <bool SIGNED8>
inline __m256i Dot4(__m256i w, __m256i x) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (SIGNED8) {
    const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));  // u - 128
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(ws, ws), _mm256_sign_epi8(x, ws)),
                             ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
  }
}

// How far ahead (in cells) the decode kernel (TileStreams) prefetches: as the AVX-512 kernels
// (kernels_avx512.cc), 12 cells for 4-bit formats and 4 for Q8_0's cells of twice the size.
constexpr int64_t kPrefetchCells = 12;
constexpr int64_t kPrefetchCellsQ8 = 4;

// The IQ4 codebook as unsigned bytes (value + 128) in each 128-bit lane, for vpshufb.
inline __m256i CodebookLut() {
  alignas(16) uint8_t u[16];
  for (int i = 0; i < 16; ++i) u[i] = static_cast<uint8_t>(sdk::kIq4nlValues[i] + 128);
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(u)));
}

// The weight vectors and scales of half h (rows 8h .. 8h+7) of one cell. LUT: the 4-bit quants
// are codebook indices (PackedFormat::codebook), looked up in `lut` (CodebookLut) with one byte
// shuffle per vector into offset-128 bytes, which S8 then multiplies as signed.
template <bool Q4, bool HALF, bool MIN, bool LUT>
[[gnu::always_inline]] inline void LoadCellHalf(const uint8_t* cell, int h, __m256i lut,
                                                __m256i* w, __m256* s0, __m256* s1, __m256* mn) {
  if constexpr (Q4) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i v =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 64 * c + 32 * h));
      w[c] = _mm256_and_si256(v, low4);
      w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
      if constexpr (LUT) {
        w[c] = _mm256_shuffle_epi8(lut, w[c]);
        w[c + 4] = _mm256_shuffle_epi8(lut, w[c + 4]);
      }
    }
  } else {
    for (int c = 0; c < 8; ++c)
      w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 64 * c + 32 * h));
  }
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(cell + (Q4 ? 256 : 512)) + 8 * h;
  *s0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp)));
  *s1 = *mn = *s0;
  if constexpr (HALF)
    *s1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 16)));
  if constexpr (MIN)
    *mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sp + 16)));
}

// acc += one cell half's 8 dot products with activation block a: the arithmetic gemm_packed and
// gemm_packed_streams share, so both give the same sums. 8-bit quants with offset 128 (S8) are
// multiplied as signed bytes: no offset correction.
template <bool HALF, bool MIN, bool S8>
[[gnu::always_inline]] inline void AccumulateCellHalf(const __m256i* w, __m256 s0, __m256 s1,
                                                      __m256 mn, const ActBlock& a,
                                                      int32_t offset, __m256* acc) {
  if constexpr (S8) offset = 0;
  const __m256 dx = _mm256_set1_ps(a.d);
  __m256i p0 = _mm256_set1_epi32(-offset * a.sum[0]);
  __m256i p1 = _mm256_set1_epi32(-offset * a.sum[1]);
  for (int c = 0; c < 4; ++c) {
    p0 = _mm256_add_epi32(p0, Dot4<S8>(w[c], Bcast(a.q + 4 * c)));
    p1 = _mm256_add_epi32(p1, Dot4<S8>(w[c + 4], Bcast(a.q + 16 + 4 * c)));
  }
  if constexpr (HALF) {
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(s0, dx), *acc);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(s1, dx), *acc);
  } else {
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), _mm256_mul_ps(s0, dx),
                           *acc);
  }
  if constexpr (MIN)
    *acc = _mm256_fnmadd_ps(mn, _mm256_set1_ps(a.d * float(a.sum[0] + a.sum[1])), *acc);
}

// MT activation rows against one group, a half at a time: the half's weight vectors are
// loaded once per block and reused for every row of the tile.
template <int MT, bool Q4, bool HALF, bool MIN, bool S8, bool LUT = false>
void Tile(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
          int64_t x_stride, float* tile) {
  const int64_t stride = f.block_bytes();
  const __m256i lut = CodebookLut();
  for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h+7
    __m256 acc[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps();
    const uint8_t* cell = group;
    for (int64_t b = 0; b < kb; ++b, cell += stride) {
      __m256i w[8];
      __m256 s0, s1, mn;
      LoadCellHalf<Q4, HALF, MIN, LUT>(cell, h, lut, w, &s0, &s1, &mn);
      for (int i = 0; i < MT; ++i)
        AccumulateCellHalf<HALF, MIN, S8>(w, s0, s1, mn, x[i * x_stride + b], f.offset, &acc[i]);
    }
    for (int i = 0; i < MT; ++i) _mm256_storeu_ps(tile + i * kPackRows + 8 * h, acc[i]);
  }
}

// Decode (one activation row): NS groups stream_stride bytes apart, block by block in lockstep
// and both halves of each cell in one pass, prefetching kPrefetchCells ahead where `prefetch`
// (the AVX-512 kernel's scheme: KernelTable::gemm_packed_streams); tile[s * kPackRows + r] is
// group s's row r.
template <int NS, bool Q4, bool HALF, bool MIN, bool S8, bool LUT = false>
void TileStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride, int64_t kb,
                 const ActBlock* x, float* tile, bool prefetch) {
  const int64_t stride = f.block_bytes();
  const int64_t ahead = (Q4 ? kPrefetchCells : kPrefetchCellsQ8) * stride;
  const __m256i lut = CodebookLut();
  __m256 acc[2 * NS];
  for (int i = 0; i < 2 * NS; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < kb; ++b) {
    for (int st = 0; st < NS; ++st) {
      const uint8_t* cell = group + st * stream_stride + b * stride;
      // Past the end of the matrix this is harmless: prefetches do not fault.
      for (int64_t off = 0; prefetch && off < stride; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(cell + ahead + off), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        __m256i w[8];
        __m256 s0, s1, mn;
        LoadCellHalf<Q4, HALF, MIN, LUT>(cell, h, lut, w, &s0, &s1, &mn);
        AccumulateCellHalf<HALF, MIN, S8>(w, s0, s1, mn, x[b], f.offset, &acc[2 * st + h]);
      }
    }
  }
  for (int st = 0; st < NS; ++st)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(tile + st * kPackRows + 8 * h, acc[2 * st + h]);
}

template <bool Q4, bool HALF, bool MIN, bool S8 = false, bool LUT = false>
void GemmFormat(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    Tile<4, Q4, HALF, MIN, S8, LUT>(f, group, kb, x + i * x_stride, x_stride, tile + i * kPackRows);
  const ActBlock* xr = x + i * x_stride;
  float* tr = tile + i * kPackRows;
  switch (m - i) {
    case 3: Tile<3, Q4, HALF, MIN, S8, LUT>(f, group, kb, xr, x_stride, tr); break;
    case 2: Tile<2, Q4, HALF, MIN, S8, LUT>(f, group, kb, xr, x_stride, tr); break;
    case 1: Tile<1, Q4, HALF, MIN, S8, LUT>(f, group, kb, xr, x_stride, tr); break;
    default: break;
  }
}

// Calls run.template operator()<Q4, HALF, MIN, S8, LUT>() for f, a packed format outside
// the plane layout.
template <typename Run>
void ForPackedFormat(const PackedFormat& f, Run&& run) {
  if (f.q4) {
    if (f.codebook)  // offset-128 bytes after the lookup: the signed 8-bit product
      return run.template operator()<true, false, false, true, true>();
    if (f.has_min) return run.template operator()<true, false, true, false, false>();
    return run.template operator()<true, false, false, false, false>();
  }
  if (f.half_scales) return run.template operator()<false, true, false, false, false>();
  if (f.offset == 128) return run.template operator()<false, false, false, true, false>();
  return run.template operator()<false, false, false, false, false>();
}

void GemmPacked(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  if (f.planes) return GemmPlanes(f, group, kb, x, x_stride, m, tile);  // kquant.h
  ForPackedFormat(f, [&]<bool Q4, bool HALF, bool MIN, bool S8, bool LUT>() {
    GemmFormat<Q4, HALF, MIN, S8, LUT>(f, group, kb, x, x_stride, m, tile);
  });
}

void GemmPackedStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                       int n_streams, int64_t kb, const ActBlock* x, float* tile, bool prefetch) {
  if (f.planes)
    return GemmPlanesStreams(f, group, stream_stride, n_streams, kb, x, tile, prefetch);
  ForPackedFormat(f, [&]<bool Q4, bool HALF, bool MIN, bool S8, bool LUT>() {
    ForStreamCount(n_streams, [&]<int NS>() {
      TileStreams<NS, Q4, HALF, MIN, S8, LUT>(f, group, stream_stride, kb, x, tile, prefetch);
    });
  });
}

float DotF16(const float* x, const uint16_t* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), w0, a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), w1, a1);
  }
  float s = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * _cvtsh_ss(w[i]);
  return s;
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  for (; i < n; ++i) y[i] = _cvtsh_ss(x[i]);
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

// One column of a panel (32 rows' values of one element index) as four f32 vectors.
template <pc_dtype_t DT>
inline void LoadPanelColumn(const uint8_t* p, __m256* w) {
  for (int q = 0; q < 4; ++q) {
    if constexpr (DT == PC_DTYPE_F16) {
      w[q] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * q)));
    } else if constexpr (DT == PC_DTYPE_BF16) {
      const __m256i v =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * q)));
      w[q] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    } else {
      w[q] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * q);
    }
  }
}

// MT (1 or 2) activation rows x the panel's 32 rows: 4 * MT accumulators, 4 column vectors
// and a broadcast fit the 16 ymm registers.
template <int MT, pc_dtype_t DT>
void PanelTile(const uint8_t* panel, int64_t k, const float* x, int64_t ldx, float* acc) {
  constexpr int64_t kColBytes = 32 * (DT == PC_DTYPE_F32 ? 4 : 2);
  __m256 c[MT][4];
  for (int i = 0; i < MT; ++i)
    for (int q = 0; q < 4; ++q) c[i][q] = _mm256_loadu_ps(acc + i * 32 + 8 * q);
  for (int64_t e = 0; e < k; ++e) {
    __m256 w[4];
    LoadPanelColumn<DT>(panel + e * kColBytes, w);
    for (int i = 0; i < MT; ++i) {
      const __m256 b = _mm256_broadcast_ss(x + i * ldx + e);
      for (int q = 0; q < 4; ++q) c[i][q] = _mm256_fmadd_ps(b, w[q], c[i][q]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int q = 0; q < 4; ++q) _mm256_storeu_ps(acc + i * 32 + 8 * q, c[i][q]);
}

// MT (up to 6) activation rows x one half of the panel (16 rows, `half` 0 or 1): 2 * MT
// accumulators, 2 column vectors and a broadcast fit the 16 ymm registers. Each weight is
// converted once per half pass instead of once per pair of activation rows, so a verification
// step's 3-8 rows cost about what 2 cost (speculative decoding: docs/speculative-decoding.md).
// Every output is the same chain of FMAs over e as in PanelTile, so the sums are bit-identical
// to decode's whatever the row count.
template <int MT, pc_dtype_t DT>
void HalfPanelTile(const uint8_t* panel, int half, int64_t k, const float* x, int64_t ldx,
                   float* acc) {
  constexpr int64_t kColBytes = 32 * (DT == PC_DTYPE_F32 ? 4 : 2);
  constexpr int64_t kVecBytes = kColBytes / 4;
  const uint8_t* p = panel + half * 2 * kVecBytes;
  float* a = acc + 16 * half;
  // The loops over MT are unrolled on request: otherwise GCC (12) kept the accumulators in
  // registers but also stored them to the stack on every iteration.
  __m256 c0[MT], c1[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    c0[i] = _mm256_loadu_ps(a + i * 32);
    c1[i] = _mm256_loadu_ps(a + i * 32 + 8);
  }
  for (int64_t e = 0; e < k; ++e) {
    const uint8_t* col = p + e * kColBytes;
    __m256 w0, w1;
    if constexpr (DT == PC_DTYPE_F16) {
      w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
      w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col + kVecBytes)));
    } else if constexpr (DT == PC_DTYPE_BF16) {
      const __m256i v0 =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(col)));
      const __m256i v1 = _mm256_cvtepu16_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(col + kVecBytes)));
      w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      w1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    } else {
      w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(col));
      w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(col + kVecBytes));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m256 b = _mm256_broadcast_ss(x + i * ldx + e);
      c0[i] = _mm256_fmadd_ps(b, w0, c0[i]);
      c1[i] = _mm256_fmadd_ps(b, w1, c1[i]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    _mm256_storeu_ps(a + i * 32, c0[i]);
    _mm256_storeu_ps(a + i * 32 + 8, c1[i]);
  }
}

// MT (up to 6) activation rows x the whole panel, as two half passes.
template <int MT, pc_dtype_t DT>
void PanelTileByHalves(const uint8_t* panel, int64_t k, const float* x, int64_t ldx,
                       float* acc) {
  HalfPanelTile<MT, DT>(panel, 0, k, x, ldx, acc);
  HalfPanelTile<MT, DT>(panel, 1, k, x, ldx, acc);
}

template <pc_dtype_t DT>
void GemmPanelOf(const uint8_t* panel, int64_t k, const float* x, int64_t ldx, int64_t m,
                 float* acc) {
  static_assert(kPanelTileRows == 8);
  switch (m) {
    case 1: return PanelTile<1, DT>(panel, k, x, ldx, acc);
    case 2: return PanelTile<2, DT>(panel, k, x, ldx, acc);
    case 3: return PanelTileByHalves<3, DT>(panel, k, x, ldx, acc);
    case 4: return PanelTileByHalves<4, DT>(panel, k, x, ldx, acc);
    case 5: return PanelTileByHalves<5, DT>(panel, k, x, ldx, acc);
    case 6: return PanelTileByHalves<6, DT>(panel, k, x, ldx, acc);
    case 7:
      PanelTileByHalves<4, DT>(panel, k, x, ldx, acc);
      return PanelTileByHalves<3, DT>(panel, k, x + 4 * ldx, ldx, acc + 4 * 32);
    case 8:
      PanelTileByHalves<4, DT>(panel, k, x, ldx, acc);
      return PanelTileByHalves<4, DT>(panel, k, x + 4 * ldx, ldx, acc + 4 * 32);
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

}  // namespace avx2

const KernelTable& Avx2Kernels() {
  static const KernelTable t = {
      "avx2",          Isa::kAvx2,       avx2::QuantizeRow, avx2::GemmPacked,
      avx2::DotF32,    avx2::Dot4F32, avx2::Dot4x4F32,    avx2::DotF16,      avx2::DotBf16,
      avx2::F16ToF32Row, avx2::Bf16ToF32Row, avx2::F32ToF16Row, avx2::AxpyF32, avx2::ScaleF32,
      avx2::Swiglu,    avx2::Geglu,    avx2::CacheRowsToF32, avx2::ExpSum,    avx2::RmsNorm,
      /*gemm_t_f32=*/nullptr, avx2::GemmPanel, avx2::GemmPackedStreams,
      avx2::CacheRowsToF32T,
  };
  return t;
}

}  // namespace polychip::cpu
