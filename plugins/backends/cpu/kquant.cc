// Repacking GGUF K-quant super-blocks and Q5_0/Q5_1 blocks into the plane layout of kquant.h, and
// back.
#include "kquant.h"

#include <cstring>

#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace {

constexpr int kSuperBlock = 256;

// One GGUF super-block (or Q5_0 block) decoded to its integers: unsigned codes, per-sub-block
// scale and min (sub-blocks of 32 or 16 elements as the format has them), the f16 factors as
// stored.
struct SuperBlock {
  uint8_t u[kSuperBlock];
  int sc[16];
  int m[16];
  uint16_t d, dmin;
};

// Q4_K / Q5_K: 8 six-bit scales and mins in 12 bytes (entries 0-3 in the low six bits of bytes
// 0-3 and 4-7; entries 4-7 as nibbles in bytes 8-11 plus the top two bits of bytes 0-7).
void ScaleMin12(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void Decode(pc_dtype_t dtype, const uint8_t* b, SuperBlock* s) {
  s->dmin = 0;
  switch (dtype) {
    case PC_DTYPE_Q5_0:    // [d:f16][qh:4][qs:16]: bit e of qh is element e's fifth bit
    case PC_DTYPE_Q5_1: {  // [d:f16][m:f16][qh:4][qs:16]: weight d * q + m, so dmin = -m
      const bool min = dtype == PC_DTYPE_Q5_1;
      s->d = Load16(b);
      if (min) s->dmin = Load16(b + 2) ^ 0x8000;  // f16 negation: the sign bit
      const uint8_t* qhp = b + (min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, qhp, 4);
      for (int e = 0; e < 16; ++e) {
        s->u[e] = static_cast<uint8_t>((qhp[4 + e] & 0xF) | (((qh >> e) & 1) << 4));
        s->u[e + 16] = static_cast<uint8_t>((qhp[4 + e] >> 4) | (((qh >> (e + 16)) & 1) << 4));
      }
      break;
    }
    case PC_DTYPE_Q2_K: {  // [scales:16][qs:64][d][dmin]; e = 128h + 32j + 16u + l
      s->d = Load16(b + 80);
      s->dmin = Load16(b + 82);
      for (int i = 0; i < 16; ++i) {
        s->sc[i] = b[i] & 0xF;
        s->m[i] = b[i] >> 4;
      }
      for (int e = 0; e < kSuperBlock; ++e) {
        const int h = e / 128, j = (e / 32) % 4, u = (e / 16) % 2, l = e % 16;
        s->u[e] = (b[16 + 32 * h + 16 * u + l] >> (2 * j)) & 3;
      }
      break;
    }
    case PC_DTYPE_Q3_K: {  // [hmask:32][qs:64][scales:12][d], codes offset by 4
      s->d = Load16(b + 108);
      const uint8_t* sc = b + 96;
      for (int i = 0; i < 16; ++i) {
        const int lo = (sc[i % 8] >> (4 * (i / 8))) & 0xF;
        const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        s->sc[i] = (lo | (hi << 4)) - 32;
        s->m[i] = 0;
      }
      for (int e = 0; e < kSuperBlock; ++e) {
        const int h = e / 128, j = (e / 32) % 4, u = (e / 16) % 2, l = e % 16;
        const int low = (b[32 + 32 * h + 16 * u + l] >> (2 * j)) & 3;
        const int high = (b[16 * u + l] >> (4 * h + j)) & 1;
        s->u[e] = static_cast<uint8_t>(low | (high << 2));
      }
      break;
    }
    case PC_DTYPE_Q4_K:    // [d][dmin][scales:12][qs:128]
    case PC_DTYPE_Q5_K: {  // [d][dmin][scales:12][qh:32][qs:128]
      const bool five = dtype == PC_DTYPE_Q5_K;
      s->d = Load16(b);
      s->dmin = Load16(b + 2);
      for (int j = 0; j < 8; ++j) ScaleMin12(b + 4, j, &s->sc[j], &s->m[j]);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int e = 0; e < kSuperBlock; ++e) {
        const int c = e / 64, hi = (e / 32) % 2, l = e % 32;  // sub-block 2c + hi
        int q = (qs[32 * c + l] >> (4 * hi)) & 0xF;
        if (five) q |= ((qh[l] >> (2 * c + hi)) & 1) << 4;
        s->u[e] = static_cast<uint8_t>(q);
      }
      break;
    }
    case PC_DTYPE_Q6_K: {  // [ql:128][qh:64][scales:16 int8][d], codes offset by 32
      s->d = Load16(b + 208);
      for (int i = 0; i < 16; ++i) {
        s->sc[i] = static_cast<int8_t>(b[192 + i]);
        s->m[i] = 0;
      }
      for (int e = 0; e < kSuperBlock; ++e) {
        const int h = e / 128, r = (e / 32) % 4, l = e % 32;
        const int low = (b[64 * h + l + 32 * (r & 1)] >> (4 * (r >> 1))) & 0xF;
        const int high = (b[128 + 32 * h + l] >> (2 * r)) & 3;
        s->u[e] = static_cast<uint8_t>(low | (high << 4));
      }
      break;
    }
    default:
      std::memset(s, 0, sizeof(*s));
  }
}

