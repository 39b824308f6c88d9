#include "cpu_kernels.h"

#include <omp.h>

#include <cstdint>
#include <vector>

#include "polychip/sdk/quant.h"

namespace polychip::cpu {

const char* Matmul(const pc_matmul_args_t& a, int threads) {
  const auto* x = reinterpret_cast<const float*>(a.x);        // [m, x_stride]
  const auto* w = reinterpret_cast<const uint8_t*>(a.w);      // [n, k] of w_dtype
  const auto* bias = reinterpret_cast<const float*>(a.bias);  // [n] or null
  auto* out = reinterpret_cast<float*>(a.out);                // [m, out_stride]
  if (a.m == 0) return nullptr;
  if (!x || !w || !out) return "null operand";
  const int64_t row_bytes = sdk::RowBytes(a.w_dtype, a.k);
  const bool f32 = a.w_dtype == PC_DTYPE_F32;
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> w_row(f32 ? 0 : a.k);  // this thread's dequantized weight row
#pragma omp for schedule(static)
    for (int64_t j = 0; j < a.n; ++j) {
      const float* wr = reinterpret_cast<const float*>(w + j * row_bytes);
      if (!f32) {
        sdk::DequantizeRow(a.w_dtype, w + j * row_bytes, w_row.data(), a.k);
        wr = w_row.data();
      }
      const float b = bias ? bias[j] : 0.0f;
      for (int64_t i = 0; i < a.m; ++i) {
        const float* xi = x + i * a.x_stride;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < a.k; ++k) sum += xi[k] * wr[k];
        float& y = out[i * a.out_stride + j];
        y = a.accumulate ? y + sum + b : sum + b;
      }
    }
  }
  return nullptr;
}

}  // namespace polychip::cpu
