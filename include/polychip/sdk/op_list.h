// polychip SDK — the op list (include/polychip/plugin/pc_ops.def) as C++ types.
//
// OpTraits<PC_OP_X> describes one op: its args struct, name, the ABI minor that added it, the
// members carrying its dtypes and weight layout, and every member with its access and extent.
// ForEachOp / VisitOp run generic code over every op or one op chosen at run time, so that
// dispatch tables (args sizes, validation, reference kernels, names, host fallback, coverage)
// are written once for all ops instead of once per op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "polychip/plugin/pc_ops.h"
#include "polychip/sdk/quant.h"

namespace polychip::sdk {

// How an op uses a device address member.
enum class Access {
  kIn,      // read
  kOut,     // written
  kInOut,   // read and written
  kWeight,  // an immutable weight [rows, cols] of the op's first dtype, in its layout
  kPaged,   // a paged KV cache, reached through slots or block tables
};
inline const char* AccessName(Access a) {
  switch (a) {
    case Access::kIn: return "in";
    case Access::kOut: return "out";
    case Access::kInOut: return "inout";
    case Access::kWeight: return "weight";
    case Access::kPaged: return "paged";
  }
  return "?";
}

// What the reference kernels accept for a dtype member.
// kLowRank: MOE's low-rank terms (1.7): F32, F16, BF16 or Q8_0, PC_DTYPE_INVALID for none.
enum class DtypeKind { kWeight, kCache, kFloat, kLowRank };

// The extent of an address member: bytes (kIn/kOut/kInOut), or the shape of a weight.
struct Extent {
  constexpr Extent(int64_t b) : bytes(b) {}  // NOLINT: implicit, the .def writes plain bytes
  constexpr Extent(int64_t b, int64_t r, int64_t c) : bytes(b), rows(r), cols(c) {}
  int64_t bytes = 0;
  int64_t rows = 0, cols = 0;  // kWeight only
};

template <pc_op_t kOp>
struct OpTraits;  // one specialisation per op, below

// Generated: OpTraits<PC_OP_X>. Visitors receive, in declaration order,
//   Members(v):  v.Scalar(member_ptr, "name", since, offset, size)
//                v.Pointer(member_ptr, "name", Access, extent_fn(const Args&) -> Extent, since,
//                          offset)
//   Dtypes(v):   v(member_ptr, "role", DtypeKind)
//   Layout(v):   v(member_ptr)   (not called when the op has no weight layout)
#define PC_WEIGHT_SHAPE(rows, cols) ::polychip::sdk::Extent(-1, (rows), (cols))
#define PC_DTYPE_BYTES(dtype, n) ::polychip::sdk::RowBytes((dtype), (n))
#define PC_M(type, m, since) v.Scalar(&Args::m, #m, since, offsetof(Args, m), sizeof(type));
#define PC_PTR(m, access, bytes, since)                                                   \
  v.Pointer(&Args::m, #m, Access::k##access,                                              \
            [](const Args& a) -> Extent { return Extent(bytes); }, since, offsetof(Args, m));
#define PC_DT(m, role, kind) v(&Args::m, #role, DtypeKind::k##kind);
#define PC_LAYOUT(m) v(&Args::m);
#define PC_OP(NAME, lower, Camel, ID, ARGS, SINCE, DTYPES, LAYOUT, MEMBERS) \
  template <>                                                               \
  struct OpTraits<PC_OP_##NAME> {                                           \
    using Args = ARGS;                                                      \
    static constexpr pc_op_t kOp = PC_OP_##NAME;                            \
    static constexpr const char* kName = #lower;                            \
    static constexpr uint32_t kSince = SINCE;                               \
    template <typename V>                                                   \
    static constexpr void Members(V&& v) { MEMBERS }                        \
    template <typename V>                                                   \
    static constexpr void Dtypes(V&& v) { DTYPES }                          \
    template <typename V>                                                   \
    static constexpr void Layout(V&& v) { LAYOUT }                          \
  };
