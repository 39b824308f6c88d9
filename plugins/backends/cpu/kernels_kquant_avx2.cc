// The plane-layout packed GEMM (kquant.h: the K-quants, Q5_0 and Q5_1) with AVX2: 8 weight rows
// per vector (a 16-row group is two halves). Without VNNI the u8 x s8 products go through
// vpmaddubsw: each 16-bit lane holds two products, so the pairs of as many 4-element chunks as
// cannot overflow (quants below 2^bits times |activation| <= 127) are summed in 16 bits before
// one vpmaddwd widens them.
#include <immintrin.h>

#include <cstring>
#include <utility>

#include "kernels.h"
#include "kquant.h"

namespace polychip::cpu::avx2 {
namespace {

inline __m256i Bcast(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <int B, int J, int TO>
[[gnu::always_inline]] inline __m256i Field(const __m256i* v) {
  constexpr int kFrom = B * (J / B);
  const __m256i x = v[J % B];
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(((1 << B) - 1) << TO));
  if constexpr (kFrom > TO) return _mm256_and_si256(_mm256_srli_epi16(x, kFrom - TO), mask);
  if constexpr (kFrom < TO) return _mm256_and_si256(_mm256_slli_epi16(x, TO - kFrom), mask);
  return _mm256_and_si256(x, mask);
}

// w[j] = unsigned quants of elements 4j..4j+3 of the 8 rows of half `cell` points into.
// Forced inline, and the lambda inside it too: left to itself GCC calls one or the other out of
// line for the 5-bit formats (Q5_0, Q5_1, Q5_K), and the eight vectors go through the stack
// (LoadQuants<4, 1> alone had a fifth of a qwen2.5-0.5b Q4_K_M decode's samples, AVX-512).
template <int LOW, int HIGH>
[[gnu::always_inline]] inline void LoadQuants(const uint8_t* cell, __m256i* w) {
  __m256i lo[LOW], hi[HIGH > 0 ? HIGH : 1];
  for (int c = 0; c < LOW; ++c)
    lo[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 64 * c));
  for (int c = 0; c < HIGH; ++c)
    hi[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cell + 64 * (LOW + c)));
  [&]<int... J>(std::integer_sequence<int, J...>) __attribute__((always_inline)) {
    ((w[J] = Field<LOW, J, 0>(lo)), ...);
    if constexpr (HIGH > 0) ((w[J] = _mm256_or_si256(w[J], Field<HIGH, J, LOW>(hi))), ...);
  }(std::make_integer_sequence<int, 8>{});
}

// sum over N chunks of w[c] . q[4c..4c+3] per 32-bit lane, in 16-bit groups of G chunks.
template <int N, int G>
inline __m256i DotChunks(__m256i init, const __m256i* w, const int8_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int g = 0; g < N; g += G) {
    __m256i s = _mm256_maddubs_epi16(w[g], Bcast(q + 4 * g));
    for (int c = 1; c < G; ++c)
      s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[g + c], Bcast(q + 4 * (g + c))));
    init = _mm256_add_epi32(init, _mm256_madd_epi16(s, ones));
  }
  return init;
}

// The scales (and mins) of half h (rows 8h .. 8h+7) of one cell, per sub-block: the header's d
// (and dmin) times the cell's integer sub-block scales (and mins) with SC, else d and dmin.
template <int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
[[gnu::always_inline]] inline void CellHalfScales(const uint8_t* cell, int h, __m256 d,
                                                  __m256 dmin, __m256* s, __m256* mn) {
  constexpr int kNsub = SUB16 ? 2 : 1;
  constexpr int64_t kPlane = 64 * (LOW + HIGH);
  for (int q = 0; q < kNsub && !SC; ++q) s[q] = d, mn[q] = dmin;
  for (int q = 0; q < kNsub && SC; ++q) {
    const __m128i raw =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(cell + kPlane + 16 * q + 8 * h));
    if constexpr (NIB) {
      const __m256i b = _mm256_cvtepu8_epi32(raw);
      s[q] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15))));
      mn[q] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)));
    } else {
      s[q] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw)));
      if constexpr (MIN) {
        const __m128i rm = _mm_loadl_epi64(
            reinterpret_cast<const __m128i*>(cell + kPlane + 16 * (kNsub + q) + 8 * h));
        mn[q] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(rm)));
      }
    }
  }
}

