#include "polychip/sdk/comm_util.h"

#include <algorithm>

#include "polychip/sdk/quant.h"

namespace polychip::sdk {
namespace {

// How a dtype is loaded into its accumulator and stored back.
template <typename Storage, typename Accum>
struct Plain {
  using T = Storage;
  using Acc = Accum;
  static Acc Load(T v) { return static_cast<Acc>(v); }
  static T Store(Acc a) { return static_cast<T>(a); }
};
struct Half {
  using T = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return Fp16ToFp32(v); }
  static uint16_t Store(float a) { return Fp32ToFp16(a); }
};
struct BHalf {
  using T = uint16_t;
  using Acc = float;
  static float Load(uint16_t v) { return Bf16ToFp32(v); }
  static uint16_t Store(float a) { return Fp32ToBf16(a); }
};

template <typename Acc>
Acc Apply(pc_reduce_op_t op, Acc a, Acc b) {
  switch (op) {
    case PC_REDUCE_SUM: return a + b;
    case PC_REDUCE_MAX: return a > b ? a : b;
    case PC_REDUCE_MIN: return a < b ? a : b;
    case PC_REDUCE_PROD: return a * b;
  }
  return a;
}

template <typename Tr, pc_reduce_op_t Op>
void ReduceTyped(const uint8_t* const* srcs, int32_t n_src, void* dst, uint64_t count) {
  using T = typename Tr::T;
  using Acc = typename Tr::Acc;
  // Blocks keep the accumulators in cache while every source streams through once.
  constexpr uint64_t kBlock = 1024;
  Acc acc[kBlock];
  T* out = static_cast<T*>(dst);
  for (uint64_t b = 0; b < count; b += kBlock) {
    const uint64_t len = std::min(kBlock, count - b);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + b;
    for (uint64_t i = 0; i < len; ++i) acc[i] = Tr::Load(s0[i]);
    for (int32_t r = 1; r < n_src; ++r) {
      const T* s = reinterpret_cast<const T*>(srcs[r]) + b;
      for (uint64_t i = 0; i < len; ++i) acc[i] = Apply<Acc>(Op, acc[i], Tr::Load(s[i]));
    }
    for (uint64_t i = 0; i < len; ++i) out[b + i] = Tr::Store(acc[i]);
  }
}

template <typename Tr>
void ReduceOp(pc_reduce_op_t op, const uint8_t* const* srcs, int32_t n, void* dst, uint64_t count) {
  switch (op) {
    case PC_REDUCE_SUM: return ReduceTyped<Tr, PC_REDUCE_SUM>(srcs, n, dst, count);
    case PC_REDUCE_MAX: return ReduceTyped<Tr, PC_REDUCE_MAX>(srcs, n, dst, count);
    case PC_REDUCE_MIN: return ReduceTyped<Tr, PC_REDUCE_MIN>(srcs, n, dst, count);
    case PC_REDUCE_PROD: return ReduceTyped<Tr, PC_REDUCE_PROD>(srcs, n, dst, count);
  }
}

}  // namespace

size_t ElementSize(pc_dtype_t dtype) {
  switch (dtype) {
    case PC_DTYPE_I8: return 1;
    case PC_DTYPE_F16: case PC_DTYPE_BF16: case PC_DTYPE_I16: return 2;
    case PC_DTYPE_F32: case PC_DTYPE_I32: return 4;
    case PC_DTYPE_F64: case PC_DTYPE_I64: return 8;
    default: return 0;
  }
}

void Reduce(pc_dtype_t dtype, pc_reduce_op_t op, const uint8_t* const* srcs, int32_t n_src,
            void* dst, uint64_t count) {
  switch (dtype) {
    case PC_DTYPE_F32: return ReduceOp<Plain<float, float>>(op, srcs, n_src, dst, count);
    case PC_DTYPE_F64: return ReduceOp<Plain<double, double>>(op, srcs, n_src, dst, count);
    case PC_DTYPE_F16: return ReduceOp<Half>(op, srcs, n_src, dst, count);
    case PC_DTYPE_BF16: return ReduceOp<BHalf>(op, srcs, n_src, dst, count);
    case PC_DTYPE_I8: return ReduceOp<Plain<int8_t, int64_t>>(op, srcs, n_src, dst, count);
    case PC_DTYPE_I16: return ReduceOp<Plain<int16_t, int64_t>>(op, srcs, n_src, dst, count);
    case PC_DTYPE_I32: return ReduceOp<Plain<int32_t, int64_t>>(op, srcs, n_src, dst, count);
    case PC_DTYPE_I64: return ReduceOp<Plain<int64_t, int64_t>>(op, srcs, n_src, dst, count);
    default: return;
  }
}

std::vector<float> WidenToF32(pc_dtype_t dtype, const void* src, uint64_t count) {
  std::vector<float> out(count);
  const auto* h = static_cast<const uint16_t*>(src);
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = dtype == PC_DTYPE_F16 ? Fp16ToFp32(h[i]) : Bf16ToFp32(h[i]);
  }
  return out;
}

void NarrowFromF32(pc_dtype_t dtype, const std::vector<float>& src, void* dst) {
  auto* h = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < src.size(); ++i) {
    h[i] = dtype == PC_DTYPE_F16 ? Fp32ToFp16(src[i]) : Fp32ToBf16(src[i]);
  }
}

}  // namespace polychip::sdk