// Writes row r's bytes of a plane of `bits` bits (kquant.h) for one 32-element block: bits
// (from `shift` up) of each code u[e]. Each byte is built in a register and stored once (an OR
// into memory per element chained every store to the last and made packing most of a K-quant
// model's load time).
void PutPlane(uint8_t* plane, int bits, int shift, int r, const uint8_t* u) {
  const unsigned mask = (1u << bits) - 1;
  for (int chunk = 0; chunk < bits; ++chunk) {
    for (int lane = 0; lane < 4; ++lane) {
      unsigned byte = 0;
      // Element e = 4j + lane with j % bits == chunk sits at bits * (j / bits).
      for (int t = 0; t < 8 / bits; ++t) {
        byte |= ((u[4 * (chunk + bits * t) + lane] >> shift) & mask) << (bits * t);
      }
      plane[64 * chunk + 4 * r + lane] = static_cast<uint8_t>(byte);
    }
  }
}

}  // namespace

bool PlaneFormatOf(pc_dtype_t dtype, PackedFormat* f) {
  PackedFormat p;
  p.planes = true;
  p.sub_scales = dtype != PC_DTYPE_Q5_0 && dtype != PC_DTYPE_Q5_1;
  switch (dtype) {
    case PC_DTYPE_Q5_0: p.low_bits = 4, p.high_bits = 1, p.offset = 16; break;
    case PC_DTYPE_Q5_1: p.low_bits = 4, p.high_bits = 1, p.has_min = true; break;
    case PC_DTYPE_Q2_K:
      p.low_bits = 2, p.half_scales = true, p.has_min = true, p.nibble_scales = true;
      break;
    case PC_DTYPE_Q3_K: p.low_bits = 2, p.high_bits = 1, p.half_scales = true, p.offset = 4; break;
    case PC_DTYPE_Q4_K: p.low_bits = 4, p.has_min = true; break;
    case PC_DTYPE_Q5_K: p.low_bits = 4, p.high_bits = 1, p.has_min = true; break;
    case PC_DTYPE_Q6_K: p.low_bits = 4, p.high_bits = 2, p.half_scales = true, p.offset = 32; break;
    default: return false;
  }
  p.q4 = false;
  if (f) *f = p;
  return true;
}

