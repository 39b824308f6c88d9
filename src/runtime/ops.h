// Op launches for code outside src/runtime: plain C++ structs that mirror the ABI's pc_*_args
// (include/polychip/plugin/pc_ops.h documents each member's meaning and shape), so the model
// code never includes the ABI. Each launch is stream-ordered; argument errors return at once,
// execution errors surface at the next Stream::Synchronize.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>

#include "runtime/device.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::runtime {

enum class Op : int32_t {
  kEmbedding = 1,
  kRmsNorm = 2,
  kMatmul = 3,
  kRope = 4,
  kKvStore = 5,
  kAttention = 6,
  kSwiglu = 7,
  kAdd = 8,
  kConvert = 9,
};
const char* OpName(Op op);

enum class ShapeClass : int32_t { kAny = 0, kDecode = 1, kPrefill = 2 };

constexpr uint32_t kLayoutGguf = 0;

// dtypes as in pc_op_query: EMBEDDING {table}; MATMUL {weight}; KV_STORE/ATTENTION {cache};
// CONVERT {src, dst}; others {F32}. `layout`: of the EMBEDDING table or MATMUL weight, a tag
// from DeviceWeight::layout(); a plugin older than ABI 1.2 cannot be asked about one other than
// kLayoutGguf, and the answer then is false.
bool SupportsOp(const Device& device, Op op, std::initializer_list<DType> dtypes,
                ShapeClass shape_class = ShapeClass::kAny, uint32_t layout = kLayoutGguf);

struct EmbeddingArgs {
  DevPtr table = 0;  // [n_rows, row_len] of table_dtype, in layout table_layout
  DType table_dtype = DType::kF32;
  uint32_t table_layout = kLayoutGguf;  // another only where SupportsOp said so
  int64_t n_rows = 0, row_len = 0;
  DevPtr ids = 0;  // int32 [n_ids]
  int64_t n_ids = 0;
  DevPtr out = 0;  // f32 [n_ids, row_len]
};
struct RmsNormArgs {
  DevPtr x = 0;       // f32 [n_rows, dim]
  DevPtr weight = 0;  // f32 [dim] or 0
  DevPtr out = 0;     // f32 [n_rows, dim]; may equal x
  int64_t n_rows = 0, dim = 0;
  float eps = 1e-6f;
};
struct MatmulArgs {
  DevPtr x = 0;  // f32 [m, k], rows x_stride apart
  DevPtr w = 0;  // w_dtype [n, k] in layout w_layout
  DType w_dtype = DType::kF32;
  uint32_t w_layout = kLayoutGguf;
  DevPtr bias = 0;  // f32 [n] or 0
  DevPtr out = 0;   // f32 [m, n], rows out_stride apart
  int64_t m = 0, n = 0, k = 0;
  int64_t x_stride = 0, out_stride = 0;  // 0: k and n
  bool accumulate = false;
};
enum class RopeMode : int32_t { kNormal = 0, kNeox = 2 };
struct RopeArgs {
  DevPtr x = 0;             // f32 [n_tokens, n_heads, head_dim], in place
  DevPtr positions = 0;     // int32 [n_tokens]
  DevPtr freq_factors = 0;  // f32 [n_rot / 2] or 0
  int64_t n_tokens = 0, n_heads = 0, head_dim = 0;
  int32_t n_rot = 0;
  RopeMode mode = RopeMode::kNormal;
  float freq_base = 10000.f, freq_scale = 1.f, ext_factor = 0.f, attn_factor = 1.f;
  float beta_fast = 32.f, beta_slow = 1.f;
  int32_t n_ctx_orig = 0;
};
struct KvStoreArgs {
  DevPtr k = 0, v = 0;              // f32 [n_tokens, n_kv_heads, head_dim]
  DevPtr k_cache = 0, v_cache = 0;  // [n_blocks, block_size, n_kv_heads, head_dim]
  DevPtr slots = 0;                 // int32 [n_tokens]
  DType cache_dtype = DType::kF32;
  int64_t n_tokens = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
};
struct AttentionArgs {
  DevPtr q = 0;  // f32 [n_tokens, n_heads, head_dim]
  DevPtr k_cache = 0, v_cache = 0;
  DevPtr out = 0;           // f32 [n_tokens, n_heads, head_dim]
  DevPtr query_start = 0;   // int32 [n_seqs + 1]
  DevPtr seq_lens = 0;      // int32 [n_seqs]
  DevPtr block_tables = 0;  // int32 [n_seqs, max_blocks_per_seq]
  DType cache_dtype = DType::kF32;
  int64_t n_tokens = 0, n_seqs = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t block_size = 0, max_blocks_per_seq = 0, max_seq_len = 0;
  float scale = 1.f;
};
struct SwigluArgs {
  DevPtr gate = 0, up = 0, out = 0;  // f32 [n]
  int64_t n = 0;
};
struct AddArgs {
  DevPtr a = 0, b = 0, out = 0;  // f32 [n]
  int64_t n = 0;
};
struct ConvertArgs {
  DevPtr src = 0, dst = 0;
  DType src_dtype = DType::kF32, dst_dtype = DType::kF32;
  int64_t n = 0;
};

Status Launch(const Stream& stream, const EmbeddingArgs& args);
Status Launch(const Stream& stream, const RmsNormArgs& args);
Status Launch(const Stream& stream, const MatmulArgs& args);
Status Launch(const Stream& stream, const RopeArgs& args);
Status Launch(const Stream& stream, const KvStoreArgs& args);
Status Launch(const Stream& stream, const AttentionArgs& args);
Status Launch(const Stream& stream, const SwigluArgs& args);
Status Launch(const Stream& stream, const AddArgs& args);
Status Launch(const Stream& stream, const ConvertArgs& args);

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
