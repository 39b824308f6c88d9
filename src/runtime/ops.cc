// C++ op structs -> ABI args structs. Each conversion sets struct_size so that a plugin built
// against a newer ABI treats members appended later as absent.
#include "runtime/ops.h"

#include "runtime/abi_internal.h"

namespace polychip::runtime {
namespace {

pc_dtype_t D(DType d) { return static_cast<pc_dtype_t>(static_cast<int32_t>(d)); }

template <typename Args>
Status LaunchRaw(const Stream& stream, pc_op_t op, Args* args, const char* what) {
  args->struct_size = sizeof(Args);
  const pc_backend_iface_t* t = TableOf(*stream.device().backend());
  return TakeError(t, t->op_launch(static_cast<pc_stream_t*>(stream.raw()), op, args), what);
}

}  // namespace

const char* OpName(Op op) {
  switch (op) {
    case Op::kEmbedding: return "embedding";
    case Op::kRmsNorm: return "rms_norm";
    case Op::kMatmul: return "matmul";
    case Op::kRope: return "rope";
    case Op::kKvStore: return "kv_store";
    case Op::kAttention: return "attention";
    case Op::kSwiglu: return "swiglu";
    case Op::kAdd: return "add";
    case Op::kConvert: return "convert";
  }
  return "unknown";
}

bool SupportsOp(const Device& device, Op op, std::initializer_list<DType> dtypes,
                ShapeClass shape_class, uint32_t layout) {
  // The query's layout member came in 1.2: an older plugin would answer for the GGUF layout.
  if (layout != kLayoutGguf && device.backend()->abi_minor() < 2) return false;
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
  const pc_backend_iface_t* t = TableOf(*device.backend());
  return t->op_supports(static_cast<pc_device_t*>(device.raw()), &q) != 0;
}

Status Launch(const Stream& stream, const EmbeddingArgs& a) {
  pc_embedding_args_t r{};
  r.table = a.table;
  r.table_dtype = D(a.table_dtype);
  r.table_layout = a.table_layout;
  r.n_rows = a.n_rows;
  r.row_len = a.row_len;
  r.ids = a.ids;
  r.n_ids = a.n_ids;
  r.out = a.out;
  return LaunchRaw(stream, PC_OP_EMBEDDING, &r, "embedding");
}

Status Launch(const Stream& stream, const RmsNormArgs& a) {
  pc_rms_norm_args_t r{};
  r.x = a.x;
  r.weight = a.weight;
  r.out = a.out;
  r.n_rows = a.n_rows;
  r.dim = a.dim;
  r.eps = a.eps;
  return LaunchRaw(stream, PC_OP_RMS_NORM, &r, "rms_norm");
}

Status Launch(const Stream& stream, const MatmulArgs& a) {
  pc_matmul_args_t r{};
  r.x = a.x;
  r.w = a.w;
  r.w_dtype = D(a.w_dtype);
  r.w_layout = a.w_layout;
  r.bias = a.bias;
  r.out = a.out;
  r.m = a.m;
  r.n = a.n;
  r.k = a.k;
  r.x_stride = a.x_stride != 0 ? a.x_stride : a.k;
  r.out_stride = a.out_stride != 0 ? a.out_stride : a.n;
  r.accumulate = a.accumulate ? 1 : 0;
  return LaunchRaw(stream, PC_OP_MATMUL, &r, "matmul");
}

Status Launch(const Stream& stream, const RopeArgs& a) {
  pc_rope_args_t r{};
  r.x = a.x;
  r.positions = a.positions;
  r.freq_factors = a.freq_factors;
  r.n_tokens = a.n_tokens;
  r.n_heads = a.n_heads;
  r.head_dim = a.head_dim;
  r.n_rot = a.n_rot;
  r.mode = static_cast<pc_rope_mode_t>(a.mode);
  r.freq_base = a.freq_base;
  r.freq_scale = a.freq_scale;
  r.ext_factor = a.ext_factor;
  r.attn_factor = a.attn_factor;
  r.beta_fast = a.beta_fast;
  r.beta_slow = a.beta_slow;
  r.n_ctx_orig = a.n_ctx_orig;
  return LaunchRaw(stream, PC_OP_ROPE, &r, "rope");
}

Status Launch(const Stream& stream, const KvStoreArgs& a) {
  pc_kv_store_args_t r{};
  r.k = a.k;
  r.v = a.v;
  r.k_cache = a.k_cache;
  r.v_cache = a.v_cache;
  r.slots = a.slots;
  r.cache_dtype = D(a.cache_dtype);
  r.n_tokens = a.n_tokens;
  r.n_kv_heads = a.n_kv_heads;
  r.head_dim = a.head_dim;
  r.block_size = a.block_size;
  return LaunchRaw(stream, PC_OP_KV_STORE, &r, "kv_store");
}

Status Launch(const Stream& stream, const AttentionArgs& a) {
  pc_attention_args_t r{};
  r.q = a.q;
  r.k_cache = a.k_cache;
  r.v_cache = a.v_cache;
  r.out = a.out;
  r.query_start = a.query_start;
  r.seq_lens = a.seq_lens;
  r.block_tables = a.block_tables;
  r.cache_dtype = D(a.cache_dtype);
  r.n_tokens = a.n_tokens;
  r.n_seqs = a.n_seqs;
  r.n_heads = a.n_heads;
  r.n_kv_heads = a.n_kv_heads;
  r.head_dim = a.head_dim;
  r.block_size = a.block_size;
  r.max_blocks_per_seq = a.max_blocks_per_seq;
  r.max_seq_len = a.max_seq_len;
  r.scale = a.scale;
  return LaunchRaw(stream, PC_OP_ATTENTION, &r, "attention");
}

Status Launch(const Stream& stream, const SwigluArgs& a) {
  pc_swiglu_args_t r{};
  r.gate = a.gate;
  r.up = a.up;
  r.out = a.out;
  r.n = a.n;
  return LaunchRaw(stream, PC_OP_SWIGLU, &r, "swiglu");
}

Status Launch(const Stream& stream, const AddArgs& a) {
  pc_add_args_t r{};
  r.a = a.a;
  r.b = a.b;
  r.out = a.out;
  r.n = a.n;
  return LaunchRaw(stream, PC_OP_ADD, &r, "add");
}

Status Launch(const Stream& stream, const ConvertArgs& a) {
  pc_convert_args_t r{};
  r.src = a.src;
  r.dst = a.dst;
  r.src_dtype = D(a.src_dtype);
  r.dst_dtype = D(a.dst_dtype);
  r.n = a.n;
  return LaunchRaw(stream, PC_OP_CONVERT, &r, "convert");
}

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
    return w;
  }
  // No upload hook: allocate and copy the GGUF bytes as they are.
  PC_ASSIGN_OR_RETURN(w->data_, device->AllocateRaw(host_bytes));
  w->bytes_ = host_bytes;
  auto stream = device->CreateStream(0);
  if (!stream.ok()) return stream.status();  // ~DeviceWeight frees data_
  PC_RETURN_IF_ERROR((*stream)->CopyH2D(w->data_, host_data, host_bytes));
  PC_RETURN_IF_ERROR((*stream)->Synchronize());  // host_data may be released on return
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
  } else {
    (void)device_->FreeRaw(data_);
  }
}

}  // namespace polychip::runtime
