// Op launches for code outside src/runtime: plain C++ structs that mirror the ABI's pc_*_args
// (include/polychip/plugin/pc_ops.h documents each member's meaning and shape), so the model
// code never includes the ABI. Each launch is stream-ordered; argument errors return at once,
// execution errors surface at the next Stream::Synchronize.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::runtime {

// The ops of include/polychip/plugin/pc_ops.def (the op set as data), as Op::k<Name>.
enum class Op : int32_t {
#define PC_OP(NAME, name, Camel, id, ...) k##Camel = id,
#include "polychip_op_list.def"  // include/polychip/plugin/pc_ops.def
#undef PC_OP
};
const char* OpName(Op op);              // "matmul"
std::optional<Op> OpFromName(std::string_view name);
std::vector<Op> AllOps();              // in id order

enum class ShapeClass : int32_t { kAny = 0, kDecode = 1, kPrefill = 2 };

constexpr uint32_t kLayoutGguf = 0;

// dtypes as in pc_op_query: EMBEDDING {table}; MATMUL {weight}; KV_STORE/ATTENTION {cache};
// CONVERT {src, dst}; others {F32}. `layout`: of the EMBEDDING table or MATMUL weight, a tag
// from DeviceWeight::layout(); a plugin older than ABI 1.2 cannot be asked about one other than
// kLayoutGguf, and the answer then is false.
bool SupportsOp(const Device& device, Op op, std::initializer_list<DType> dtypes,
                ShapeClass shape_class = ShapeClass::kAny, uint32_t layout = kLayoutGguf);

enum class RopeMode : int32_t { kNormal = 0, kNeox = 2 };

// True when `member`, appended in a later ABI minor, holds what a plugin older than it assumes
// in its absence, so that such a plugin may run the launch: KV_STORE's and ATTENTION's
// v_cache_dtype (1.6) equal to cache_dtype. Of an ABI args struct or its C++ mirror.
template <typename Args>
bool ReadsAsAbsent(const Args& a, std::string_view member) {
  if constexpr (requires { a.v_cache_dtype; }) {
    return member == "v_cache_dtype" && a.v_cache_dtype == a.cache_dtype;
  }
  return false;
}

// Whether the dtype member of `role` (pc_ops.def's DTYPES) says something in this launch: MOE's
// lora_a (1.7) only when it has low-rank terms (without, a query says PC_DTYPE_INVALID).
template <typename Args>
bool DtypeMeant(const Args& a, std::string_view role) {
  if constexpr (requires { a.gate_lora_a; }) {
    if (role == "lora_a") return a.gate_lora_a != 0 || a.up_lora_a != 0 || a.down_lora_a != 0;
  }
  return true;
}

// The C++ mirrors of the ABI's args structs, generated from the op list: <Name>Args has the
// members of pc_<name>_args_t in the same order (pc_ops.h documents each one's meaning and
// shape), with C++ types (DevPtr, DType, RopeMode), all zero by default. Launch(stream, args)
// converts and launches; a MATMUL x_stride/out_stride of 0 means k/n. CanLaunch(device, args)
// says whether Launch would run it: on the device (its plugin knows every member set and says
// yes to the query) or on its op fallback; for a launch whose support is not settled at load
// (MOE's low-rank terms, 1.7), so that the caller can take another path instead.
// RunsOnDevice(device, args): on the device itself, not its fallback; for a launch that only
// speeds up what the caller can also express with ops the device has (LORA, 1.8), where the
// fallback's staging through host memory would cost more than it saves.
namespace ops_internal {
using CppOf_pc_dtype_t = DType;
using CppOf_pc_rope_mode_t = RopeMode;
using CppOf_int64_t = int64_t;
using CppOf_int32_t = int32_t;
using CppOf_uint32_t = uint32_t;
using CppOf_float = float;
}  // namespace ops_internal

#define PC_M(type, m, since) ops_internal::CppOf_##type m{};
#define PC_PTR(m, access, bytes, since) DevPtr m = 0;
#define PC_OP(NAME, name, Camel, id, args_t, since, DTYPES, LAYOUT, MEMBERS) \
  struct Camel##Args {                                                      \
    MEMBERS                                                                 \
  };                                                                        \
  Status Launch(const Stream& stream, const Camel##Args& args);             \
  bool CanLaunch(const Device& device, const Camel##Args& args);            \
  bool RunsOnDevice(const Device& device, const Camel##Args& args);
#include "polychip_op_list.def"  // include/polychip/plugin/pc_ops.def
#undef PC_OP
#undef PC_PTR
#undef PC_M

// A weight matrix [rows, cols] on a device: uploaded through the plugin's weight_upload (which
// may repack it; `layout` then is the plugin's tag) or, when the plugin has none, allocated and
// copied as GGUF bytes. Freed on destruction.
class DeviceWeight {
 public:
  static StatusOr<std::unique_ptr<DeviceWeight>> Upload(const std::shared_ptr<Device>& device,
                                                        DType dtype, int64_t rows, int64_t cols,
                                                        const void* host_data,
                                                        uint64_t host_bytes);
  ~DeviceWeight();
  DeviceWeight(const DeviceWeight&) = delete;
  DeviceWeight& operator=(const DeviceWeight&) = delete;

  DevPtr data() const { return data_; }
  uint32_t layout() const { return layout_; }
  uint64_t bytes() const { return bytes_; }
  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

 private:
  DeviceWeight() = default;
  std::shared_ptr<Device> device_;
  DevPtr data_ = 0;
  uint32_t layout_ = kLayoutGguf;
  uint64_t bytes_ = 0;
  DType dtype_ = DType::kF32;
  int64_t rows_ = 0, cols_ = 0;
  bool plugin_owned_ = false;  // weight_free rather than mem_free
};

}  // namespace polychip::runtime
