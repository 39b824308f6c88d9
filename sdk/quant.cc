// polychip SDK — GGUF element types and block formats (scalar reference code).
//
// The block layouts are those of the GGUF format (ggml's block_q* structs); the code is our own.
// Readability first: a plugin author should be able to read one format's encoder and decoder
// side by side. Fast kernels live in the plugins.
#include "polychip/sdk/quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace polychip::sdk {
namespace {

constexpr int kQK = 32;    // elements per block of the legacy formats (Q4_0 ... Q8_0)
constexpr int kQK_K = 256; // elements per super-block of the K formats

struct DtypeEntry {
  pc_dtype_t dtype;
  DtypeInfo info;
};

const DtypeEntry kDtypes[] = {
    {PC_DTYPE_F32, {"F32", 1, 4, false}},      {PC_DTYPE_F16, {"F16", 1, 2, false}},
    {PC_DTYPE_Q4_0, {"Q4_0", 32, 18, true}},   {PC_DTYPE_Q4_1, {"Q4_1", 32, 20, true}},
    {PC_DTYPE_Q5_0, {"Q5_0", 32, 22, true}},   {PC_DTYPE_Q5_1, {"Q5_1", 32, 24, true}},
    {PC_DTYPE_Q8_0, {"Q8_0", 32, 34, true}},   {PC_DTYPE_Q2_K, {"Q2_K", 256, 84, true}},
    {PC_DTYPE_Q3_K, {"Q3_K", 256, 110, true}}, {PC_DTYPE_Q4_K, {"Q4_K", 256, 144, true}},
    {PC_DTYPE_Q5_K, {"Q5_K", 256, 176, true}}, {PC_DTYPE_Q6_K, {"Q6_K", 256, 210, true}},
    {PC_DTYPE_IQ4_NL, {"IQ4_NL", 32, 18, true}}, {PC_DTYPE_IQ4_XS, {"IQ4_XS", 256, 136, true}},
    {PC_DTYPE_I8, {"I8", 1, 1, false}},        {PC_DTYPE_I16, {"I16", 1, 2, false}},
    {PC_DTYPE_I32, {"I32", 1, 4, false}},      {PC_DTYPE_I64, {"I64", 1, 8, false}},
    {PC_DTYPE_F64, {"F64", 1, 8, false}},      {PC_DTYPE_BF16, {"BF16", 1, 2, false}},
    {PC_DTYPE_FP8_E4M3, {"FP8_E4M3", 32, 33, true}},
};

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Little-endian f16 fields inside blocks (blocks are byte arrays; no struct packing games).
float LoadHalf(const uint8_t* p) { return Fp16ToFp32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }
void StoreHalf(uint8_t* p, float f) {
  uint16_t h = Fp32ToFp16(f);
  p[0] = h & 0xFF;
  p[1] = h >> 8;
}

int Nearest(float x) { return static_cast<int>(std::lrintf(x)); }

// ---- legacy 32-element formats ---------------------------------------------------------------
// Element j < 16 of a block lives in the low nibble of qs[j], element j + 16 in the high nibble.
// Q5 formats keep the fifth bit of element j in bit j of the 32-bit little-endian qh.

void DequantQ4_0(const uint8_t* b, float* y) {  // [d:f16][qs:16]
  const float d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = ((qs[j] & 0xF) - 8) * d;
    y[j + 16] = ((qs[j] >> 4) - 8) * d;
  }
}
void DequantQ4_1(const uint8_t* b, float* y) {  // [d:f16][m:f16][qs:16]
  const float d = LoadHalf(b), m = LoadHalf(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = (qs[j] & 0xF) * d + m;
    y[j + 16] = (qs[j] >> 4) * d + m;
  }
}
uint32_t LoadU32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
void StoreU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (v >> (8 * i)) & 0xFF;
}
void DequantQ5_0(const uint8_t* b, float* y) {  // [d:f16][qh:4][qs:16]
  const float d = LoadHalf(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = (lo - 16) * d;
    y[j + 16] = (hi - 16) * d;
  }
}
void DequantQ5_1(const uint8_t* b, float* y) {  // [d:f16][m:f16][qh:4][qs:16]
  const float d = LoadHalf(b), m = LoadHalf(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    int lo = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
    int hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = lo * d + m;
    y[j + 16] = hi * d + m;
  }
}
void DequantQ8_0(const uint8_t* b, float* y) {  // [d:f16][qs:32 int8]
  const float d = LoadHalf(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(b[2 + j]) * d;
}

// Symmetric formats: the element of largest magnitude maps to the most negative code (-8, -16),
// which uses the full code range. Codes are stored offset by 8 / 16.
void QuantSymmetric(const float* x, uint8_t* b, int half_range, bool five_bit) {
  float amax = 0, max = 0;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -half_range;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  uint8_t* qs = b + (five_bit ? 6 : 2);
  uint32_t qh = 0;
  const int qmax = 2 * half_range - 1;
  for (int j = 0; j < 16; ++j) {
    int lo = std::clamp(Nearest(x[j] * id) + half_range, 0, qmax);
    int hi = std::clamp(Nearest(x[j + 16] * id) + half_range, 0, qmax);
    qs[j] = (lo & 0xF) | ((hi & 0xF) << 4);
    qh |= ((lo >> 4) & 1u) << j;
    qh |= ((hi >> 4) & 1u) << (j + 16);
  }
  if (five_bit) StoreU32(b + 2, qh);
}

// Asymmetric formats: value = code * d + m with m the block minimum.
void QuantAsymmetric(const float* x, uint8_t* b, int qmax, bool five_bit) {
  float lo_v = x[0], hi_v = x[0];
  for (int j = 1; j < kQK; ++j) {
    lo_v = std::min(lo_v, x[j]);
    hi_v = std::max(hi_v, x[j]);
  }
  const float d = (hi_v - lo_v) / qmax;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  StoreHalf(b + 2, lo_v);
  uint8_t* qs = b + (five_bit ? 8 : 4);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    int lo = std::clamp(Nearest((x[j] - lo_v) * id), 0, qmax);
    int hi = std::clamp(Nearest((x[j + 16] - lo_v) * id), 0, qmax);
    qs[j] = (lo & 0xF) | ((hi & 0xF) << 4);
    qh |= ((lo >> 4) & 1u) << j;
    qh |= ((hi >> 4) & 1u) << (j + 16);
  }
  if (five_bit) StoreU32(b + 4, qh);
}

