// The KV cache's element types, K's and V's chosen apart (--kv-cache-dtype-k/-v): floats, or
// the block types that quantize each head's row of head_dim (pc_ops.h: q8_0 and q4_0 in GGUF's
// layouts, fp8_e4m3 in MX blocks with a power-of-two scale per 32 values).
#pragma once

#include <cstdint>
#include <string>

#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

struct KvCacheDtypes {
  DType k = DType::kF16;
  DType v = DType::kF16;
  bool operator==(const KvCacheDtypes&) const = default;
};

// F32, F16, BF16, Q8_0, Q4_0 or FP8_E4M3.
bool IsKvCacheDtype(DType dtype);

// Bytes of one token's rows of n_heads heads of head_dim elements in `dtype` (each head's row
// its own blocks); -1 when head_dim is not a multiple of the dtype's block.
int64_t KvRowBytes(DType dtype, int64_t n_heads, int64_t head_dim);

// OK when both are cache types and head_dim (and head_dim_v, V's) splits into their blocks;
// else INVALID_ARGUMENT naming the type and the head size.
Status CheckKvCacheDtypes(const KvCacheDtypes& dtypes, int64_t head_dim, int64_t head_dim_v);

// "q8_0", "f16": the flag's spelling.
std::string KvCacheDtypeName(DType dtype);

// "q8_0" when K and V agree, else "k=q8_0 v=f16" (logs, the coverage table).
std::string KvCacheDtypesText(const KvCacheDtypes& dtypes);

}  // namespace polychip::model