void PackPlaneGroups(pc_dtype_t dtype, const PackedFormat& f, const uint8_t* src, int64_t n,
                     int64_t k, int64_t g0, int64_t g1, uint8_t* dst) {
  const int64_t cells = KCells(f), n_super = k / (kBlock * cells);
  const int64_t row_bytes = sdk::RowBytes(dtype, k);
  const int64_t src_super = row_bytes / n_super;
  const int64_t super_bytes = KSuperBytes(f), cell_bytes = KCellBytes(f);
  const int64_t header = KHeaderBytes(f), plane = KPlaneBytes(f), nsub = KSubBlocks(f);
  // Locals: the byte stores below may alias `f` as far as the compiler knows, which made it
  // reload these for every element.
  const int low_bits = f.low_bits, high_bits = f.high_bits;
  SuperBlock s;
  for (int64_t g = g0; g < g1; ++g) {
    uint8_t* out = dst + g * n_super * super_bytes;
    std::memset(out, 0, n_super * super_bytes);  // padding rows stay zero (d = 0)
    for (int r = 0; r < kPackRows; ++r) {
      const int64_t row = g * kPackRows + r;
      if (row >= n) break;
      for (int64_t sb = 0; sb < n_super; ++sb) {
        Decode(dtype, src + row * row_bytes + sb * src_super, &s);
        uint8_t* hdr = out + sb * super_bytes;
        std::memcpy(hdr + 2 * r, &s.d, 2);
        if (f.has_min) std::memcpy(hdr + 32 + 2 * r, &s.dmin, 2);
        for (int c = 0; c < cells; ++c) {
          uint8_t* cell = hdr + header + c * cell_bytes;
          const uint8_t* u = s.u + kBlock * c;
          PutPlane(cell, low_bits, 0, r, u);
          if (high_bits) PutPlane(cell + 64 * low_bits, high_bits, low_bits, r, u);
          if (!f.sub_scales) continue;
          uint8_t* scales = cell + plane;
          for (int64_t i = 0; i < nsub; ++i) {
            const int sub = static_cast<int>(c * nsub + i);  // the GGUF sub-block index
            if (f.nibble_scales) {
              scales[16 * i + r] = static_cast<uint8_t>(s.sc[sub] | (s.m[sub] << 4));
            } else {
              scales[16 * i + r] = static_cast<uint8_t>(static_cast<int8_t>(s.sc[sub]));
              if (f.has_min) scales[16 * (nsub + i) + r] = static_cast<uint8_t>(s.m[sub]);
            }
          }
        }
      }
    }
  }
}

void UnpackPlaneRow(const PackedFormat& f, const uint8_t* packed, int64_t k, int64_t row,
                    float* out) {
  const int64_t cells = KCells(f), n_super = k / (kBlock * cells);
  const int r = static_cast<int>(row % kPackRows);
  const int64_t super_bytes = KSuperBytes(f), cell_bytes = KCellBytes(f);
  const int sub_len = f.half_scales ? 16 : 32;  // 32 without sub_scales (sc = m = 1)
  const uint8_t* group = packed + row / kPackRows * n_super * super_bytes;
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const uint8_t* hdr = group + sb * super_bytes;
    const float d = sdk::Fp16ToFp32(Load16(hdr + 2 * r));
    const float dmin = f.has_min ? sdk::Fp16ToFp32(Load16(hdr + 32 + 2 * r)) : 0.f;
    for (int c = 0; c < cells; ++c, out += kBlock) {
      const uint8_t* cell = hdr + KHeaderBytes(f) + c * cell_bytes;
      for (int s = 0; s < kBlock / sub_len; ++s) {
        int sc, m;
        KQuantScaleMin(f, cell, r, s, &sc, &m);
        // The GGUF reference's arithmetic: (d * sc) * (u - offset) - dmin * m, all in f32.
        const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
        for (int e = s * sub_len; e < (s + 1) * sub_len; ++e) {
          const float q = static_cast<float>(KQuantCode(f, cell, r, e) - f.offset);
          out[e] = f.has_min ? ds * q - dm : ds * q;
        }
      }
    }
  }
}

}  // namespace polychip::cpu