void QuantQ8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  StoreHalf(b, d);
  for (int j = 0; j < kQK; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(Nearest(x[j] * id), -127, 127)));
  }
}

// ---- K formats: scale search -----------------------------------------------------------------

// Fits x[i] ~= scale * L[i] - min_out with L in [0, nmax] and min_out >= 0 (the GGUF K formats
// store the negated minimum). Tries a range of grid scales, refits scale and min by least
// squares for each candidate assignment, keeps the one with the smallest squared error.
float FitScaleMin(const float* x, int n, int nmax, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // the format's min is subtracted, so keep it <= 0 in value space
  if (hi <= lo) {
    *min_out = -lo;
    return 0;
  }
  float best_err = INFINITY, best_scale = (hi - lo) / nmax, best_min = lo;
  for (int step = -4; step <= 12; ++step) {
    const float iscale = (nmax + 0.1f * step) / (hi - lo);
    // Assign codes for this grid, then solve the 2x2 least-squares system for (scale, min).
    double sl = 0, sll = 0, sx = 0, sxl = 0;
    int L[kQK_K];
    for (int i = 0; i < n; ++i) {
      L[i] = std::clamp(Nearest((x[i] - lo) * iscale), 0, nmax);
      sl += L[i];
      sll += static_cast<double>(L[i]) * L[i];
      sx += x[i];
      sxl += x[i] * L[i];
    }
    const double det = n * sll - sl * sl;
    if (det <= 0) continue;
    float scale = static_cast<float>((n * sxl - sl * sx) / det);
    float mn = static_cast<float>((sll * sx - sl * sxl) / det);
    if (mn > 0) {  // the min must stay <= 0: refit the scale alone with min = 0
      mn = 0;
      scale = sll > 0 ? static_cast<float>(sxl / sll) : 0;
    }
    if (scale < 0) continue;
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * L[i] + mn - x[i];
      err += diff * diff;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_min = mn;
    }
  }
  *min_out = -best_min;
  return best_scale;
}

// The element of x[0..n) of largest magnitude (the first of them), with its sign; 0 if all are 0.
float LargestMagnitude(const float* x, int n) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

// Fits x[i] ~= scale * L[i] with L in [-nmax - 1, nmax] (signed scale allowed).
float FitScaleSigned(const float* x, int n, int nmax) {
  const float max = LargestMagnitude(x, n);
  if (max == 0) return 0;
  float best_err = INFINITY, best_scale = 0;
  for (int step = -6; step <= 6; ++step) {
    const float iscale = -(nmax + 1 + 0.1f * step) / max;
    double sxl = 0, sll = 0;
    int L[kQK_K];
    for (int i = 0; i < n; ++i) {
      L[i] = std::clamp(Nearest(x[i] * iscale), -nmax - 1, nmax);
      sxl += x[i] * L[i];
      sll += static_cast<double>(L[i]) * L[i];
    }
    if (sll == 0) continue;
    const float scale = static_cast<float>(sxl / sll);
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * L[i] - x[i];
      err += diff * diff;
    }
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
    }
  }
  return best_scale;
}

