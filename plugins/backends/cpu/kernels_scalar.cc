// The portable kernel table: plain C++ for any CPU. Compiled without -m flags; it is the
// fallback on CPUs without AVX2 and the baseline the faster variants are tested against.
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "kquant.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace scalar {

#include "kernels_float.inc"

void QuantizeRow(const float* x, int64_t k, int64_t scale_block, ActBlock* out) {
  for (int64_t g = 0; g < k / scale_block; ++g) {
    const float* xg = x + g * scale_block;
    float amax = 0;
    for (int64_t i = 0; i < scale_block; ++i) amax = std::max(amax, std::fabs(xg[i]));
    float d, id;
    ActScale(amax, scale_block, &d, &id);
    for (int64_t b = 0; b < scale_block / kBlock; ++b) {
      const float* xb = xg + b * kBlock;
      ActBlock& a = out[g * (scale_block / kBlock) + b];
      a.d = d;
      a.sum[0] = a.sum[1] = 0;
      for (int i = 0; i < kBlock; ++i) {
        a.q[i] = static_cast<int8_t>(std::nearbyint(xb[i] * id));
        a.sum[i / 16] += a.q[i];
      }
    }
  }
}

// Unsigned quant of element e of row r in a packed cell.
inline int Quant(const PackedFormat& f, const uint8_t* q, int r, int e) {
  if (f.q4) {
    const uint8_t byte = q[64 * ((e % 16) / 4) + 4 * r + e % 4];
    const int index = e < 16 ? byte & 0xF : byte >> 4;
    return f.codebook ? sdk::kIq4nlValues[index] + 128 : index;
  }
  return q[64 * (e / 4) + 4 * r + e % 4];
}

void GemmPacked(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  if (f.planes) return GemmPlanes(f, group, kb, x, x_stride, m, tile);  // kquant.h
  for (int64_t i = 0; i < m; ++i) {
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0;
      const uint8_t* cell = group;
      for (int64_t b = 0; b < kb; ++b, cell += f.block_bytes()) {
        const ActBlock& a = x[i * x_stride + b];
        const uint16_t* scales = reinterpret_cast<const uint16_t*>(cell + f.quant_bytes());
        int32_t half[2] = {0, 0};
        for (int e = 0; e < kBlock; ++e) half[e / 16] += Quant(f, cell, r, e) * a.q[e];
        half[0] -= f.offset * a.sum[0];
        half[1] -= f.offset * a.sum[1];
        if (f.half_scales) {
          acc += a.d * (sdk::Fp16ToFp32(scales[r]) * half[0] +
                        sdk::Fp16ToFp32(scales[kPackRows + r]) * half[1]);
        } else {
          acc += a.d * sdk::Fp16ToFp32(scales[r]) * (half[0] + half[1]);
        }
        if (f.has_min) {
          const uint16_t* mins = scales + f.scale_bytes() / 2;
          acc -= sdk::Fp16ToFp32(mins[r]) * a.d * (a.sum[0] + a.sum[1]);
        }
      }
      tile[i * kPackRows + r] = acc;
    }
  }
}

float DotF16(const float* x, const uint16_t* w, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i] * sdk::Fp16ToFp32(w[i]);
  return s;
}

void F16ToF32Row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sdk::Fp16ToFp32(x[i]);
}

void F32ToF16Row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = sdk::Fp32ToFp16(x[i]);
}

}  // namespace scalar

const KernelTable& ScalarKernels() {
  static const KernelTable t = {
      "scalar",          Isa::kScalar,       scalar::QuantizeRow, scalar::GemmPacked,
      scalar::DotF32,    scalar::Dot4F32, scalar::Dot4x4F32,    scalar::DotF16,      scalar::DotBf16,
      scalar::F16ToF32Row, scalar::Bf16ToF32Row, scalar::F32ToF16Row, scalar::AxpyF32,
      scalar::ScaleF32,
      scalar::Swiglu,    scalar::Geglu,    scalar::CacheRowsToF32, scalar::ExpSum,
      scalar::RmsNorm,
      /*gemm_t_f32=*/nullptr, /*gemm_panel=*/nullptr, /*gemm_packed_streams=*/nullptr,
      scalar::CacheRowsToF32T,
  };
  return t;
}

}  // namespace polychip::cpu
