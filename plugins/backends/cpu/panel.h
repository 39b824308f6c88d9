// The cpu plugin's layout for float weight matrices (F16, BF16, F32) on ISAs with a panel GEMM
// kernel ("panels", layout tag kLayoutPanel), chosen at weight_upload.
//
// Rows are taken kPanelRows (32) at a time and stored column by column within the panel: for
// each element index e, the 32 rows' values are adjacent (64 bytes for F16/BF16, one cache
// line). The GEMM then loads 32 weights with one instruction (converting F16/BF16 to f32 in
// registers) and multiplies them by one broadcast activation: no separate conversion pass over
// the weights and no transposed copy of the activations, which together cost ~20% of F16
// prefill with the GGUF layout. Same size as the GGUF matrix; the row count is padded to a
// multiple of 32 with zero rows.
#pragma once

#include <cstdint>

#include "polychip/plugin/pc_common.h"

namespace polychip::cpu {

constexpr int64_t kPanelRows = 32;
// The layout tag weight_upload returns for panel weights (w_dtype still says the element type).
constexpr uint32_t kLayoutPanel = 0x43505532u;  // "2UPC"

// True for the element types panels hold (F16, BF16, F32).
bool PanelDtype(pc_dtype_t dtype);
// Bytes per element of a panel dtype.
int64_t PanelElemBytes(pc_dtype_t dtype);
// Bytes of a [n, k] matrix in panels.
int64_t PanelBytes(pc_dtype_t dtype, int64_t n, int64_t k);
// Rearranges panels [p0, p1) of a GGUF [n, k] matrix into `dst` (the whole panel buffer).
// Panels are independent, so callers may split the range across threads.
void PackPanels(pc_dtype_t dtype, const uint8_t* src, int64_t n, int64_t k, int64_t p0,
                int64_t p1, uint8_t* dst);
// Row `row` of a panel matrix, converted to f32 (out[k]).
void UnpackPanelRow(pc_dtype_t dtype, const uint8_t* panels, int64_t k, int64_t row, float* out);

}  // namespace polychip::cpu