// Q4_K / Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes: entries 0-3 in the low
// six bits of bytes 0-3 (scales) and 4-7 (mins); entries 4-7 keep their low nibbles in bytes
// 8-11 and their top two bits in the spare top bits of bytes 0-7.
void GetScaleMinK4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
void PackScaleMinK4(const int* sc, const int* m, uint8_t* q) {
  std::memset(q, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = sc[j];
      q[j + 4] = m[j];
    } else {
      q[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
      q[j - 4] |= (sc[j] >> 4) << 6;
      q[j] |= (m[j] >> 4) << 6;
    }
  }
}

// Shared by Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scale and min, quantized against the
// f16 super-block factors d and dmin. Produces codes L[256] in [0, nmax].
void QuantKScaleMin(const float* x, int nmax, uint8_t* d_dmin, uint8_t* scales12, int* L) {
  float scale[8], mn[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    scale[s] = FitScaleMin(x + 32 * s, 32, nmax, &mn[s]);
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, mn[s]);
  }
  const float d = max_scale / 63, dmin = max_min / 63;
  StoreHalf(d_dmin, d);
  StoreHalf(d_dmin + 2, dmin);
  const float dq = LoadHalf(d_dmin), dminq = LoadHalf(d_dmin + 2);  // as the decoder sees them
  int ls[8], lm[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = dq > 0 ? std::clamp(Nearest(scale[s] / dq), 0, 63) : 0;
    lm[s] = dminq > 0 ? std::clamp(Nearest(mn[s] / dminq), 0, 63) : 0;
    const float sd = dq * ls[s], sm = dminq * lm[s];
    for (int i = 0; i < 32; ++i) {
      L[32 * s + i] = sd > 0 ? std::clamp(Nearest((x[32 * s + i] + sm) / sd), 0, nmax) : 0;
    }
  }
  PackScaleMinK4(ls, lm, scales12);
}

// ---- K formats: blocks -----------------------------------------------------------------------

// Q2_K: [scales:16][qs:64][d:f16][dmin:f16]. Sub-block s (16 elements, 128*h + 32*j + 16*u + l
// with s = 8h + 2j + u) has scale nibble scales[s] & 15 and min nibble scales[s] >> 4; its
// 2-bit codes sit in qs[32h + 16u + l] at bit 2j.
void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = LoadHalf(b + 80), dmin = LoadHalf(b + 82);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int u = 0; u < 2; ++u) {
        const int s = 8 * h + 2 * j + u;
        const float dl = d * (scales[s] & 0xF), ml = dmin * (scales[s] >> 4);
        for (int l = 0; l < 16; ++l) {
          const int q = (qs[32 * h + 16 * u + l] >> (2 * j)) & 3;
          y[16 * s + l] = dl * q - ml;
        }
      }
}
void QuantQ2_K(const float* x, uint8_t* b) {
  std::memset(b, 0, 84);
  float scale[16], mn[16], max_scale = 0, max_min = 0;
  for (int s = 0; s < 16; ++s) {
    scale[s] = FitScaleMin(x + 16 * s, 16, 3, &mn[s]);
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, mn[s]);
  }
  StoreHalf(b + 80, max_scale / 15);
  StoreHalf(b + 82, max_min / 15);
  const float dq = LoadHalf(b + 80), dminq = LoadHalf(b + 82);
  uint8_t* qs = b + 16;
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int u = 0; u < 2; ++u) {
        const int s = 8 * h + 2 * j + u;
        const int ls = dq > 0 ? std::clamp(Nearest(scale[s] / dq), 0, 15) : 0;
        const int lm = dminq > 0 ? std::clamp(Nearest(mn[s] / dminq), 0, 15) : 0;
        b[s] = ls | (lm << 4);
        const float sd = dq * ls, sm = dminq * lm;
        for (int l = 0; l < 16; ++l) {
          const int q = sd > 0 ? std::clamp(Nearest((x[16 * s + l] + sm) / sd), 0, 3) : 0;
          qs[32 * h + 16 * u + l] |= q << (2 * j);
        }
      }
}

