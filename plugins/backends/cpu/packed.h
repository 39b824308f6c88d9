// The cpu plugin's private weight layout ("packed"), chosen at weight_upload for Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS weights.
//
// Rows are taken kPackRows (16) at a time: a group holds 16 rows' 32-element blocks side by
// side, so one 64-byte load holds 4 consecutive quants of each of the 16 rows and one integer
// dot-product instruction (vpdpbusd) advances all 16 dot products at once, with the activation
// bytes broadcast. Per group and per 32-element block b (groups and blocks in memory order):
//
//   quants  4-bit: 4 chunks of 64 bytes; chunk c, bytes 4r..4r+3 (row r): low nibbles are
//                  elements 4c..4c+3, high nibbles elements 16+4c..16+4c+3           [256 B]
//           8-bit: 8 chunks of 64 bytes; chunk c, bytes 4r..4r+3: elements 4c..4c+3  [512 B]
//           stored unsigned: u = q + offset (so u8 x s8 instructions apply)
//   scales  f16 [16] (one per row), or f16 [2][16] when half_scales (per 16 elements)
//   mins    f16 [16] when has_min
//
// Weight value = scale * (u - offset) - min. The row count is padded to a multiple of 16 with
// zero rows. Q4_0 and Q8_0 keep their exact size (18 and 34 bytes per 32). The K-quants
// (Q2_K ... Q6_K) and Q5_0 take the bit-plane variant of kquant.h instead: integer sub-block
// scales and f16 super-block factors kept exact, about the GGUF size.
// Q4_1 keeps its 20 bytes (4-bit cells, min = -m). IQ4_NL keeps its 18 bytes and IQ4_XS grows
// from 17 to 18 (d * (6-bit sub-scale - 32) rounded to one f16 scale per 32): 4-bit cells of
// codebook indices, looked up in the kernel (one byte shuffle per vector).
#pragma once

#include <cstdint>
#include <cstring>

#include "polychip/plugin/pc_common.h"

namespace polychip::cpu {

constexpr int kPackRows = 16;

// A little-endian u16 (an f16's bits) at any alignment.
inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
constexpr int kBlock = 32;
// The layout tag weight_upload returns for packed weights (w_dtype still says the source type).
constexpr uint32_t kLayoutPacked = 0x43505531u;  // "1UPC"

struct PackedFormat {
  bool q4 = false;           // 4-bit quants, else 8-bit
  int32_t offset = 0;        // u = q + offset
  bool half_scales = false;  // a scale per 16 elements instead of per 32
  bool has_min = false;
  // 4-bit cells hold indices into the IQ4 codebook (sdk::kIq4nlValues): the kernels look the
  // quant up, u = kIq4nlValues[index] + 128, with offset 128 (IQ4_NL, IQ4_XS).
  bool codebook = false;

  // The bit-plane layout of kquant.h instead (Q2_K ... Q6_K, Q5_0): quants in planes of
  // low_bits (4 or 2) and high_bits (0, 1 or 2) bits, an f16 d (and dmin) per row and
  // super-block; with sub_scales (the K-quants) a super-block is 8 blocks, each with integer
  // sub-block scales (and mins; one byte for both with nibble_scales), else it is one block.
  bool planes = false;
  bool sub_scales = false;
  int8_t low_bits = 0;
  int8_t high_bits = 0;
  bool nibble_scales = false;

  int64_t quant_bytes() const { return q4 ? 256 : 512; }
  int64_t scale_bytes() const { return (half_scales ? 2 : 1) * kPackRows * 2; }
  // Bytes of one (group, block) cell; in the plane layout the average over a super-block.
  int64_t block_bytes() const {
    if (planes) {
      const int64_t scales =
          sub_scales ? (half_scales ? 2 : 1) * 16 * (has_min && !nibble_scales ? 2 : 1) : 0;
      return 64 * (low_bits + high_bits) + scales + (has_min ? 64 : 32) / (sub_scales ? 8 : 1);
    }
    return quant_bytes() + scale_bytes() + (has_min ? 32 : 0);
  }
};

// A row of activations quantized to int8 in blocks of 32 (one float scale per block), with the
// sums of each half-block's quants for the offset and min corrections.
struct ActBlock {
  int8_t q[32];
  float d;
  int32_t sum[2];  // sum of q[0..15], q[16..31]
};

// How many activations share one scale against a weight of `dtype` (KernelTable::quantize_row):
// 256 for the super-block types (K-quants, IQ4_XS), 32 for the others. It is the pairing GGUF's
// quantized dot products are defined with (Q8_K against super-blocks, Q8_0 against the rest),
// so the rounding is llama.cpp's: with 32 against a Q4_K_M model, perplexity parted from
// llama.cpp's by 0.3-0.5% (docs/performance.md), with 256 by about 0.1%. The storage stays a
// block of 32: the 8 blocks of a super-block carry the same d.
inline int64_t ActScaleBlock(pc_dtype_t dtype) {
  switch (dtype) {
    case PC_DTYPE_Q2_K:
    case PC_DTYPE_Q3_K:
    case PC_DTYPE_Q4_K:
    case PC_DTYPE_Q5_K:
    case PC_DTYPE_Q6_K:
    case PC_DTYPE_IQ4_XS:
      return 256;
    default:
      return 32;
  }
}

// The scale d and its inverse id of a group of activations whose largest magnitude is amax,
// as GGUF's Q8_0 (d = amax / 127, groups of 32) and Q8_K (id = 127 / amax, groups of 256)
// compute them; the two differ in the last bit, which can move a rounding.
inline void ActScale(float amax, int64_t scale_block, float* d, float* id) {
  if (scale_block == kBlock) {
    *d = amax / 127.f;
    *id = *d > 0 ? 1.f / *d : 0.f;
  } else {
    *id = amax > 0 ? 127.f / amax : 0.f;
    *d = *id > 0 ? 1.f / *id : 0.f;
  }
}

// True (and *f set) when `dtype` has a packed form.
bool PackedFormatOf(pc_dtype_t dtype, PackedFormat* f);
// Bytes of a packed [n, k] matrix.
int64_t PackedBytes(const PackedFormat& f, int64_t n, int64_t k);
// Repacks rows' groups [g0, g1) of a GGUF [n, k] matrix of `dtype` into `dst` (the whole packed
// buffer). Groups are independent, so callers may split the range across threads.
void PackGroups(pc_dtype_t dtype, const uint8_t* src, int64_t n, int64_t k, int64_t g0,
                int64_t g1, uint8_t* dst);
// Dequantizes row `row` of a packed [n, k] matrix of `dtype` into out[k]: the inverse of
// PackGroups, for EMBEDDING from a packed table. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and the
// K-quants give exactly the GGUF reference's values; IQ4_XS carries the f16 rounding of its
// folded scales (as MATMUL).
void UnpackRow(pc_dtype_t dtype, const uint8_t* packed, int64_t k, int64_t row, float* out);

}  // namespace polychip::cpu
