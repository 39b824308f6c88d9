// C++ op structs -> ABI args structs, generated from the op list. Each conversion sets
// struct_size so that a plugin built against a newer ABI treats members appended later as
// absent.
#include "runtime/ops.h"

#include "polychip/sdk/op_list.h"
#include "runtime/abi_internal.h"
#include "runtime/op_fallback.h"

namespace polychip::runtime {
namespace {

pc_dtype_t D(DType d) { return static_cast<pc_dtype_t>(static_cast<int32_t>(d)); }

// Members a launch fills in for the caller: MATMUL strides of 0 mean "rows are packed".
template <typename Args>
void CompleteArgs(Args&) {}
void CompleteArgs(pc_matmul_args_t& r) {
  if (r.x_stride == 0) r.x_stride = r.k;
  if (r.out_stride == 0) r.out_stride = r.n;
}

}  // namespace

const char* OpName(Op op) { return sdk::OpName(static_cast<pc_op_t>(op)); }

std::optional<Op> OpFromName(std::string_view name) {
  pc_op_t op;
  if (!sdk::OpFromName(std::string(name).c_str(), &op)) return std::nullopt;
  return static_cast<Op>(op);
}

std::vector<Op> AllOps() {
  std::vector<Op> ops;
  sdk::ForEachOp([&](auto t) { ops.push_back(static_cast<Op>(decltype(t)::kOp)); });
  return ops;
}

// The one place that asks a plugin's op_supports (SupportsOp and the op fallback).
bool AskOpSupports(const Device& device, const pc_op_query_t& q) {
  // The query's layout member came in 1.2: an older plugin would answer for the GGUF layout.
  if (q.layout != kLayoutGguf && device.backend()->abi_minor() < 2) return false;
  // V's cache dtype came in 1.6: an older plugin reads K's for both, so it can only be asked
  // about a pair of equal types.
  if ((q.op == PC_OP_KV_STORE || q.op == PC_OP_ATTENTION) && device.backend()->abi_minor() < 6 &&
      q.dtypes[1] != PC_DTYPE_INVALID && q.dtypes[1] != q.dtypes[0])
    return false;
  // MOE's low-rank terms came in 1.7: an older plugin ignores dtypes[3] (and would ignore the
  // terms at launch), so it is not asked.
  if (q.op == PC_OP_MOE && q.dtypes[3] != PC_DTYPE_INVALID && device.backend()->abi_minor() < 7)
    return false;
  const pc_backend_iface_t* t = TableOf(*device.backend());
  return t->op_supports(static_cast<pc_device_t*>(device.raw()), &q) != 0;
}

bool SupportsOp(const Device& device, Op op, std::initializer_list<DType> dtypes,
                ShapeClass shape_class, uint32_t layout) {
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = static_cast<pc_op_t>(op);
  for (auto& d : q.dtypes) d = PC_DTYPE_INVALID;
  size_t i = 0;
  for (DType d : dtypes) {
    if (i < 4) q.dtypes[i++] = D(d);
  }
  q.shape_class = static_cast<pc_shape_class_t>(shape_class);
  q.layout = layout;
  return AskOpSupports(device, q);
}

const char* NewerMemberInUse(pc_op_t op, const void* args, uint32_t minor) {
  return sdk::VisitOp(op, static_cast<const char*>(nullptr), [&](auto t) {
    using T = decltype(t);
    const char* found = nullptr;
    auto check = [&](const char* name, uint32_t since, size_t offset, size_t size) {
      if (found != nullptr || since <= T::kSince || since <= minor) return;
      if (ReadsAsAbsent(*static_cast<const typename T::Args*>(args), name)) return;
      const auto* bytes = static_cast<const uint8_t*>(args) + offset;
      for (size_t i = 0; i < size; ++i) {
        if (bytes[i] != 0) found = name;
      }
    };
    T::Members(sdk::MemberVisitor{
        [&](auto, const char* name, uint32_t since, size_t offset, size_t size) {
          check(name, since, offset, size);
        },
        [&](auto, const char* name, sdk::Access, auto, uint32_t since, size_t offset) {
          check(name, since, offset, sizeof(pc_devptr_t));
        }});
    return found;
  });
}

Status LaunchOnStream(const Stream& stream, pc_op_t op, void* args) {
  const pc_backend_iface_t* t = TableOf(*stream.device().backend());
  return TakeError(t, t->op_launch(static_cast<pc_stream_t*>(stream.raw()), op, args),
                   sdk::OpName(op));
}

// A plugin ignores the members appended after its ABI minor: a launch that sets one (a window
// for a 1.3 plugin's ATTENTION) would silently compute something else, so it is refused.
Status CheckMembersKnown(const Device& device, pc_op_t op, const void* args) {
  const uint32_t minor = device.backend()->abi_minor();
  const char* member = NewerMemberInUse(op, args, minor);
  if (member == nullptr) return Status::Ok();
  return FailedPrecondition(std::string(sdk::OpName(op)) + "." + member + " is set, but the " +
                            device.backend()->name() + " plugin is ABI 1." +
                            std::to_string(minor) + ", older than the member: run the op on a " +
                            "newer plugin with --op-fallback cpu, or update the plugin");
}

pc_op_query_t OpQueryOf(pc_op_t op, const void* args);  // op_fallback.cc

// Whether `device`'s own plugin runs a launch of `args`: it knows every member set and says
// yes to the query `q`.
bool RunsOn(const Device& device, pc_op_t op, const void* args, const pc_op_query_t& q) {
  return NewerMemberInUse(op, args, device.backend()->abi_minor()) == nullptr &&
         AskOpSupports(device, q);
}

bool CanLaunchArgs(const Device& device, pc_op_t op, const void* args, bool fallback_too) {
  const pc_op_query_t q = OpQueryOf(op, args);
  if (RunsOn(device, op, args, q)) return true;
  // The fallback reads weights in the GGUF layout only (op_fallback.cc).
  const OpFallback* fallback = fallback_too ? device.op_fallback() : nullptr;
  return fallback != nullptr && q.layout == PC_LAYOUT_GGUF &&
         RunsOn(fallback->device(), op, args, q);
}

// Generated from the op list: C++ mirror -> ABI struct, member by member (ToAbi), then the launch
// on the stream's device, or on its fallback device when it lacks the op (op_fallback.h).
#define PC_M(type, m, since) r.m = static_cast<decltype(r.m)>(a.m);
#define PC_PTR(m, access, bytes, since) r.m = a.m;
#define PC_OP(NAME, name, Camel, id, args_t, since, DTYPES, LAYOUT, MEMBERS) \
  static args_t ToAbi(const Camel##Args& a) {                               \
    args_t r{};                                                             \
    r.struct_size = sizeof(r);                                              \
    MEMBERS                                                                 \
    CompleteArgs(r);                                                        \
    return r;                                                               \
  }                                                                         \
  Status Launch(const Stream& stream, const Camel##Args& a) {               \
    args_t r = ToAbi(a);                                                    \
    if (OpFallback* fallback = stream.device().op_fallback()) {             \
      if (fallback->ShouldFallBack(stream.device(), PC_OP_##NAME, &r))      \
        return fallback->Launch(stream, PC_OP_##NAME, &r);                  \
    }                                                                       \
    PC_RETURN_IF_ERROR(CheckMembersKnown(stream.device(), PC_OP_##NAME, &r)); \
    return LaunchOnStream(stream, PC_OP_##NAME, &r);                        \
  }                                                                         \
  bool CanLaunch(const Device& device, const Camel##Args& a) {              \
    const args_t r = ToAbi(a);                                              \
    return CanLaunchArgs(device, PC_OP_##NAME, &r, true);                   \
  }                                                                         \
  bool RunsOnDevice(const Device& device, const Camel##Args& a) {           \
    const args_t r = ToAbi(a);                                              \
    return CanLaunchArgs(device, PC_OP_##NAME, &r, false);                  \
  }
#include "polychip/plugin/pc_ops.def"
#undef PC_OP
#undef PC_PTR
#undef PC_M

// ---- weights -----------------------------------------------------------------------------

StatusOr<std::unique_ptr<DeviceWeight>> DeviceWeight::Upload(
    const std::shared_ptr<Device>& device, DType dtype, int64_t rows, int64_t cols,
    const void* host_data, uint64_t host_bytes) {
  const int64_t row_bytes = RowBytes(dtype, cols);
  if (row_bytes < 0 || static_cast<uint64_t>(row_bytes * rows) != host_bytes) {
    return InvalidArgument(std::string("weight [") + std::to_string(rows) + ", " +
                           std::to_string(cols) + "] of " + DTypeName(dtype) + " is not " +
                           std::to_string(host_bytes) + " bytes");
  }
  std::unique_ptr<DeviceWeight> w(new DeviceWeight());
  w->device_ = device;
  w->dtype_ = dtype;
  w->rows_ = rows;
  w->cols_ = cols;
  const pc_backend_iface_t* t = TableOf(*device->backend());
  if (t->weight_upload != nullptr) {
    pc_weight_t out{};
    out.struct_size = sizeof(out);
    PC_RETURN_IF_ERROR(TakeError(
        t,
        t->weight_upload(static_cast<pc_device_t*>(device->raw()), D(dtype), rows, cols,
                         host_data, host_bytes, &out),
        "weight_upload"));
    w->data_ = out.data;
    w->layout_ = out.layout;
    w->bytes_ = out.bytes;
    w->plugin_owned_ = true;
    device->AccountPluginOwned(static_cast<int64_t>(w->bytes_));
    if (w->layout_ == kLayoutGguf) device->MarkImmutable(w->data_, w->bytes_);
    return w;
  }
  // No upload hook: allocate and copy the GGUF bytes as they are.
  PC_ASSIGN_OR_RETURN(w->data_, device->AllocateRaw(host_bytes));
  w->bytes_ = host_bytes;
  auto stream = device->CreateStream(0);
  if (!stream.ok()) return stream.status();  // ~DeviceWeight frees data_
  PC_RETURN_IF_ERROR((*stream)->CopyH2D(w->data_, host_data, host_bytes));
  PC_RETURN_IF_ERROR((*stream)->Synchronize());  // host_data may be released on return
  device->MarkImmutable(w->data_, w->bytes_);
  return w;
}

DeviceWeight::~DeviceWeight() {
  if (device_ == nullptr || data_ == 0) return;
  if (plugin_owned_) {
    const pc_backend_iface_t* t = TableOf(*device_->backend());
    pc_weight_t wt{};
    wt.struct_size = sizeof(wt);
    wt.data = data_;
    wt.layout = layout_;
    wt.bytes = bytes_;
    (void)TakeError(t, t->weight_free(static_cast<pc_device_t*>(device_->raw()), &wt),
                    "weight_free");
    device_->AccountPluginOwned(-static_cast<int64_t>(bytes_));
  } else {
    (void)device_->FreeRaw(data_);
  }
}

}  // namespace polychip::runtime