// Q3_K: [hmask:32][qs:64][scales:12][d:f16]. Same element order as Q2_K; the third bit of each
// code sits in hmask[16u + l] at bit 4h + j (set = code >= 4). Codes are stored offset by 4.
// The 16 signed six-bit scales (offset 32): low nibble of scale s in scales[s % 8] at bit
// 4 * (s / 8), top two bits in scales[8 + s % 4] at bit 2 * (s / 4).
int Q3Scale(const uint8_t* sc, int s) {
  const int lo = (sc[s % 8] >> (4 * (s / 8))) & 0xF;
  const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}
void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = LoadHalf(b + 108);
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int u = 0; u < 2; ++u) {
        const int s = 8 * h + 2 * j + u;
        const float dl = d * Q3Scale(sc, s);
        for (int l = 0; l < 16; ++l) {
          const int low = (qs[32 * h + 16 * u + l] >> (2 * j)) & 3;
          const int high = (hmask[16 * u + l] >> (4 * h + j)) & 1;
          y[16 * s + l] = dl * (low + 4 * high - 4);
        }
      }
}
void QuantQ3_K(const float* x, uint8_t* b) {
  std::memset(b, 0, 110);
  float scale[16], amax = 0, max = 0;
  for (int s = 0; s < 16; ++s) {
    scale[s] = FitScaleSigned(x + 16 * s, 16, 3);
    if (std::fabs(scale[s]) > amax) {
      amax = std::fabs(scale[s]);
      max = scale[s];
    }
  }
  StoreHalf(b + 108, max / -32);
  const float dq = LoadHalf(b + 108);
  uint8_t* hmask = b;
  uint8_t* qs = b + 32;
  uint8_t* sc = b + 96;
  for (int h = 0; h < 2; ++h)
    for (int j = 0; j < 4; ++j)
      for (int u = 0; u < 2; ++u) {
        const int s = 8 * h + 2 * j + u;
        const int ls = dq != 0 ? std::clamp(Nearest(scale[s] / dq), -32, 31) : 0;
        const int stored = ls + 32;
        sc[s % 8] |= (stored & 0xF) << (4 * (s / 8));
        sc[8 + s % 4] |= (stored >> 4) << (2 * (s / 4));
        const float sd = dq * ls;
        for (int l = 0; l < 16; ++l) {
          const int q = (sd != 0 ? std::clamp(Nearest(x[16 * s + l] / sd), -4, 3) : 0) + 4;
          qs[32 * h + 16 * u + l] |= (q & 3) << (2 * j);
          hmask[16 * u + l] |= (q >> 2) << (4 * h + j);
        }
      }
}

// Q4_K: [d:f16][dmin:f16][scales:12][qs:128]. Chunk c (64 elements) uses sub-blocks 2c, 2c+1:
// element 64c + l in the low nibble of qs[32c + l], element 64c + 32 + l in the high nibble.
void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    GetScaleMinK4(2 * c, scales, &sc0, &m0);
    GetScaleMinK4(2 * c + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d * sc0 * (qs[32 * c + l] & 0xF) - dmin * m0;
      y[64 * c + 32 + l] = d * sc1 * (qs[32 * c + l] >> 4) - dmin * m1;
    }
  }
}
void QuantQ4_K(const float* x, uint8_t* b) {
  int L[kQK_K];
  QuantKScaleMin(x, 15, b, b + 4, L);
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = L[64 * c + l] | (L[64 * c + 32 + l] << 4);
}

// Q5_K: [d:f16][dmin:f16][scales:12][qh:32][qs:128]. As Q4_K plus a fifth bit: element 64c + l
// in qh[l] bit 2c, element 64c + 32 + l in qh[l] bit 2c + 1.
void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    GetScaleMinK4(2 * c, scales, &sc0, &m0);
    GetScaleMinK4(2 * c + 1, scales, &sc1, &m1);
    for (int l = 0; l < 32; ++l) {
      const int q0 = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int q1 = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d * sc0 * q0 - dmin * m0;
      y[64 * c + 32 + l] = d * sc1 * q1 - dmin * m1;
    }
  }
}
void QuantQ5_K(const float* x, uint8_t* b) {
  int L[kQK_K];
  QuantKScaleMin(x, 31, b, b + 4, L);
  uint8_t* qh = b + 16;
  uint8_t* qs = b + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int q0 = L[64 * c + l], q1 = L[64 * c + 32 + l];
      qs[32 * c + l] = (q0 & 0xF) | ((q1 & 0xF) << 4);
      qh[l] |= ((q0 >> 4) << (2 * c)) | ((q1 >> 4) << (2 * c + 1));
    }
}