#include "polychip/plugin/pc_ops.def"
#undef PC_OP
#undef PC_LAYOUT
#undef PC_DT
#undef PC_PTR
#undef PC_M
#undef PC_DTYPE_BYTES
#undef PC_WEIGHT_SHAPE

// f(OpTraits<PC_OP_X>{}) for every op, in id order.
template <typename F>
constexpr void ForEachOp(F&& f) {
#define PC_OP(NAME, ...) f(OpTraits<PC_OP_##NAME>{});
#include "polychip/plugin/pc_ops.def"
#undef PC_OP
}

// f(OpTraits<op>{}) for the op with this id, or `otherwise` for an unknown id.
template <typename R, typename F>
R VisitOp(pc_op_t op, R otherwise, F&& f) {
  switch (op) {
#define PC_OP(NAME, ...) \
  case PC_OP_##NAME: return f(OpTraits<PC_OP_##NAME>{});
#include "polychip/plugin/pc_ops.def"
#undef PC_OP
    default: return otherwise;
  }
}

// A Members() visitor from two callables: scalar(member_ptr, name, since, offset, size) and
// pointer(member_ptr, name, access, extent_fn, since, offset).
template <typename S, typename P>
struct MemberVisitor {
  S scalar;
  P pointer;
  template <typename... A>
  constexpr void Scalar(A&&... a) { scalar(a...); }
  template <typename... A>
  constexpr void Pointer(A&&... a) { pointer(a...); }
};
template <typename S, typename P>
MemberVisitor(S, P) -> MemberVisitor<S, P>;

namespace op_list_internal {

// The smallest struct_size a host may pass: the end of the last member of the op's first
// version (members appended later are absent from it).
template <typename T>
struct FirstVersionEnd {
  size_t end = sizeof(size_t);
  template <typename M>
  constexpr void Scalar(M, const char*, uint32_t since, size_t offset, size_t size) {
    if (since <= T::kSince && offset + size > end) end = offset + size;
  }
  template <typename M, typename E>
  constexpr void Pointer(M, const char*, Access, E, uint32_t since, size_t offset) {
    Scalar(nullptr, "", since, offset, sizeof(pc_devptr_t));
  }
};

// The member list describes the struct exactly: members in order, each right after the
// previous one (up to alignment padding), the last one ending the struct.
template <typename T>
struct LayoutCheck {
  size_t end = sizeof(size_t);  // struct_size comes first
  bool ok = true;
  template <typename M>
  constexpr void Scalar(M, const char*, uint32_t, size_t offset, size_t size) {
    if (offset < end || offset >= end + size) ok = false;
    end = offset + size;
  }
  template <typename M, typename E>
  constexpr void Pointer(M, const char*, Access, E, uint32_t, size_t offset) {
    Scalar(nullptr, "", 0, offset, sizeof(pc_devptr_t));
  }
};

template <typename T>
constexpr bool MembersMatchStruct() {
  LayoutCheck<T> c;
  T::Members(c);
  return c.ok && sizeof(typename T::Args) - c.end < alignof(typename T::Args);
}

}  // namespace op_list_internal

template <typename T>
constexpr size_t OpArgsMinSizeOf() {
  op_list_internal::FirstVersionEnd<T> v;
  T::Members(v);
  return v.end;
}

#define PC_OP(NAME, ...)                                                          \
  static_assert(op_list_internal::MembersMatchStruct<OpTraits<PC_OP_##NAME>>(), \
                "pc_ops.def: the member list of " #NAME " differs from its args struct");
#include "polychip/plugin/pc_ops.def"
#undef PC_OP

// The op's lowercase name ("matmul"), or "unknown".
inline const char* OpName(pc_op_t op) {
  return VisitOp(op, "unknown", [](auto t) { return decltype(t)::kName; });
}
// The op named `name` (lowercase, as in pc_ops.def); false when there is none.
inline bool OpFromName(const char* name, pc_op_t* op) {
  bool found = false;
  ForEachOp([&](auto t) {
    if (!found && std::strcmp(decltype(t)::kName, name) == 0) {
      *op = decltype(t)::kOp;
      found = true;
    }
  });
  return found;
}

}  // namespace polychip::sdk
