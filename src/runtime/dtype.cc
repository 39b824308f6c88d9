// Forwards to the SDK's block-format code so that the GGUF reader, the quantizer and the
// plugins all share one definition of each layout.
#include "runtime/dtype.h"

#include "polychip/sdk/quant.h"

namespace polychip {
namespace {
const sdk::DtypeInfo* Info(DType d) { return sdk::GetDtypeInfo(static_cast<pc_dtype_t>(d)); }
}  // namespace

bool IsKnownDType(int32_t value) { return sdk::GetDtypeInfoOfValue(value) != nullptr; }
const char* DTypeName(DType d) { return Info(d) ? Info(d)->name : "UNKNOWN"; }
std::optional<DType> DTypeFromName(std::string_view name) {
  pc_dtype_t d;
  std::string s(name);
  if (!sdk::FindDtypeByName(s.c_str(), &d)) return std::nullopt;
  return static_cast<DType>(d);
}
int64_t BlockElems(DType d) { return Info(d) ? Info(d)->block_elems : 0; }
int64_t BlockBytes(DType d) { return Info(d) ? Info(d)->block_bytes : 0; }
bool IsQuantized(DType d) { return Info(d) && Info(d)->quantized; }
int64_t RowBytes(DType d, int64_t n) { return sdk::RowBytes(static_cast<pc_dtype_t>(d), n); }
float Fp16ToFp32(uint16_t h) { return sdk::Fp16ToFp32(h); }
uint16_t Fp32ToFp16(float f) { return sdk::Fp32ToFp16(f); }
float Bf16ToFp32(uint16_t b) { return sdk::Bf16ToFp32(b); }
uint16_t Fp32ToBf16(float f) { return sdk::Fp32ToBf16(f); }
bool DequantizeRow(DType d, const void* src, float* dst, int64_t n) {
  return sdk::DequantizeRow(static_cast<pc_dtype_t>(d), src, dst, n);
}
bool QuantizeRow(DType d, const float* src, void* dst, int64_t n) {
  return sdk::QuantizeRow(static_cast<pc_dtype_t>(d), src, dst, n);
}

}  // namespace polychip