// Q6_K: [ql:128][qh:64][scales:16 int8][d:f16]. Half h (128 elements) uses ql[64h..], qh[32h..]
// and scales[8h..]; within it, element 32r + l (r = 0..3, l < 32) takes its low nibble from
// ql[l + 32 * (r & 1)] (high nibble when r >= 2), its top two bits from qh[l] at bit 2r, and
// scale scales[2r + l / 16]. Codes are stored offset by 32.
void DequantQ6_K(const uint8_t* b, float* y) {
  const float d = LoadHalf(b + 208);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < 32; ++l) {
        const int low = (ql[l + 32 * (r & 1)] >> (4 * (r >> 1))) & 0xF;
        const int high = (qh[l] >> (2 * r)) & 3;
        y[128 * h + 32 * r + l] = d * sc[2 * r + l / 16] * ((low | (high << 4)) - 32);
      }
  }
}
void QuantQ6_K(const float* x, uint8_t* b) {
  std::memset(b, 0, 210);
  // 16 sub-blocks of 16 in element order: sub-block s covers elements 16s..16s+15, which is
  // scale index 8h + 2r + l/16 with 16s = 128h + 32r + (l / 16) * 16 — the same number.
  float scale[16], amax = 0, max = 0;
  for (int s = 0; s < 16; ++s) {
    scale[s] = FitScaleSigned(x + 16 * s, 16, 31);
    if (std::fabs(scale[s]) > amax) {
      amax = std::fabs(scale[s]);
      max = scale[s];
    }
  }
  StoreHalf(b + 208, max / -128);
  const float dq = LoadHalf(b + 208);
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) sc[s] = dq != 0 ? std::clamp(Nearest(scale[s] / dq), -128, 127) : 0;
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = b + 64 * h;
    uint8_t* qh = b + 128 + 32 * h;
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < 32; ++l) {
        const int e = 128 * h + 32 * r + l;
        const float sd = dq * sc[e / 16];
        const int q = (sd != 0 ? std::clamp(Nearest(x[e] / sd), -32, 31) : 0) + 32;
        ql[l + 32 * (r & 1)] |= (q & 0xF) << (4 * (r >> 1));
        qh[l] |= (q >> 4) << (2 * r);
      }
  }
}

// ---- IQ4 formats: 4-bit indices into a non-linear codebook -------------------------------------
// A nibble is not a level but an index into kIq4nlValues (quant.h), 16 values denser near zero
// than a uniform grid, so a block spends its codes where most weights are. IQ4_NL blocks are
// Q4_0's shape with that codebook; IQ4_XS is the same 32-element layout with one f16 scale per
// 256 elements and a 6-bit signed sub-scale per 32.

// The index of the codebook value nearest to v. The midpoints between neighbouring values are
// multiples of 0.5, so a table over half-units, indexed by floor(2v), holds the answer for
// every v in [-128, 128) (outside, the end values are nearest).
struct Iq4NearestTable {
  uint8_t index[512];  // index[t + 256]: nearest value to v for floor(2v) == t
  Iq4NearestTable() {
    int i = 0;
    for (int t = -256; t < 256; ++t) {
      while (i < 15 && t >= kIq4nlValues[i] + kIq4nlValues[i + 1]) ++i;  // 2v past a midpoint
      index[t + 256] = static_cast<uint8_t>(i);
    }
  }
};
int NearestIq4(float v) {
  static const Iq4NearestTable table;
  const float t = std::floor(2.0f * std::clamp(v, -128.0f, 127.5f));
  return table.index[static_cast<int>(t) + 256];
}

// Indices of the codebook values nearest to x / scale; returns sum x*v and sum v*v over them.
void AssignIq4(const float* x, int n, float scale, uint8_t* idx, double* sxv, double* svv) {
  const float inv = scale != 0 ? 1.0f / scale : 0.0f;
  *sxv = *svv = 0;
  for (int i = 0; i < n; ++i) {
    idx[i] = static_cast<uint8_t>(NearestIq4(x[i] * inv));
    const float v = kIq4nlValues[idx[i]];
    *sxv += x[i] * v;
    *svv += v * v;
  }
}

// The scale of a block of n values under the codebook: candidate scales map the element of
// largest magnitude near either end of the codebook (-127 or 113: the sign of the scale is
// free); each candidate's assignment gets its least-squares scale sum(xv) / sum(vv), whose
// squared error is sum(xx) - sum(xv)^2 / sum(vv), so the best candidate has the largest
// sum(xv)^2 / sum(vv).
float FitIq4Scale(const float* x, int n) {
  const float max = LargestMagnitude(x, n);
  if (max == 0) return 0;
  double best_gain = -1;
  float best_scale = max / kIq4nlValues[0];
  uint8_t idx[kQK];
  for (const float end : {float{kIq4nlValues[0]}, float{kIq4nlValues[15]}}) {
    for (int step = -6; step <= 6; step += 2) {
      double sxv, svv;
      AssignIq4(x, n, max / (end + 2.0f * step), idx, &sxv, &svv);
      if (svv > 0 && sxv * sxv / svv > best_gain) {
        best_gain = sxv * sxv / svv;
        best_scale = static_cast<float>(sxv / svv);
      }
    }
  }
  return best_scale;
}

