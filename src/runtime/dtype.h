// Element types as the framework sees them. Numerically identical to the ABI's pc_dtype_t (and
// so to GGUF's ggml_type), but the framework outside src/runtime never includes the ABI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace polychip {

enum class DType : int32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kFP8_E4M3 = 100,  // KV caches only: MX blocks of 32 (pc_common.h); not a GGUF type
};

// False for numbers that are not a known type (e.g. from a corrupt GGUF file).
bool IsKnownDType(int32_t value);
const char* DTypeName(DType dtype);  // "Q4_K"
std::optional<DType> DTypeFromName(std::string_view name);  // case-insensitive
int64_t BlockElems(DType dtype);
int64_t BlockBytes(DType dtype);
bool IsQuantized(DType dtype);
// Bytes of a row of n elements; -1 if n is not a multiple of the block size.
int64_t RowBytes(DType dtype, int64_t n);

float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
float Bf16ToFp32(uint16_t b);
uint16_t Fp32ToBf16(float f);

// Scalar reference conversions of one row (n a multiple of the block size).
bool DequantizeRow(DType dtype, const void* src, float* dst, int64_t n);
bool QuantizeRow(DType dtype, const float* src, void* dst, int64_t n);

}  // namespace polychip
