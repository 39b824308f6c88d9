#include "model/kv_cache_dtypes.h"

#include <cctype>
#include <tuple>

namespace polychip::model {

std::string KvCacheDtypeName(DType dtype) {
  std::string out(DTypeName(dtype));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IsKvCacheDtype(DType d) {
  switch (d) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kFP8_E4M3: return true;
    default: return false;
  }
}

int64_t KvRowBytes(DType dtype, int64_t n_heads, int64_t head_dim) {
  const int64_t row = RowBytes(dtype, head_dim);
  return row < 0 ? -1 : n_heads * row;
}

Status CheckKvCacheDtypes(const KvCacheDtypes& t, int64_t head_dim, int64_t head_dim_v) {
  for (auto [dtype, dim, which] : {std::tuple{t.k, head_dim, "K"}, {t.v, head_dim_v, "V"}}) {
    if (!IsKvCacheDtype(dtype)) {
      return InvalidArgument(std::string("KV cache type of ") + which +
                             " must be f16, bf16, f32, q8_0, q4_0 or fp8_e4m3, not " +
                             KvCacheDtypeName(dtype));
    }
    if (RowBytes(dtype, dim) < 0) {
      return InvalidArgument(std::string("KV cache type ") + KvCacheDtypeName(dtype) + " of " +
                             which + " quantizes blocks of " + std::to_string(BlockElems(dtype)) +
                             " values; this model's head size " + std::to_string(dim) +
                             " is not a multiple of it");
    }
  }
  return Status::Ok();
}

std::string KvCacheDtypesText(const KvCacheDtypes& t) {
  if (t.k == t.v) return KvCacheDtypeName(t.k);
  return "k=" + KvCacheDtypeName(t.k) + " v=" + KvCacheDtypeName(t.v);
}

}  // namespace polychip::model
