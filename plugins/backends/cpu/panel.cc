#include "panel.h"

#include <algorithm>
#include <cstring>

#include "polychip/sdk/quant.h"

namespace polychip::cpu {

bool PanelDtype(pc_dtype_t dtype) {
  return dtype == PC_DTYPE_F16 || dtype == PC_DTYPE_BF16 || dtype == PC_DTYPE_F32;
}

int64_t PanelElemBytes(pc_dtype_t dtype) { return dtype == PC_DTYPE_F32 ? 4 : 2; }

int64_t PanelBytes(pc_dtype_t dtype, int64_t n, int64_t k) {
  return (n + kPanelRows - 1) / kPanelRows * kPanelRows * k * PanelElemBytes(dtype);
}

namespace {

// Writes the panel sequentially, reading the 32 source rows as 32 sequential streams.
template <typename T>
void PackPanelsOf(const T* src, int64_t n, int64_t k, int64_t p0, int64_t p1, T* dst) {
  const T* rows[kPanelRows];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t valid = std::min<int64_t>(kPanelRows, n - p * kPanelRows);
    for (int64_t r = 0; r < valid; ++r) rows[r] = src + (p * kPanelRows + r) * k;
    T* panel = dst + p * kPanelRows * k;
    for (int64_t e = 0; e < k; ++e) {
      T* col = panel + e * kPanelRows;
      for (int64_t r = 0; r < valid; ++r) col[r] = rows[r][e];
      for (int64_t r = valid; r < kPanelRows; ++r) col[r] = T{0};  // padding rows
    }
  }
}

}  // namespace

void PackPanels(pc_dtype_t dtype, const uint8_t* src, int64_t n, int64_t k, int64_t p0,
                int64_t p1, uint8_t* dst) {
  if (PanelElemBytes(dtype) == 4) {
    PackPanelsOf(reinterpret_cast<const uint32_t*>(src), n, k, p0, p1,
                 reinterpret_cast<uint32_t*>(dst));
  } else {
    PackPanelsOf(reinterpret_cast<const uint16_t*>(src), n, k, p0, p1,
                 reinterpret_cast<uint16_t*>(dst));
  }
}

void UnpackPanelRow(pc_dtype_t dtype, const uint8_t* panels, int64_t k, int64_t row, float* out) {
  const int64_t es = PanelElemBytes(dtype);
  const uint8_t* panel = panels + (row / kPanelRows) * kPanelRows * k * es;
  const int64_t r = row % kPanelRows;
  for (int64_t e = 0; e < k; ++e) {
    const uint8_t* v = panel + (e * kPanelRows + r) * es;
    uint16_t h;
    switch (dtype) {
      case PC_DTYPE_F16:
        std::memcpy(&h, v, 2);
        out[e] = sdk::Fp16ToFp32(h);
        break;
      case PC_DTYPE_BF16:
        std::memcpy(&h, v, 2);
        out[e] = sdk::Bf16ToFp32(h);
        break;
      default:
        std::memcpy(&out[e], v, 4);
    }
  }
}

}  // namespace polychip::cpu