// 32 indices into 16 bytes: element j < 16 in the low nibble of qs[j], j + 16 in the high one.
void PackIq4Nibbles(const uint8_t* idx, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(idx[j] | (idx[j + 16] << 4));
}
void DequantIq4Nibbles(const uint8_t* qs, float d, float* y) {
  for (int j = 0; j < 16; ++j) {
    y[j] = d * kIq4nlValues[qs[j] & 0xF];
    y[j + 16] = d * kIq4nlValues[qs[j] >> 4];
  }
}

void DequantIQ4_NL(const uint8_t* b, float* y) {  // [d:f16][qs:16]
  DequantIq4Nibbles(b + 2, LoadHalf(b), y);
}
void QuantIQ4_NL(const float* x, uint8_t* b) {
  const float d = FitIq4Scale(x, kQK);
  StoreHalf(b, d);
  uint8_t idx[kQK];
  double sxv, svv;
  AssignIq4(x, kQK, LoadHalf(b), idx, &sxv, &svv);  // the indices under the stored (f16) scale
  PackIq4Nibbles(idx, b + 2);
}

// [d:f16][scales_h:u16][scales_l:4][qs:128]. Sub-block s (32 elements, qs + 16 s) has the
// 6-bit sub-scale ls = low nibble (s even) or high nibble (s odd) of scales_l[s / 2], plus bits
// 2s..2s+1 of scales_h as its bits 4-5; its scale is d * (ls - 32).
int Iq4XsSubScale(const uint8_t* b, int s) {
  const int scales_h = b[2] | (b[3] << 8);
  return ((b[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((scales_h >> (2 * s)) & 3) << 4);
}
void DequantIQ4_XS(const uint8_t* b, float* y) {
  const float d = LoadHalf(b);
  for (int s = 0; s < kQK_K / kQK; ++s) {
    DequantIq4Nibbles(b + 8 + 16 * s, d * (Iq4XsSubScale(b, s) - 32), y + kQK * s);
  }
}
void QuantIQ4_XS(const float* x, uint8_t* b) {
  constexpr int kSub = kQK_K / kQK;
  float scales[kSub];
  for (int s = 0; s < kSub; ++s) scales[s] = FitIq4Scale(x + kQK * s, kQK);
  const float max = LargestMagnitude(scales, kSub);
  // The sub-scale of largest magnitude takes ls - 32 = -32, the end of the signed 6-bit range.
  StoreHalf(b, max / -32);
  const float d = LoadHalf(b);
  const float id = d != 0 ? 1.0f / d : 0.0f;
  uint16_t scales_h = 0;
  std::memset(b + 4, 0, 4);
  for (int s = 0; s < kSub; ++s) {
    const int ls = std::clamp(Nearest(scales[s] * id) + 32, 0, 63);
    b[4 + s / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (s % 2)));
    scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * s));
    uint8_t idx[kQK];
    double sxv, svv;
    AssignIq4(x + kQK * s, kQK, d * (ls - 32), idx, &sxv, &svv);  // under the stored scale
    PackIq4Nibbles(idx, b + 8 + 16 * s);
  }
  b[2] = scales_h & 0xFF;
  b[3] = scales_h >> 8;
}

// ---- FP8 E4M3 in MX blocks ----------------------------------------------------------------
// [e:u8 E8M0 scale][32 E4M3 codes]. The scale is the smallest power of two s with
// amax / s <= 448 (E4M3's largest finite value), so no code saturates and the block's largest
// element keeps E4M3's full 3-bit mantissa; a power of two multiplies exactly.

void DequantFP8_E4M3(const uint8_t* b, float* y) {
  const float s = std::ldexp(1.0f, int(b[0]) - 127);
  for (int j = 0; j < 32; ++j) y[j] = s * Fp8E4M3ToFp32(b[1 + j]);
}
void QuantFP8_E4M3(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  int e = 0;  // log2 of the scale
  if (amax > 0) {
    int exp;
    const float f = std::frexp(amax / 448.0f, &exp);  // amax / 448 = f * 2^exp, f in [0.5, 1)
    e = f == 0.5f ? exp - 1 : exp;
  }
  e = std::clamp(e, -127, 127);
  b[0] = static_cast<uint8_t>(e + 127);
  const float inv = std::ldexp(1.0f, -e);
  for (int j = 0; j < kQK; ++j) b[1 + j] = Fp32ToFp8E4M3(x[j] * inv);
}

