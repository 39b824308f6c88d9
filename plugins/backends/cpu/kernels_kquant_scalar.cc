// The plane-layout packed GEMM (kquant.h) in plain C++: the reference the SIMD variants are tested
// against, and the fallback on CPUs without AVX2.
#include <cstring>

#include "kernels.h"
#include "kquant.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu::scalar {

void GemmPlanes(const PackedFormat& f, const uint8_t* group, int64_t kb, const ActBlock* x,
                int64_t x_stride, int64_t m, float* tile) {
  const int64_t super_bytes = KSuperBytes(f), cell_bytes = KCellBytes(f), cells = KCells(f);
  const int nsub = static_cast<int>(KSubBlocks(f)), sub_len = kBlock / nsub;
  for (int64_t i = 0; i < m; ++i) {
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < kb; ++b) {
        const uint8_t* hdr = group + b / cells * super_bytes;
        const uint8_t* cell = hdr + KHeaderBytes(f) + b % cells * cell_bytes;
        uint16_t d16, dmin16 = 0;
        std::memcpy(&d16, hdr + 2 * r, 2);
        if (f.has_min) std::memcpy(&dmin16, hdr + 32 + 2 * r, 2);
        const float d = sdk::Fp16ToFp32(d16), dmin = sdk::Fp16ToFp32(dmin16);
        const ActBlock& a = x[i * x_stride + b];
        for (int s = 0; s < nsub; ++s) {
          int32_t dot = 0, sum = 0;
          for (int e = s * sub_len; e < (s + 1) * sub_len; ++e) {
            dot += KQuantCode(f, cell, r, e) * a.q[e];
            sum += a.q[e];
          }
          int sc, mn;
          KQuantScaleMin(f, cell, r, s, &sc, &mn);
          // d * sc and dmin * m are exact in f32, as the format multiplies them.
          acc += a.d * (d * static_cast<float>(sc) * static_cast<float>(dot - f.offset * sum) -
                        dmin * static_cast<float>(mn) * static_cast<float>(sum));
        }
      }
      tile[i * kPackRows + r] = acc;
    }
  }
}

}  // namespace polychip::cpu::scalar
