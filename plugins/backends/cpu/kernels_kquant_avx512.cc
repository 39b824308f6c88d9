// The plane-layout packed GEMM (kquant.h: the K-quants, Q5_0 and Q5_1) with AVX-512 VNNI: 16 weight rows per vector, one
// vpdpbusd per 4 elements of all 16 rows. Each cell's quants are rebuilt from their bit planes
// with shifts and masks, its integer scales widened to f32 and multiplied by the super-block's
// f16 d (exact), once per cell for every activation row of the tile.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels.h"
#include "kquant.h"

namespace polychip::cpu::avx512 {
namespace {

inline __m512i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Field of B bits of element chunk J from a plane held in v[B] (kquant.h), moved to bit TO.
template <int B, int J, int TO>
[[gnu::always_inline]] inline __m512i Field(const __m512i* v) {
  constexpr int kFrom = B * (J / B);
  const __m512i x = v[J % B];
  const __m512i mask = _mm512_set1_epi8(static_cast<char>(((1 << B) - 1) << TO));
  if constexpr (kFrom > TO) return _mm512_and_si512(_mm512_srli_epi16(x, kFrom - TO), mask);
  if constexpr (kFrom < TO) return _mm512_and_si512(_mm512_slli_epi16(x, TO - kFrom), mask);
  return _mm512_and_si512(x, mask);
}

// w[j] = unsigned quants of elements 4j..4j+3 of the 16 rows.
// Forced inline, and the lambda inside it too: left to itself GCC calls one or the other out of
// line for the 5-bit formats (Q5_0, Q5_1, Q5_K), and the eight vectors go through the stack
// (LoadQuants<4, 1> alone had a fifth of a qwen2.5-0.5b Q4_K_M decode's samples, AVX-512).
template <int LOW, int HIGH>
[[gnu::always_inline]] inline void LoadQuants(const uint8_t* cell, __m512i* w) {
  __m512i lo[LOW], hi[HIGH > 0 ? HIGH : 1];
  for (int c = 0; c < LOW; ++c) lo[c] = _mm512_loadu_si512(cell + 64 * c);
  for (int c = 0; c < HIGH; ++c) hi[c] = _mm512_loadu_si512(cell + 64 * (LOW + c));
  [&]<int... J>(std::integer_sequence<int, J...>) __attribute__((always_inline)) {
    ((w[J] = Field<LOW, J, 0>(lo)), ...);
    if constexpr (HIGH > 0) ((w[J] = _mm512_or_si512(w[J], Field<HIGH, J, LOW>(hi))), ...);
  }(std::make_integer_sequence<int, 8>{});
}

constexpr int64_t kPrefetchCells = 12;  // as the other packed formats (kernels_avx512.cc)

// NS > 1 (decode, MT = 1): NS groups stream_stride bytes apart in lockstep, as the other packed
// formats' Tile (kernels_avx512.cc); tile[s * kPackRows + r] is group s's row r.
template <int MT, int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC, int NS = 1>
void Tile(int32_t offset, const uint8_t* group, int64_t kb, const ActBlock* x, int64_t x_stride,
          float* tile, bool prefetch, int64_t stream_stride = 0) {
  static_assert(NS == 1 || MT == 1, "several streams for a single activation row only");
  constexpr int kNsub = SUB16 ? 2 : 1;
  constexpr int64_t kPlane = 64 * (LOW + HIGH);
  // SC: K-quant super-blocks of 8 cells with integer sub-block scales; else one cell.
  constexpr int kCells = SC ? 8 : 1;
  constexpr int64_t kCell = kPlane + (SC ? 16 * kNsub * (MIN && !NIB ? 2 : 1) : 0);
  constexpr int64_t kHeader = MIN ? 64 : 32, kSuper = kHeader + kCells * kCell;
  __m512 acc[MT * NS];
  for (int i = 0; i < MT * NS; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < kb / kCells; ++sb) {
    // Unrolled, so each stream's accumulators stay in registers (GCC kept them on the stack).
#pragma GCC unroll 4
    for (int st = 0; st < NS; ++st) {
      const uint8_t* hdr = group + st * stream_stride + sb * kSuper;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hdr)));
      __m512 dmin = _mm512_setzero_ps();
      if constexpr (MIN)
        dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hdr + 32)));
      for (int c = 0; c < kCells; ++c) {
        const uint8_t* cell = hdr + kHeader + c * kCell;
        if (prefetch) {
          const char* ahead = reinterpret_cast<const char*>(cell + kPrefetchCells * kCell);
          for (int64_t off = 0; off < kCell; off += 64) _mm_prefetch(ahead + off, _MM_HINT_T0);
        }
        __m512i w[8];
        LoadQuants<LOW, HIGH>(cell, w);
        __m512 s[kNsub], mn[kNsub];
        for (int q = 0; q < kNsub && !SC; ++q) s[q] = d, mn[q] = dmin;
        for (int q = 0; q < kNsub && SC; ++q) {
          const __m128i raw =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(cell + kPlane + 16 * q));
          if constexpr (NIB) {
            const __m512i b = _mm512_cvtepu8_epi32(raw);
            s[q] =
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15))));
            mn[q] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)));
          } else {
            s[q] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw)));
            if constexpr (MIN) {
              const __m128i rm = _mm_loadu_si128(
                  reinterpret_cast<const __m128i*>(cell + kPlane + 16 * (kNsub + q)));
              mn[q] = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(rm)));
            }
          }
        }
        const int64_t b = sb * kCells + c;
        for (int i = 0; i < MT; ++i) {
          const ActBlock& a = x[i * x_stride + b];
          __m512& acc_i = acc[st * MT + i];
          const __m512 dx = _mm512_set1_ps(a.d);
          if constexpr (SUB16) {
            __m512i p0 = _mm512_set1_epi32(-offset * a.sum[0]);
            __m512i p1 = _mm512_set1_epi32(-offset * a.sum[1]);
            for (int q = 0; q < 4; ++q) {
              p0 = _mm512_dpbusd_epi32(p0, w[q], Bcast(a.q + 4 * q));
              p1 = _mm512_dpbusd_epi32(p1, w[q + 4], Bcast(a.q + 16 + 4 * q));
            }
            acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_mul_ps(s[0], dx), acc_i);
            acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_mul_ps(s[1], dx), acc_i);
            if constexpr (MIN) {
              acc_i = _mm512_fnmadd_ps(mn[0], _mm512_set1_ps(a.d * float(a.sum[0])), acc_i);
              acc_i = _mm512_fnmadd_ps(mn[1], _mm512_set1_ps(a.d * float(a.sum[1])), acc_i);
            }
          } else {
            // Four chains of two, so the eight vpdpbusd of a block overlap.
            __m512i p[4] = {_mm512_set1_epi32(-offset * (a.sum[0] + a.sum[1])),
                            _mm512_setzero_si512(), _mm512_setzero_si512(),
                            _mm512_setzero_si512()};
            for (int q = 0; q < 8; ++q)
              p[q % 4] = _mm512_dpbusd_epi32(p[q % 4], w[q], Bcast(a.q + 4 * q));
            const __m512i p0 = _mm512_add_epi32(p[0], p[2]), p1 = _mm512_add_epi32(p[1], p[3]);
            acc_i = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(p0, p1)),
                                    _mm512_mul_ps(s[0], dx), acc_i);
            if constexpr (MIN) {
              acc_i = _mm512_fnmadd_ps(mn[0], _mm512_set1_ps(a.d * float(a.sum[0] + a.sum[1])),
                                       acc_i);
            }
          }
        }
      }
    }
  }
  for (int i = 0; i < MT * NS; ++i) _mm512_storeu_ps(tile + i * kPackRows, acc[i]);
}

// Tiles of 16 activation rows, then 8, 4 and the last 1-3; only the first prefetches.
template <int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
void Gemm(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
          int64_t x_stride, int64_t m, float* tile) {
  ForEachRowTile(m, [&]<int MT>(int64_t i) {
    Tile<MT, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, kb, x + i * x_stride, x_stride,
                                             tile + i * kPackRows, i == 0);
  });
}

}  // namespace

void GemmPlanes(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  ForPlaneFormat(f, [&]<int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>() {
    Gemm<LOW, HIGH, SUB16, MIN, NIB, SC>(f, group, kb, x, x_stride, m, tile);
  });
}

void GemmPlanesStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                       int n_streams, int64_t kb, const ActBlock* x, float* tile, bool prefetch) {
  ForPlaneFormat(f, [&]<int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>() {
    ForStreamCount(n_streams, [&]<int NS>() {
      Tile<1, LOW, HIGH, SUB16, MIN, NIB, SC, NS>(f.offset, group, kb, x, kb, tile, prefetch,
                                                  stream_stride);
    });
  });
}

}  // namespace polychip::cpu::avx512
