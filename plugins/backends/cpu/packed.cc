#include "packed.h"

#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kquant.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace {

// One source block of 32 weights decoded to the packed form: unsigned quants, scale(s), min.
struct Cell {
  uint8_t u[32];
  uint16_t scale[2];  // f16 bits; [1] used only with half scales
  uint16_t min;       // f16 bits
};

// Decodes block b (of 32 elements) of one GGUF row.
void DecodeCell(pc_dtype_t dtype, const uint8_t* row, int64_t b, Cell* c) {
  switch (dtype) {
    case PC_DTYPE_Q4_0:      // [d:f16][qs:16], element e<16 low nibble of qs[e], else high
    case PC_DTYPE_IQ4_NL: {  // the same bytes: the nibbles are codebook indices
      const uint8_t* blk = row + b * 18;
      c->scale[0] = Load16(blk);
      for (int e = 0; e < 16; ++e) {
        c->u[e] = blk[2 + e] & 0xF;
        c->u[e + 16] = blk[2 + e] >> 4;
      }
      break;
    }
    case PC_DTYPE_Q8_0: {  // [d:f16][qs:32 int8]
      const uint8_t* blk = row + b * 34;
      c->scale[0] = Load16(blk);
      for (int e = 0; e < 32; ++e) c->u[e] = static_cast<uint8_t>(int8_t(blk[2 + e]) + 128);
      break;
    }
    case PC_DTYPE_Q4_1: {  // [d:f16][m:f16][qs:16]: value = d * q + m, so min = -m
      const uint8_t* blk = row + b * 20;
      c->scale[0] = Load16(blk);
      c->min = Load16(blk + 2) ^ 0x8000;  // f16 negation: flip the sign bit
      for (int e = 0; e < 16; ++e) {
        c->u[e] = blk[4 + e] & 0xF;
        c->u[e + 16] = blk[4 + e] >> 4;
      }
      break;
    }
    case PC_DTYPE_IQ4_XS: {  // [d][scales_h:u16][scales_l:4][qs:128]; sub-block j at qs + 16j
      const uint8_t* sb = row + (b / 8) * 136;
      const int j = static_cast<int>(b % 8);
      const int scales_h = Load16(sb + 2);
      const int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4);
      c->scale[0] = sdk::Fp32ToFp16(sdk::Fp16ToFp32(Load16(sb)) * (ls - 32));
      const uint8_t* qs = sb + 8 + 16 * j;
      for (int e = 0; e < 16; ++e) {
        c->u[e] = qs[e] & 0xF;
        c->u[e + 16] = qs[e] >> 4;
      }
      break;
    }
    default:
      break;
  }
}

// Fast path for Q4_0 and Q8_0, whose source bytes already sit in the packed order: a Q4_0
// block's byte j holds elements j and j + 16, exactly packed byte 4r + j % 4 of chunk j / 4;
// Q8_0's byte e is element e, which only needs the +128 offset (a sign-bit flip).
void PackGroupsQx0(bool q4, const uint8_t* src, int64_t n, int64_t kb, int64_t row_bytes,
                   int64_t g0, int64_t g1, uint8_t* dst, const PackedFormat& f) {
  const int64_t src_block = q4 ? 18 : 34;
  const int chunks = q4 ? 4 : 8;
  for (int64_t g = g0; g < g1; ++g) {
    uint8_t* cell = dst + g * kb * f.block_bytes();
#if defined(__SSE2__)
    if ((g + 1) * kPackRows <= n) {
      // A full group: the cell's quants are the 16 rows x `chunks` dwords of the block,
      // transposed (chunk c = dword c of every row); done 4 rows x 4 dwords at a time, which
      // is what loading a Q8_0 model mostly costs.
      const __m128i flip = _mm_set1_epi8(q4 ? 0 : static_cast<char>(0x80));
      for (int64_t b = 0; b < kb; ++b, cell += f.block_bytes()) {
        uint16_t* scales = reinterpret_cast<uint16_t*>(cell + f.quant_bytes());
        for (int r0 = 0; r0 < kPackRows; r0 += 4) {
          const uint8_t* blk[4];
          for (int i = 0; i < 4; ++i) {
            blk[i] = src + (g * kPackRows + r0 + i) * row_bytes + b * src_block;
            scales[r0 + i] = Load16(blk[i]);
          }
          for (int c0 = 0; c0 < chunks; c0 += 4) {
            __m128i v[4];
            for (int i = 0; i < 4; ++i) {
              v[i] = _mm_xor_si128(
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[i] + 2 + 4 * c0)), flip);
            }
            // 4x4 dword transpose: t[j] = dword j of rows r0..r0+3.
            const __m128i a = _mm_unpacklo_epi32(v[0], v[1]), bb = _mm_unpackhi_epi32(v[0], v[1]);
            const __m128i cc = _mm_unpacklo_epi32(v[2], v[3]), d = _mm_unpackhi_epi32(v[2], v[3]);
            const __m128i t[4] = {_mm_unpacklo_epi64(a, cc), _mm_unpackhi_epi64(a, cc),
                                  _mm_unpacklo_epi64(bb, d), _mm_unpackhi_epi64(bb, d)};
            for (int j = 0; j < 4; ++j) {
              _mm_storeu_si128(reinterpret_cast<__m128i*>(cell + 64 * (c0 + j) + 4 * r0), t[j]);
            }
          }
        }
      }
      continue;
    }