using DequantFn = void (*)(const uint8_t*, float*);
using QuantFn = void (*)(const float*, uint8_t*);

void QuantQ4_0(const float* x, uint8_t* b) { QuantSymmetric(x, b, 8, false); }
void QuantQ5_0(const float* x, uint8_t* b) { QuantSymmetric(x, b, 16, true); }
void QuantQ4_1(const float* x, uint8_t* b) { QuantAsymmetric(x, b, 15, false); }
void QuantQ5_1(const float* x, uint8_t* b) { QuantAsymmetric(x, b, 31, true); }

DequantFn BlockDequant(pc_dtype_t t) {
  switch (t) {
    case PC_DTYPE_Q4_0: return DequantQ4_0;
    case PC_DTYPE_Q4_1: return DequantQ4_1;
    case PC_DTYPE_Q5_0: return DequantQ5_0;
    case PC_DTYPE_Q5_1: return DequantQ5_1;
    case PC_DTYPE_Q8_0: return DequantQ8_0;
    case PC_DTYPE_Q2_K: return DequantQ2_K;
    case PC_DTYPE_Q3_K: return DequantQ3_K;
    case PC_DTYPE_Q4_K: return DequantQ4_K;
    case PC_DTYPE_Q5_K: return DequantQ5_K;
    case PC_DTYPE_Q6_K: return DequantQ6_K;
    case PC_DTYPE_IQ4_NL: return DequantIQ4_NL;
    case PC_DTYPE_IQ4_XS: return DequantIQ4_XS;
    case PC_DTYPE_FP8_E4M3: return DequantFP8_E4M3;
    default: return nullptr;
  }
}
QuantFn BlockQuant(pc_dtype_t t) {
  switch (t) {
    case PC_DTYPE_Q4_0: return QuantQ4_0;
    case PC_DTYPE_Q4_1: return QuantQ4_1;
    case PC_DTYPE_Q5_0: return QuantQ5_0;
    case PC_DTYPE_Q5_1: return QuantQ5_1;
    case PC_DTYPE_Q8_0: return QuantQ8_0;
    case PC_DTYPE_Q2_K: return QuantQ2_K;
    case PC_DTYPE_Q3_K: return QuantQ3_K;
    case PC_DTYPE_Q4_K: return QuantQ4_K;
    case PC_DTYPE_Q5_K: return QuantQ5_K;
    case PC_DTYPE_Q6_K: return QuantQ6_K;
    case PC_DTYPE_IQ4_NL: return QuantIQ4_NL;
    case PC_DTYPE_IQ4_XS: return QuantIQ4_XS;
    case PC_DTYPE_FP8_E4M3: return QuantFP8_E4M3;
    default: return nullptr;
  }
}

template <typename T>
void CastRow(const void* src, float* dst, int64_t n) {
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
template <typename T>
void CastRowBack(const float* src, void* dst, int64_t n) {
  T* d = static_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>) {
      d[i] = static_cast<T>(std::llrint(src[i]));
    } else {
      d[i] = static_cast<T>(src[i]);
    }
  }
}

}  // namespace

const DtypeInfo* GetDtypeInfo(pc_dtype_t dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return &e.info;
  }
  return nullptr;
}

const DtypeInfo* GetDtypeInfoOfValue(int32_t value) {
  for (const DtypeEntry& e : kDtypes) {
    if (static_cast<int32_t>(e.dtype) == value) return &e.info;
  }
  return nullptr;
}

const DtypeInfo* FindDtypeByName(const char* name, pc_dtype_t* dtype) {
  if (name == nullptr) return nullptr;
  for (const DtypeEntry& e : kDtypes) {
    const char* a = e.info.name;
    const char* b = name;
    while (*a && *b && std::toupper(static_cast<unsigned char>(*b)) == *a) ++a, ++b;
    if (*a == 0 && *b == 0) {
      if (dtype) *dtype = e.dtype;
      return &e.info;
    }
  }
  return nullptr;
}

int64_t RowBytes(pc_dtype_t dtype, int64_t n) {
  const DtypeInfo* info = GetDtypeInfo(dtype);
  if (info == nullptr || n < 0 || n % info->block_elems != 0) return -1;
  return n / info->block_elems * info->block_bytes;
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return BitsFloat(sign | 0x7F800000u | (mant << 13));  // inf / nan
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float v = std::ldexp(static_cast<float>(mant), -24);
  return sign ? -v : v;
}