// acc += one cell half's 8 dot products with activation block a: the arithmetic gemm_packed and
// gemm_packed_streams share, so both give the same sums.
template <int LOW, int HIGH, bool SUB16, bool MIN>
[[gnu::always_inline]] inline void AccumulateCellHalf(const __m256i* w, const __m256* s,
                                                      const __m256* mn, const ActBlock& a,
                                                      int32_t offset, __m256* acc) {
  constexpr int kBits = LOW + HIGH;
  // 2 * (2^bits - 1) * 127 per chunk and 16-bit lane must stay below 2^15 for G chunks.
  constexpr int kG = kBits <= 4 ? 8 : kBits == 5 ? 4 : 2;
  const __m256 dx = _mm256_set1_ps(a.d);
  if constexpr (SUB16) {
    const __m256i p0 =
        DotChunks<4, (kG < 4 ? kG : 4)>(_mm256_set1_epi32(-offset * a.sum[0]), w, a.q);
    const __m256i p1 =
        DotChunks<4, (kG < 4 ? kG : 4)>(_mm256_set1_epi32(-offset * a.sum[1]), w + 4, a.q + 16);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(s[0], dx), *acc);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(s[1], dx), *acc);
    if constexpr (MIN) {
      *acc = _mm256_fnmadd_ps(mn[0], _mm256_set1_ps(a.d * float(a.sum[0])), *acc);
      *acc = _mm256_fnmadd_ps(mn[1], _mm256_set1_ps(a.d * float(a.sum[1])), *acc);
    }
  } else {
    const __m256i p =
        DotChunks<8, kG>(_mm256_set1_epi32(-offset * (a.sum[0] + a.sum[1])), w, a.q);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(s[0], dx), *acc);
    if constexpr (MIN)
      *acc = _mm256_fnmadd_ps(mn[0], _mm256_set1_ps(a.d * float(a.sum[0] + a.sum[1])), *acc);
  }
}

// The f16 d (and dmin) of half h's rows in a super-block header.
template <bool MIN>
[[gnu::always_inline]] inline void HeaderHalf(const uint8_t* hdr, int h, __m256* d,
                                              __m256* dmin) {
  *d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr + 16 * h)));
  *dmin = _mm256_setzero_ps();
  if constexpr (MIN)
    *dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr + 32 + 16 * h)));
}

// Sizes of the plane layout (kquant.h) of a format at compile time.
template <int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
struct PlaneSizes {
  static constexpr int kNsub = SUB16 ? 2 : 1;
  static constexpr int64_t kPlane = 64 * (LOW + HIGH);
  // SC: K-quant super-blocks of 8 cells with integer sub-block scales; else one cell.
  static constexpr int kCells = SC ? 8 : 1;
  static constexpr int64_t kCell = kPlane + (SC ? 16 * kNsub * (MIN && !NIB ? 2 : 1) : 0);
  static constexpr int64_t kHeader = MIN ? 64 : 32, kSuper = kHeader + kCells * kCell;
};

template <int MT, int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
void Tile(int32_t offset, const uint8_t* group, int64_t kb, const ActBlock* x, int64_t x_stride,
          float* tile) {
  using Z = PlaneSizes<LOW, HIGH, SUB16, MIN, NIB, SC>;
  for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h+7
    __m256 acc[MT];
    for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < kb / Z::kCells; ++sb) {
      const uint8_t* hdr = group + sb * Z::kSuper;
      __m256 d, dmin;
      HeaderHalf<MIN>(hdr, h, &d, &dmin);
      for (int c = 0; c < Z::kCells; ++c) {
        const uint8_t* cell = hdr + Z::kHeader + c * Z::kCell;
        __m256i w[8];
        LoadQuants<LOW, HIGH>(cell + 32 * h, w);
        __m256 s[Z::kNsub], mn[Z::kNsub];
        CellHalfScales<LOW, HIGH, SUB16, MIN, NIB, SC>(cell, h, d, dmin, s, mn);
        const int64_t b = sb * Z::kCells + c;
        for (int i = 0; i < MT; ++i)
          AccumulateCellHalf<LOW, HIGH, SUB16, MIN>(w, s, mn, x[i * x_stride + b], offset,
                                                    &acc[i]);
      }
    }
    for (int i = 0; i < MT; ++i) _mm256_storeu_ps(tile + i * kPackRows + 8 * h, acc[i]);
  }
}

