// The bit-plane packed layout: the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) exact and about the
// size of their GGUF blocks, and Q5_0/Q5_1 at their GGUF size.
//
// A K-quant super-block (256 elements) has an f16 factor d (and dmin) and 8 or 16 integer
// sub-block scales (and mins); a weight is d * sc * (q - offset) - dmin * m. Folding d * sc
// into one f16 per sub-block rounds it (off by up to 2^-11, enough to move a mixture-of-experts
// router near a tie), so this layout keeps the integers and the f16 factors as they are and the
// kernels multiply them in f32, where d * sc is exact (11 + 8 significant bits). Q5_0 and Q5_1
// are the same with a super-block of one block and no sub-block scales (weight d * (q - 16),
// or d * q + m with dmin = -m): their 5-bit quants in a 4-bit and a 1-bit plane instead of
// bytes (22 and 24 bytes per 32, as in the file, not 34 and 36).
//
// Per group of kPackRows (16) rows and per super-block (8 blocks with sub_scales, else 1), in
// memory order:
//   header   d f16 [16] (one per row), then dmin f16 [16] when has_min           [32 or 64 B]
//   cells    one per 32-element block of the super-block:
//     low plane   low_bits (4 or 2) of each quant                         [64 * low_bits B]
//     high plane  the next high_bits (0, 1 or 2), u = low | high << low_bits [64 * high_bits B]
//     with sub_scales:
//     scales      int8 [nsub][16]: sub-block scale per row (nsub = 2 with half_scales:
//                 sub-blocks of 16 elements, else 1)                       [16 * nsub B]
//     mins        uint8 [nsub][16] when has_min; with nibble_scales (Q2_K) the scale byte
//                 holds the scale in its low nibble and the min in its high one instead
//
// A plane of B bits is B chunks of 64 bytes. Element e of row r (j = e / 4, the 4-byte lane
// group vpdpbusd consumes) is in chunk j % B at byte 4r + e % 4, bits B * (j / B) and up: so
// one 64-byte load and a shift give the quants of 4 consecutive elements of all 16 rows (the
// 4-bit plane is the layout of Q4_0's cells).
//
// block_bytes() of such a format is the average per block (cell + header / blocks per
// super-block); K is a multiple of 256 for the K-quants, so a group's size is still
// kb * block_bytes().
#pragma once

#include <cstdint>

#include "packed.h"
#include "polychip/plugin/pc_common.h"

namespace polychip::cpu {

// Fills *f (may be null) with the plane layout of dtype; false if dtype does not take it.
bool PlaneFormatOf(pc_dtype_t dtype, PackedFormat* f);
// PackGroups / UnpackRow for such a dtype (f from PlaneFormatOf).
void PackPlaneGroups(pc_dtype_t dtype, const PackedFormat& f, const uint8_t* src, int64_t n,
                     int64_t k, int64_t g0, int64_t g1, uint8_t* dst);
void UnpackPlaneRow(const PackedFormat& f, const uint8_t* packed, int64_t k, int64_t row,
                    float* out);

// Blocks per super-block and the byte sizes of the pieces above.
inline int64_t KCells(const PackedFormat& f) { return f.sub_scales ? 8 : 1; }
inline int64_t KPlaneBytes(const PackedFormat& f) { return 64 * (f.low_bits + f.high_bits); }
inline int64_t KSubBlocks(const PackedFormat& f) { return f.half_scales ? 2 : 1; }
inline int64_t KCellBytes(const PackedFormat& f) {
  if (!f.sub_scales) return KPlaneBytes(f);
  const bool separate_mins = f.has_min && !f.nibble_scales;
  return KPlaneBytes(f) + 16 * KSubBlocks(f) * (separate_mins ? 2 : 1);
}
inline int64_t KHeaderBytes(const PackedFormat& f) { return f.has_min ? 64 : 32; }
inline int64_t KSuperBytes(const PackedFormat& f) {
  return KHeaderBytes(f) + KCells(f) * KCellBytes(f);
}

// Unsigned quant u of element e of row r in a cell (the scalar kernel and UnpackKQuantRow).
inline int KQuantCode(const PackedFormat& f, const uint8_t* cell, int r, int e) {
  auto field = [&](const uint8_t* plane, int bits) {
    const int j = e / 4;
    const uint8_t byte = plane[64 * (j % bits) + 4 * r + e % 4];
    return (byte >> (bits * (j / bits))) & ((1 << bits) - 1);
  };
  int u = field(cell, f.low_bits);
  if (f.high_bits) u |= field(cell + 64 * f.low_bits, f.high_bits) << f.low_bits;
  return u;
}

// Sub-block s (0 or 1) of a cell: the integer scale and min of row r (1 and 1 without
// sub_scales: the header's d and dmin are the block's).
inline void KQuantScaleMin(const PackedFormat& f, const uint8_t* cell, int r, int s, int* sc,
                           int* m) {
  if (!f.sub_scales) {
    *sc = *m = 1;
    return;
  }
  const uint8_t* scales = cell + KPlaneBytes(f);
  if (f.nibble_scales) {
    *sc = scales[16 * s + r] & 0xF;
    *m = scales[16 * s + r] >> 4;
    return;
  }
  *sc = static_cast<int8_t>(scales[16 * s + r]);
  *m = f.has_min ? scales[16 * KSubBlocks(f) + 16 * s + r] : 0;
}

// Calls run.template operator()<LOW, HIGH, SUB16, MIN, NIB, SC>() for the plane format f: the
// compile-time parameters every ISA's plane kernels take (kernels_kquant_<isa>.cc).
template <typename Run>
void ForPlaneFormat(const PackedFormat& f, Run&& run) {
  if (!f.sub_scales) {
    if (f.has_min) return run.template operator()<4, 1, false, true, false, false>();  // Q5_1
    return run.template operator()<4, 1, false, false, false, false>();               // Q5_0
  }
  if (f.low_bits == 2) {
    if (f.high_bits == 1) return run.template operator()<2, 1, true, false, false, true>();  // Q3_K
    return run.template operator()<2, 0, true, true, true, true>();                         // Q2_K
  }
  if (f.high_bits == 2) return run.template operator()<4, 2, true, false, false, true>();  // Q6_K
  if (f.high_bits == 1) return run.template operator()<4, 1, false, true, false, true>();  // Q5_K
  return run.template operator()<4, 0, false, true, false, true>();                        // Q4_K
}

// The plane-layout GEMM of each kernel table (KernelTable::gemm_packed when f.planes), one
// per ISA in kernels_kquant_<isa>.cc, compiled with that ISA's flags.
namespace scalar {
void GemmPlanes(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile);
}
namespace avx2 {
void GemmPlanes(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile);
// KernelTable::gemm_packed_streams for the plane layout.
void GemmPlanesStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                       int n_streams, int64_t kb, const ActBlock* x, float* tile, bool prefetch);
}
namespace avx512 {
void GemmPlanes(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile);
// KernelTable::gemm_packed_streams for the plane layout.
void GemmPlanesStreams(const PackedFormat& f, const uint8_t* group, int64_t stream_stride,
                       int n_streams, int64_t kb, const ActBlock* x, float* tile, bool prefetch);
}

}  // namespace polychip::cpu