#endif
    for (int64_t b = 0; b < kb; ++b, cell += f.block_bytes()) {
      uint16_t* scales = reinterpret_cast<uint16_t*>(cell + f.quant_bytes());
      for (int r = 0; r < kPackRows; ++r) {
        const int64_t row = g * kPackRows + r;
        if (row >= n) {
          for (int c = 0; c < chunks; ++c) std::memset(cell + 64 * c + 4 * r, 0, 4);
          scales[r] = 0;
          continue;
        }
        const uint8_t* blk = src + row * row_bytes + b * src_block;
        scales[r] = Load16(blk);
        for (int c = 0; c < chunks; ++c) {
          uint32_t v;
          std::memcpy(&v, blk + 2 + 4 * c, 4);
          if (!q4) v ^= 0x80808080u;
          std::memcpy(cell + 64 * c + 4 * r, &v, 4);
        }
      }
    }
  }
}

}  // namespace

bool PackedFormatOf(pc_dtype_t dtype, PackedFormat* f) {
  if (PlaneFormatOf(dtype, f)) return true;  // Q2_K ... Q6_K, Q5_0, Q5_1: kquant.h
  PackedFormat p;
  switch (dtype) {
    case PC_DTYPE_Q4_0: p.q4 = true; p.offset = 8; break;
    case PC_DTYPE_Q8_0: p.offset = 128; break;
    case PC_DTYPE_Q4_1: p.q4 = true; p.has_min = true; break;
    case PC_DTYPE_IQ4_NL:
    case PC_DTYPE_IQ4_XS: p.q4 = true; p.codebook = true; p.offset = 128; break;
    default: return false;
  }
  if (f) *f = p;
  return true;
}

int64_t PackedBytes(const PackedFormat& f, int64_t n, int64_t k) {
  return (n + kPackRows - 1) / kPackRows * (k / kBlock) * f.block_bytes();
}

void PackGroups(pc_dtype_t dtype, const uint8_t* src, int64_t n, int64_t k, int64_t g0,
                int64_t g1, uint8_t* dst) {
  PackedFormat f;
  if (!PackedFormatOf(dtype, &f)) return;
  if (f.planes) return PackPlaneGroups(dtype, f, src, n, k, g0, g1, dst);
  const int64_t kb = k / kBlock;
  const int64_t row_bytes = sdk::RowBytes(dtype, k);
  if (dtype == PC_DTYPE_Q4_0 || dtype == PC_DTYPE_Q8_0) {
    PackGroupsQx0(dtype == PC_DTYPE_Q4_0, src, n, kb, row_bytes, g0, g1, dst, f);
    return;
  }
  for (int64_t g = g0; g < g1; ++g) {
    uint8_t* cell_out = dst + g * kb * f.block_bytes();
    for (int64_t b = 0; b < kb; ++b, cell_out += f.block_bytes()) {
      std::memset(cell_out, 0, f.block_bytes());
      uint8_t* q = cell_out;
      uint8_t* scales = cell_out + f.quant_bytes();
      uint8_t* mins = scales + f.scale_bytes();
      for (int r = 0; r < kPackRows; ++r) {
        const int64_t row = g * kPackRows + r;
        if (row >= n) break;  // padding rows stay zero (scale 0)
        Cell c{};
        DecodeCell(dtype, src + row * row_bytes, b, &c);
        for (int e = 0; e < 32; ++e) {
          if (f.q4) {
            const int chunk = (e % 16) / 4, byte = 64 * chunk + 4 * r + e % 4;
            q[byte] |= e < 16 ? c.u[e] : c.u[e] << 4;
          } else {
            q[64 * (e / 4) + 4 * r + e % 4] = c.u[e];
          }
        }
        std::memcpy(scales + 2 * r, &c.scale[0], 2);
        if (f.half_scales) std::memcpy(scales + 2 * (kPackRows + r), &c.scale[1], 2);
        if (f.has_min) std::memcpy(mins + 2 * r, &c.min, 2);
      }
    }
  }
}

void UnpackRow(pc_dtype_t dtype, const uint8_t* packed, int64_t k, int64_t row, float* out) {
  PackedFormat f;
  if (!PackedFormatOf(dtype, &f)) return;
  if (f.planes) return UnpackPlaneRow(f, packed, k, row, out);
  const int64_t kb = k / kBlock;
  const int r = static_cast<int>(row % kPackRows);  // the row's lane in its group
  const uint8_t* cell = packed + row / kPackRows * kb * f.block_bytes();
  for (int64_t b = 0; b < kb; ++b, cell += f.block_bytes(), out += kBlock) {
    const uint8_t* scales = cell + f.quant_bytes();
    const float s0 = sdk::Fp16ToFp32(Load16(scales + 2 * r));
    const float s1 = f.half_scales ? sdk::Fp16ToFp32(Load16(scales + 2 * (kPackRows + r))) : s0;
    const float min = f.has_min ? sdk::Fp16ToFp32(Load16(scales + f.scale_bytes() + 2 * r)) : 0;
    for (int e = 0; e < kBlock; ++e) {
      int u;
      if (f.q4) {
        const uint8_t byte = cell[64 * ((e % 16) / 4) + 4 * r + e % 4];
        u = e < 16 ? byte & 0xF : byte >> 4;
        if (f.codebook) u = sdk::kIq4nlValues[u] + 128;
      } else {
        u = cell[64 * (e / 4) + 4 * r + e % 4];
      }
      out[e] = (e < 16 ? s0 : s1) * static_cast<float>(u - f.offset) - min;
    }
  }
}

}  // namespace polychip::cpu