constexpr int64_t kPrefetchCells = 12;  // as the other packed formats (kernels_avx2.cc)

// Decode (one activation row): NS groups stream_stride bytes apart in lockstep, both halves of
// each cell in one pass, prefetching kPrefetchCells ahead where `prefetch`; tile[s * kPackRows
// + r] is group s's row r (KernelTable::gemm_packed_streams).
template <int NS, int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
void TileStreams(int32_t offset, const uint8_t* group, int64_t stream_stride, int64_t kb,
                 const ActBlock* x, float* tile, bool prefetch) {
  using Z = PlaneSizes<LOW, HIGH, SUB16, MIN, NIB, SC>;
  __m256 acc[2 * NS];
  for (int i = 0; i < 2 * NS; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < kb / Z::kCells; ++sb) {
    // Each stream's super-block factors, per half, once for the super-block's cells.
    __m256 d[2 * NS], dmin[2 * NS];
    for (int st = 0; st < NS; ++st)
      for (int h = 0; h < 2; ++h)
        HeaderHalf<MIN>(group + st * stream_stride + sb * Z::kSuper, h, &d[2 * st + h],
                        &dmin[2 * st + h]);
    for (int c = 0; c < Z::kCells; ++c) {
      const int64_t b = sb * Z::kCells + c;
      for (int st = 0; st < NS; ++st) {
        const uint8_t* cell = group + st * stream_stride + sb * Z::kSuper + Z::kHeader +
                              c * Z::kCell;
        // The cell (and the header before it) as far ahead as the other formats prefetch.
        const uint8_t* ahead = cell + kPrefetchCells * Z::kSuper / Z::kCells;
        for (int64_t off = 0; prefetch && off < Z::kCell; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
        for (int h = 0; h < 2; ++h) {
          __m256i w[8];
          LoadQuants<LOW, HIGH>(cell + 32 * h, w);
          __m256 s[Z::kNsub], mn[Z::kNsub];
          CellHalfScales<LOW, HIGH, SUB16, MIN, NIB, SC>(cell, h, d[2 * st + h],
                                                         dmin[2 * st + h], s, mn);
          AccumulateCellHalf<LOW, HIGH, SUB16, MIN>(w, s, mn, x[b], offset, &acc[2 * st + h]);
        }
      }
    }
  }
  for (int st = 0; st < NS; ++st)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(tile + st * kPackRows + 8 * h, acc[2 * st + h]);
}

template <int LOW, int HIGH, bool SUB16, bool MIN, bool NIB, bool SC>
void Gemm(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
          int64_t x_stride, int64_t m, float* tile) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4)
    Tile<4, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, kb, x + i * x_stride, x_stride,
                                        tile + i * kPackRows);
  const ActBlock* xr = x + i * x_stride;
  float* tr = tile + i * kPackRows;
  switch (m - i) {
    case 3: Tile<3, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, kb, xr, x_stride, tr); break;
    case 2: Tile<2, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, kb, xr, x_stride, tr); break;
    case 1: Tile<1, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, kb, xr, x_stride, tr); break;
    default: break;
  }
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
      TileStreams<NS, LOW, HIGH, SUB16, MIN, NIB, SC>(f.offset, group, stream_stride, kb, x,
                                                      tile, prefetch);
    });
  });
}

}  // namespace polychip::cpu::avx2
