// polychip SDK — element types and GGUF block formats, for plugin authors and the framework.
//
// The SDK is a small static library installed with the ABI headers. It is not part of the ABI
// (nothing here crosses a plugin boundary); it spares every plugin from re-deriving the block
// layouts: half/bfloat conversion, row sizes, and reference quantize/dequantize of one row.
#pragma once

#include <cstddef>
#include <cstdint>

#include "polychip/plugin/pc_common.h"

namespace polychip::sdk {

struct DtypeInfo {
  const char* name;      // "F32", "Q4_K", ... as GGUF tools print them
  int64_t block_elems;   // elements per block (1 for plain types)
  int64_t block_bytes;   // bytes per block
  bool quantized;
};

// nullptr for an unknown dtype.
const DtypeInfo* GetDtypeInfo(pc_dtype_t dtype);
// The same for a raw number (a type read from a file): converting a number outside the enum's
// range to pc_dtype_t is undefined behaviour, so untrusted values are looked up as numbers.
const DtypeInfo* GetDtypeInfoOfValue(int32_t value);
// nullptr if unknown; accepts upper or lower case ("q8_0").
const DtypeInfo* FindDtypeByName(const char* name, pc_dtype_t* dtype);
// Bytes of a row of n elements; -1 if n is not a multiple of the block or dtype is unknown.
int64_t RowBytes(pc_dtype_t dtype, int64_t n);

float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);     // round to nearest even
float Bf16ToFp32(uint16_t b);
uint16_t Fp32ToBf16(float f);     // round to nearest even
// FP8 E4M3 (OCP): 0x7F/0xFF are NaN; no infinity, so values past 448 saturate to +-448.
float Fp8E4M3ToFp32(uint8_t c);
uint8_t Fp32ToFp8E4M3(float f);   // round to nearest even, saturating

// The codebook of IQ4_NL and IQ4_XS: a 4-bit code q stands for kIq4nlValues[q] times the block's
// scale (the GGUF format's values, sorted).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Reference (scalar) conversions of one row of n elements. Return false for an unsupported
// dtype or an n that is not a multiple of the block size.
bool DequantizeRow(pc_dtype_t dtype, const void* src, float* dst, int64_t n);
bool QuantizeRow(pc_dtype_t dtype, const float* src, void* dst, int64_t n);

}  // namespace polychip::sdk