uint16_t Fp32ToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = (u >> 16) & 0x8000;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00 | ((abs >> 13) & 0x3FF);  // nan stays nan
  if (abs >= 0x477FF000u) return sign | 0x7C00;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even by lrint's
    // default rounding mode. Exact: abs < 2^-14 so the quotient is below 1024.
    const float v = BitsFloat(abs) * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::lrintf(v));
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even; a carry
  // into the exponent is the correct result (also for the largest finite values).
  const uint32_t rebased = abs - (112u << 23);
  const uint32_t round = 0xFFF + ((rebased >> 13) & 1);
  return sign | static_cast<uint16_t>((rebased + round) >> 13);
}

float Fp8E4M3ToFp32(uint8_t c) {
  const int exp = (c >> 3) & 0xF, mant = c & 7;
  float v;
  if ((c & 0x7F) == 0x7F) {
    v = NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-9
  } else {
    v = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp - 7)
  }
  return (c & 0x80) ? -v : v;
}

uint8_t Fp32ToFp8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (std::isnan(a)) return sign | 0x7F;
  if (a >= 448.0f) return sign | 0x7E;  // saturate: E4M3 has no infinity
  int exp;
  std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1): the leading bit is 2^(exp - 1)
  // The quantum of a's binade (2^(exp - 4): three mantissa bits), or the subnormals' 2^-9.
  const int q_exp = std::max(exp - 4, -9);
  // Nearest even, in units of the quantum; 16 units (or 8 from a subnormal) carries into the
  // next binade, which the code below encodes as such.
  const int units = static_cast<int>(std::lrintf(std::ldexp(a, -q_exp)));
  if (units == 0) return sign;
  int e = q_exp + 3 + 7;  // biased exponent of a normal value whose quantum is 2^q_exp
  int m = units;
  if (m < 8) return sign | static_cast<uint8_t>(m);  // subnormal (q_exp == -9)
  if (m == 16) m = 8, ++e;
  if (e > 15 || (e == 15 && m - 8 == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((e << 3) | (m - 8));
}

float Bf16ToFp32(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

uint16_t Fp32ToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // nan
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

bool DequantizeRow(pc_dtype_t dtype, const void* src, float* dst, int64_t n) {
  const DtypeInfo* info = GetDtypeInfo(dtype);
  if (info == nullptr || n < 0 || n % info->block_elems != 0) return false;
  switch (dtype) {
    case PC_DTYPE_F32: std::memcpy(dst, src, n * sizeof(float)); return true;
    case PC_DTYPE_F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(s[i]);
      return true;
    }
    case PC_DTYPE_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(s[i]);
      return true;
    }
    case PC_DTYPE_I8: CastRow<int8_t>(src, dst, n); return true;
    case PC_DTYPE_I16: CastRow<int16_t>(src, dst, n); return true;
    case PC_DTYPE_I32: CastRow<int32_t>(src, dst, n); return true;
    case PC_DTYPE_I64: CastRow<int64_t>(src, dst, n); return true;
    case PC_DTYPE_F64: CastRow<double>(src, dst, n); return true;
    default: break;
  }
  DequantFn fn = BlockDequant(dtype);
  if (fn == nullptr) return false;
  const uint8_t* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / info->block_elems; ++i) {
    fn(b + i * info->block_bytes, dst + i * info->block_elems);
  }
  return true;
}

bool QuantizeRow(pc_dtype_t dtype, const float* src, void* dst, int64_t n) {
  const DtypeInfo* info = GetDtypeInfo(dtype);
  if (info == nullptr || n < 0 || n % info->block_elems != 0) return false;
  switch (dtype) {
    case PC_DTYPE_F32: std::memcpy(dst, src, n * sizeof(float)); return true;
    case PC_DTYPE_F16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToFp16(src[i]);
      return true;
    }
    case PC_DTYPE_BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = Fp32ToBf16(src[i]);
      return true;
    }
    case PC_DTYPE_I8: CastRowBack<int8_t>(src, dst, n); return true;
    case PC_DTYPE_I16: CastRowBack<int16_t>(src, dst, n); return true;
    case PC_DTYPE_I32: CastRowBack<int32_t>(src, dst, n); return true;
    case PC_DTYPE_I64: CastRowBack<int64_t>(src, dst, n); return true;
    case PC_DTYPE_F64: CastRowBack<double>(src, dst, n); return true;
    default: break;
  }
  QuantFn fn = BlockQuant(dtype);
  if (fn == nullptr) return false;
  uint8_t* b = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / info->block_elems; ++i) {
    fn(src + i * info->block_elems, b + i * info->block_bytes);
  }
  return true;
}

}  // namespace polychip::sdk
