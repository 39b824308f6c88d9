#include "model/model_loader.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace polychip::model {

using runtime::DevPtr;

PoolBuffer::~PoolBuffer() {
  if (pool_ && block_) (void)pool_->Free(block_);
}

PoolBuffer& PoolBuffer::operator=(PoolBuffer&& other) noexcept {
  if (this != &other) {
    if (pool_ && block_) (void)pool_->Free(block_);
    pool_ = std::move(other.pool_);
    block_ = other.block_;
    other.block_ = {};
  }
  return *this;
}

StatusOr<PoolBuffer> PoolBuffer::Allocate(const std::shared_ptr<runtime::MemoryPool>& pool,
                                          uint64_t bytes) {
  PC_ASSIGN_OR_RETURN(runtime::PoolBlock block, pool->Allocate(bytes));
  return PoolBuffer(pool, block);
}

RowSplit PlanRowSplit(int64_t rows, int64_t row_bytes, uint64_t max_alloc, int64_t spare_rows) {
  RowSplit split;
  split.rows_per_piece = rows;
  if (max_alloc == 0 || row_bytes <= 0 || uint64_t(rows) * row_bytes <= max_alloc) return split;
  const int64_t fit = std::max<int64_t>(1, int64_t(max_alloc / uint64_t(row_bytes)) - spare_rows);
  split.pieces = (rows + fit - 1) / fit;
  split.rows_per_piece = (rows + split.pieces - 1) / split.pieces;  // even pieces
  return split;
}

RowSplit PlanExpertSplit(std::span<const GgufTensor* const> experts, uint64_t max_alloc) {
  int64_t n_expert = 0, expert_bytes = 0;
  bool over = false;
  for (const GgufTensor* t : experts) {
    n_expert = t->dims.back();
    expert_bytes = std::max<int64_t>(expert_bytes, int64_t(t->n_bytes) / n_expert);
    over = over || (max_alloc != 0 && t->n_bytes > max_alloc);
  }
  if (!over) return {1, n_expert};
  // Every piece of the three takes a zero expert more (transformer.cc's routing).
  return PlanRowSplit(n_expert, expert_bytes, max_alloc, 1);
}

std::vector<WeightSplit> PlanWeightSplits(const GgufFile& file, uint64_t max_alloc) {
  std::vector<WeightSplit> splits;
  for (const GgufTensor& t : file.tensors()) {
    if (t.dims.size() < 2 || max_alloc == 0 || t.n_bytes <= max_alloc) continue;
    if (t.dims.size() == 3) {  // experts: cut at whole experts, as the loader does
      const GgufTensor* one[] = {&t};
      splits.push_back({t.name, t.n_bytes, PlanExpertSplit(one, max_alloc).pieces});
      continue;
    }
    const bool table = t.name == "token_embd.weight";
    const RowSplit split =
        PlanRowSplit(t.n_rows(), RowBytes(t.dtype, t.row_len()), max_alloc, table ? 1 : 0);
    splits.push_back({t.name, t.n_bytes, split.pieces});
  }
  return splits;
}

namespace {

class Uploader {
 public:
  Uploader(const GgufFile& file, const std::shared_ptr<runtime::Device>& device,
           const std::shared_ptr<runtime::MemoryPool>& pool, runtime::Stream& stream,
           ModelWeights& w)
      : file_(file), device_(device), pool_(pool), stream_(stream), w_(w) {}

  StatusOr<const GgufTensor*> Find(const std::string& name) const {
    const GgufTensor* t = file_.FindTensor(name);
    if (t == nullptr) return NotFound("tensor " + name + " missing from " + file_.path());
    return t;
  }

  // A matrix for MATMUL (the plugin may repack it). A tensor-parallel shard takes the rows
  // [begin, begin + count) (kRows) or the columns (kCols) of the stored matrix.
  enum class Cut { kAll, kRows, kCols };
  StatusOr<MatrixRef> Matrix(const std::string& name, Cut cut = Cut::kAll, int64_t begin = 0,
                             int64_t count = 0) {
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    int64_t rows = t->n_rows(), cols = t->row_len();
    const uint8_t* data = static_cast<const uint8_t*>(t->data);
    std::vector<uint8_t> staging;
    uint64_t n_bytes = t->n_bytes;
    const int64_t row_bytes = RowBytes(t->dtype, cols);
    if (cut == Cut::kRows) {
      if (begin + count > rows) return InvalidArgument(name + ": shard rows out of range");
      data += begin * row_bytes;
      rows = count;
      n_bytes = uint64_t(count) * row_bytes;
    } else if (cut == Cut::kCols) {
      const int64_t skip = RowBytes(t->dtype, begin), take = RowBytes(t->dtype, count);
      if (skip < 0 || take < 0 || begin + count > cols) {
        return InvalidArgument(name + ": columns [" + std::to_string(begin) + ", " +
                               std::to_string(begin + count) + ") of a " + DTypeName(t->dtype) +
                               " matrix do not fall on block boundaries; choose another "
                               "tensor-parallel size");
      }
      // The shard's columns are strided in the file: gather them (Upload returns once the
      // device holds its copy, so the buffer may die with this call).
      staging.resize(uint64_t(rows) * take);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(staging.data() + r * take, data + r * row_bytes + skip, take);
      }
      data = staging.data();
      cols = count;
      n_bytes = staging.size();
    }
    return Upload(*t, rows, cols, data, n_bytes);
  }

  // Matrix `t`'s rows of vocabulary shard `v` followed by zero rows (tensor_parallel.h), as
  // bytes for Upload or Raw: [v.rows, row_len]. Zero bytes are zero in every GGUF type (a
  // block's scale is zero).
  StatusOr<std::vector<uint8_t>> VocabRows(const GgufTensor& t, const VocabShard& v) const {
    if (v.begin + v.count > t.n_rows()) {
      return InvalidArgument(t.name + ": vocabulary rows out of range");
    }
    const int64_t row_bytes = RowBytes(t.dtype, t.row_len());
    std::vector<uint8_t> rows(uint64_t(v.rows) * row_bytes, 0);
    std::memcpy(rows.data(), static_cast<const uint8_t*>(t.data) + v.begin * row_bytes,
                uint64_t(v.count) * row_bytes);
    return rows;
  }

  // `data` [rows, cols] of t's dtype, for MATMUL (the plugin may repack it). Larger than the
  // device's max single allocation: in pieces of rows (MatrixRef::pieces), each followed by
  // `zero_rows` zero rows when asked (so that a GGUF piece may serve as an embedding piece).
  StatusOr<MatrixRef> Upload(const GgufTensor& t, int64_t rows, int64_t cols, const void* data,
                             uint64_t n_bytes, int64_t zero_rows = 0) {
    const int64_t row_bytes = RowBytes(t.dtype, cols);
    const RowSplit split =
        PlanRowSplit(rows, row_bytes, device_->props().max_alloc_size, zero_rows);
    if (split.pieces == 1) {
      PC_ASSIGN_OR_RETURN(MatrixRef ref, UploadRows(t, cols, data, rows, 0));
      file_.ReleasePages(t);
      return ref;
    }
    MatrixRef whole{0, t.dtype, runtime::kLayoutGguf, rows, cols};
    std::vector<uint8_t> staging;
    for (int64_t begin = 0; begin < rows; begin += split.rows_per_piece) {
      const int64_t count = std::min(split.rows_per_piece, rows - begin);
      const uint8_t* from = static_cast<const uint8_t*>(data) + begin * row_bytes;
      if (zero_rows > 0) {  // the piece's rows, then zero rows (zero in every GGUF type)
        staging.assign(uint64_t(count + zero_rows) * row_bytes, 0);
        std::memcpy(staging.data(), from, uint64_t(count) * row_bytes);
        from = staging.data();
      }
      PC_ASSIGN_OR_RETURN(MatrixRef piece, UploadRows(t, cols, from, count, zero_rows));
      piece.begin = begin;
      whole.layout = piece.layout;
      whole.pieces.push_back(std::move(piece));
    }
    file_.ReleasePages(t);
    w_.splits.push_back({t.name, n_bytes, split.pieces});
    return whole;
  }

  // `count` rows of `data` and `zero_rows` more as one DeviceWeight; the ref says `count` rows.
  StatusOr<MatrixRef> UploadRows(const GgufTensor& t, int64_t cols, const void* data, int64_t count,
                                 int64_t zero_rows) {
    const int64_t rows = count + zero_rows;
    PC_ASSIGN_OR_RETURN(auto weight,
                        runtime::DeviceWeight::Upload(device_, t.dtype, rows, cols, data,
                                                      uint64_t(rows) * RowBytes(t.dtype, cols)));
    MatrixRef ref{weight->data(), t.dtype, weight->layout(), count, cols};
    w_.device_bytes += weight->bytes();
    w_.matrices.push_back(std::move(weight));
    return ref;
  }

  // The embedding table (GGUF layout): the tensor's rows, or `bytes` made from it ([rows,
  // row_len]), in one allocation (w_.embd), or, over the max single allocation, in pieces of
  // rows each followed by a zero row (w_.embd_pieces).
  Status Table(const GgufTensor& t, const std::vector<uint8_t>* bytes = nullptr) {
    const uint8_t* data = static_cast<const uint8_t*>(bytes != nullptr ? bytes->data() : t.data);
    const uint64_t n_bytes = bytes != nullptr ? bytes->size() : t.n_bytes;
    const int64_t row_bytes = RowBytes(t.dtype, t.row_len());
    const int64_t rows = int64_t(n_bytes / uint64_t(row_bytes));
    const RowSplit split = PlanRowSplit(rows, row_bytes, device_->props().max_alloc_size, 1);
    if (split.pieces == 1) {
      PC_ASSIGN_OR_RETURN(w_.embd, Raw(t, bytes));
      return Status::Ok();
    }
    for (int64_t begin = 0; begin < rows; begin += split.rows_per_piece) {
      const int64_t count = std::min(split.rows_per_piece, rows - begin);
      const uint64_t piece_bytes = uint64_t(count) * row_bytes;
      PC_ASSIGN_OR_RETURN(auto buffer, device_->Allocate(piece_bytes + row_bytes));
      PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer->ptr(), data + begin * row_bytes, piece_bytes));
      PC_RETURN_IF_ERROR(stream_.Memset(buffer->ptr() + piece_bytes, 0, row_bytes));
      device_->MarkImmutable(buffer->ptr(), piece_bytes + row_bytes);
      w_.embd_pieces.push_back({buffer->ptr(), begin, count});
      w_.device_bytes += piece_bytes + row_bytes;
      w_.buffers.push_back(std::move(buffer));
    }
    PC_RETURN_IF_ERROR(stream_.Synchronize());  // the copies have read the pages released next
    file_.ReleasePages(t);
    w_.splits.push_back({t.name, n_bytes, split.pieces});
    return Status::Ok();
  }

  // Raw GGUF bytes in a device allocation of their own (embedding table): the tensor's, or
  // `bytes` made from it.
  StatusOr<DevPtr> Raw(const GgufTensor& t, const std::vector<uint8_t>* bytes = nullptr) {
    const void* data = bytes != nullptr ? bytes->data() : t.data;
    const uint64_t n_bytes = bytes != nullptr ? bytes->size() : t.n_bytes;
    PC_ASSIGN_OR_RETURN(auto buffer, device_->Allocate(n_bytes));
    PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer->ptr(), data, n_bytes));
    PC_RETURN_IF_ERROR(stream_.Synchronize());  // the copy has read the pages released next
    file_.ReleasePages(t);
    const DevPtr ptr = buffer->ptr();
    device_->MarkImmutable(ptr, n_bytes);  // a table: staged once by an op fallback
    w_.device_bytes += n_bytes;
    w_.buffers.push_back(std::move(buffer));
    return ptr;
  }

  // A 1D tensor converted to F32 (norm weights may be stored as F16 or BF16). With shards > 1
  // the tensor holds `shards` times expected_len elements and the shard-th part is taken.
  StatusOr<DevPtr> Vector(const std::string& name, int64_t expected_len, int32_t shard = 0,
                          int32_t shards = 1) {
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    if (t->n_elements != expected_len * shards) {
      return InvalidArgument("tensor " + name + " has " + std::to_string(t->n_elements) +
                             " elements, expected " + std::to_string(expected_len * shards));
    }
    std::vector<float> all(t->n_elements);
    if (!DequantizeRow(t->dtype, t->data, all.data(), t->n_elements)) {
      return Unimplemented("tensor " + name + ": cannot convert " + DTypeName(t->dtype) +
                           " to F32");
    }
    std::vector<float> host(all.begin() + shard * expected_len,
                            all.begin() + (shard + 1) * expected_len);
    PC_ASSIGN_OR_RETURN(PoolBuffer buffer, PoolBuffer::Allocate(pool_, host.size() * 4));
    PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer.ptr(), host.data(), host.size() * 4));
    // The host vector dies here: wait for the copy to read it.
    PC_RETURN_IF_ERROR(stream_.Synchronize());
    file_.ReleasePages(*t);
    const DevPtr ptr = buffer.ptr();
    w_.device_bytes += buffer.size();
    w_.vectors.push_back(std::move(buffer));
    return ptr;
  }

  // Elements [begin, begin + count) of a 1D tensor of `total` elements, converted to F32 and
  // followed by zeros up to `len` (the output bias of a vocabulary shard).
  StatusOr<DevPtr> VectorRange(const std::string& name, int64_t total, int64_t begin,
                               int64_t count, int64_t len) {
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    if (t->n_elements != total || begin + count > total || count > len) {
      return InvalidArgument("tensor " + name + " has " + std::to_string(t->n_elements) +
                             " elements, expected " + std::to_string(total));
    }
    std::vector<float> all(t->n_elements);
    if (!DequantizeRow(t->dtype, t->data, all.data(), t->n_elements)) {
      return Unimplemented("tensor " + name + ": cannot convert " + DTypeName(t->dtype) +
                           " to F32");
    }
    std::vector<float> host(len, 0.f);
    std::copy(all.begin() + begin, all.begin() + begin + count, host.begin());
    PC_ASSIGN_OR_RETURN(PoolBuffer buffer, PoolBuffer::Allocate(pool_, host.size() * 4));
    PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer.ptr(), host.data(), host.size() * 4));
    PC_RETURN_IF_ERROR(stream_.Synchronize());  // the host vector dies here
    file_.ReleasePages(*t);
    const DevPtr ptr = buffer.ptr();
    w_.device_bytes += buffer.size();
    w_.vectors.push_back(std::move(buffer));
    return ptr;
  }

  // An expert tensor [n_expert, rows, cols] for MOE: uploaded like a matrix (the plugin may
  // repack it) when the device's MOE reads the layout it chose, else as GGUF bytes. Split by
  // `split` (PlanExpertSplit, the same for a layer's three tensors): pieces of
  // rows_per_piece whole experts as GGUF bytes, each followed by a zero expert.
  StatusOr<MatrixRef> Experts(const std::string& name, const std::vector<DType>& moe_dtypes,
                              const RowSplit& split) {
    if (split.pieces > 1) {
      PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
      const int64_t n_expert = t->dims.back(), rows = t->n_rows() / n_expert;
      const int64_t row_bytes = RowBytes(t->dtype, t->row_len());
      const int64_t expert_bytes = rows * row_bytes;
      MatrixRef whole{0, t->dtype, runtime::kLayoutGguf, t->n_rows(), t->row_len()};
      std::vector<uint8_t> staging;
      for (int64_t e = 0; e < n_expert; e += split.rows_per_piece) {
        const int64_t count = std::min(split.rows_per_piece, n_expert - e);
        staging.assign(uint64_t(count + 1) * expert_bytes, 0);  // zero bytes: zero values
        std::memcpy(staging.data(), static_cast<const uint8_t*>(t->data) + e * expert_bytes,
                    uint64_t(count) * expert_bytes);
        MatrixRef piece{0, t->dtype, runtime::kLayoutGguf, count * rows, t->row_len()};
        PC_ASSIGN_OR_RETURN(piece.data, Raw(*t, &staging));
        piece.begin = e * rows;
        whole.pieces.push_back(std::move(piece));
      }
      w_.splits.push_back({t->name, t->n_bytes, split.pieces});
      return whole;
    }
    PC_ASSIGN_OR_RETURN(MatrixRef ref, Matrix(name));
    if (ref.layout == runtime::kLayoutGguf) return ref;
    std::initializer_list<DType> dtypes{moe_dtypes[0], moe_dtypes[1], moe_dtypes[2]};
    if (runtime::SupportsOp(*device_, runtime::Op::kMoe, dtypes, runtime::ShapeClass::kAny,
                            ref.layout)) {
      return ref;
    }
    w_.matrices.pop_back();  // frees the repacked copy
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    PC_ASSIGN_OR_RETURN(ref.data, Raw(*t));
    ref.layout = runtime::kLayoutGguf;
    return ref;
  }

  StatusOr<DevPtr> OptionalVector(const std::string& name, int64_t expected_len,
                                  int32_t shard = 0, int32_t shards = 1) {
    if (file_.FindTensor(name) == nullptr) return DevPtr{0};
    return Vector(name, expected_len, shard, shards);
  }

 private:
  const GgufFile& file_;
  const std::shared_ptr<runtime::Device>& device_;
  const std::shared_ptr<runtime::MemoryPool>& pool_;
  runtime::Stream& stream_;
  ModelWeights& w_;
};

}  // namespace

StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    const GgufFile& file, const ModelConfig& c, const std::shared_ptr<runtime::Device>& device,
    const std::shared_ptr<runtime::MemoryPool>& pool, runtime::Stream& stream,
    int32_t shard_rank, int32_t shard_size, int64_t layer_begin, int64_t layer_end) {
  if (c.n_expert > 0 && shard_size > 1) {
    return Unimplemented(ArchName(c.arch) + std::string(": tensor parallel over the experts of a "
                                                        "mixture-of-experts model is not "
                                                        "supported yet"));
  }
  auto w = std::make_unique<ModelWeights>();
  Uploader up(file, device, pool, stream, *w);

  PC_ASSIGN_OR_RETURN(const GgufTensor* embd, up.Find("token_embd.weight"));
  w->embd_dtype = embd->dtype;
  // A tensor-parallel rank holds its vocabulary rows of both tables (tensor_parallel.h).
  const bool vocab_parallel = shard_size > 1;
  std::vector<uint8_t> embd_rows;  // the shard's rows of token_embd
  if (vocab_parallel) {
    w->vocab = ShardVocab(c.n_vocab, shard_rank, shard_size);
    PC_ASSIGN_OR_RETURN(embd_rows, up.VocabRows(*embd, w->vocab));
  }
  // zero_rows: a split output matrix keeps a zero row after each piece's rows, so that its
  // pieces (in GGUF layout) serve as the tied embedding table's pieces too.
  auto matrix = [&](const GgufTensor& t, const std::vector<uint8_t>& rows, int64_t zero_rows) {
    if (vocab_parallel) {
      return up.Upload(t, w->vocab.rows, t.row_len(), rows.data(), rows.size(), zero_rows);
    }
    return up.Upload(t, t.n_rows(), t.row_len(), t.data, t.n_bytes, zero_rows);
  };
  auto table = [&]() { return up.Table(*embd, vocab_parallel ? &embd_rows : nullptr); };
  if (c.tied_output) {
    // The output projection is the embedding table: one copy serves both ops when EMBEDDING
    // reads the layout the plugin's upload chose (always so for GGUF; for a private layout when
    // the plugin says so). Otherwise the table is uploaded a second time in GGUF layout.
    PC_ASSIGN_OR_RETURN(w->output, matrix(*embd, embd_rows, /*zero_rows=*/1));
    if (!w->output.pieces.empty() && w->output.layout == runtime::kLayoutGguf) {
      for (const MatrixRef& p : w->output.pieces) {
        w->embd_pieces.push_back({p.data, p.begin, p.rows});
      }
    } else if (w->output.pieces.empty() &&
               (w->output.layout == runtime::kLayoutGguf ||
                runtime::SupportsOp(*device, runtime::Op::kEmbedding, {embd->dtype},
                                    runtime::ShapeClass::kAny, w->output.layout))) {
      w->embd = w->output.data;
      w->embd_layout = w->output.layout;
    } else {
      PC_RETURN_IF_ERROR(table());
    }
  } else {
    PC_RETURN_IF_ERROR(table());
    PC_ASSIGN_OR_RETURN(const GgufTensor* output, up.Find("output.weight"));
    std::vector<uint8_t> output_rows;
    if (vocab_parallel) {
      PC_ASSIGN_OR_RETURN(output_rows, up.VocabRows(*output, w->vocab));
    }
    PC_ASSIGN_OR_RETURN(w->output, matrix(*output, output_rows, /*zero_rows=*/0));
  }
  PC_ASSIGN_OR_RETURN(w->output_norm, up.Vector("output_norm.weight", c.n_embd));
  if (c.has_output_bias && vocab_parallel) {
    PC_ASSIGN_OR_RETURN(w->output_bias, up.VectorRange("output.bias", c.n_vocab, w->vocab.begin,
                                                       w->vocab.count, w->vocab.rows));
  } else if (c.has_output_bias) {
    PC_ASSIGN_OR_RETURN(w->output_bias, up.Vector("output.bias", c.n_vocab));
  }
  if (c.has_rope_freqs) {
    PC_ASSIGN_OR_RETURN(w->rope_freqs, up.Vector("rope_freqs.weight", c.n_rot / 2));
  } else if (c.has_rope_factors) {  // LongRoPE: the runner chose by its context length
    PC_ASSIGN_OR_RETURN(w->rope_freqs,
                        up.Vector(c.rope_long_factors ? "rope_factors_long.weight"
                                                      : "rope_factors_short.weight",
                                  c.n_rot / 2));
  }

  w->layers.resize(c.n_layer);
  if (layer_end < 0) layer_end = c.n_layer;
  for (int64_t l = layer_begin; l < layer_end; ++l) {
    LayerWeights& L = w->layers[l];
    auto name = [l](const char* suffix) { return LayerTensorName(l, suffix); };
    PC_ASSIGN_OR_RETURN(L.attn_norm, up.Vector(name("attn_norm.weight"), c.n_embd));
    PC_ASSIGN_OR_RETURN(L.ffn_norm, up.Vector(name("ffn_norm.weight"), c.n_embd));
    if (c.has_qk_norm) {  // one weight for every head: a tensor-parallel rank takes it whole
      PC_ASSIGN_OR_RETURN(L.q_norm, up.Vector(name("attn_q_norm.weight"), c.head_dim));
      PC_ASSIGN_OR_RETURN(L.k_norm, up.Vector(name("attn_k_norm.weight"), c.head_dim));
    }
    if (c.has_post_norms) {
      PC_ASSIGN_OR_RETURN(L.post_attn_norm,
                          up.Vector(name("post_attention_norm.weight"), c.n_embd));
      PC_ASSIGN_OR_RETURN(L.post_ffn_norm, up.Vector(name("post_ffw_norm.weight"), c.n_embd));
    }
    if (c.fused_qkv || c.fused_gate_up) {
      // phi3: each part is a range of rows of the fused matrix, uploaded as a matrix of its
      // own straight from the file mapping (no host copy; the device holds each row once). A
      // tensor-parallel rank takes its share of each part; `c` is that share.
      using Cut = Uploader::Cut;
      const int64_t r = shard_rank, n = shard_size;
      if (c.fused_qkv) {
        const std::string qkv = name("attn_qkv.weight");
        const int64_t q = c.q_dim(), kv = c.kv_dim(), v = c.v_dim();
        PC_ASSIGN_OR_RETURN(L.wq, up.Matrix(qkv, Cut::kRows, r * q, q));
        PC_ASSIGN_OR_RETURN(L.wk, up.Matrix(qkv, Cut::kRows, n * q + r * kv, kv));
        PC_ASSIGN_OR_RETURN(L.wv, up.Matrix(qkv, Cut::kRows, n * (q + kv) + r * v, v));
      } else {
        PC_ASSIGN_OR_RETURN(L.wq, up.Matrix(name("attn_q.weight"), Cut::kRows, r * c.q_dim(), c.q_dim()));
        PC_ASSIGN_OR_RETURN(L.wk, up.Matrix(name("attn_k.weight"), Cut::kRows, r * c.kv_dim(), c.kv_dim()));
        PC_ASSIGN_OR_RETURN(L.wv, up.Matrix(name("attn_v.weight"), Cut::kRows, r * c.v_dim(), c.v_dim()));
      }
      const Cut cols = n == 1 ? Cut::kAll : Cut::kCols;
      PC_ASSIGN_OR_RETURN(L.wo, up.Matrix(name("attn_output.weight"), cols, r * c.q_dim(), c.q_dim()));
      const std::string gate_up = name("ffn_up.weight");
      PC_ASSIGN_OR_RETURN(L.w_gate, up.Matrix(gate_up, Cut::kRows, r * c.n_ff, c.n_ff));
      PC_ASSIGN_OR_RETURN(L.w_up, up.Matrix(gate_up, Cut::kRows, n * c.n_ff + r * c.n_ff, c.n_ff));
      PC_ASSIGN_OR_RETURN(L.w_down, up.Matrix(name("ffn_down.weight"), cols, r * c.n_ff, c.n_ff));
    } else if (shard_size == 1) {
      PC_ASSIGN_OR_RETURN(L.wq, up.Matrix(name("attn_q.weight")));
      PC_ASSIGN_OR_RETURN(L.wk, up.Matrix(name("attn_k.weight")));
      PC_ASSIGN_OR_RETURN(L.wv, up.Matrix(name("attn_v.weight")));
      PC_ASSIGN_OR_RETURN(L.wo, up.Matrix(name("attn_output.weight")));
      if (c.n_expert > 0) {
        PC_ASSIGN_OR_RETURN(L.router, up.Matrix(name("ffn_gate_inp.weight")));
        std::vector<DType> dtypes;
        std::vector<const GgufTensor*> tensors;
        for (const char* m :
             {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
          PC_ASSIGN_OR_RETURN(const GgufTensor* t, up.Find(name(m)));
          if (t->dims.size() != 3 || t->dims.back() != c.n_expert) {
            return InvalidArgument(t->name + ": not " + std::to_string(c.n_expert) + " experts");
          }
          dtypes.push_back(t->dtype);
          tensors.push_back(t);
        }
        const RowSplit split = PlanExpertSplit(tensors, device->props().max_alloc_size);
        PC_ASSIGN_OR_RETURN(L.gate_exps, up.Experts(name("ffn_gate_exps.weight"), dtypes, split));
        PC_ASSIGN_OR_RETURN(L.up_exps, up.Experts(name("ffn_up_exps.weight"), dtypes, split));
        PC_ASSIGN_OR_RETURN(L.down_exps, up.Experts(name("ffn_down_exps.weight"), dtypes, split));
      } else {
        PC_ASSIGN_OR_RETURN(L.w_gate, up.Matrix(name("ffn_gate.weight")));
        PC_ASSIGN_OR_RETURN(L.w_up, up.Matrix(name("ffn_up.weight")));
        PC_ASSIGN_OR_RETURN(L.w_down, up.Matrix(name("ffn_down.weight")));
      }
    } else {
      // Tensor parallel: `c` is this rank's share (see tensor_parallel.h).
      using Cut = Uploader::Cut;
      const int64_t r = shard_rank;
      PC_ASSIGN_OR_RETURN(L.wq, up.Matrix(name("attn_q.weight"), Cut::kRows, r * c.q_dim(), c.q_dim()));
      PC_ASSIGN_OR_RETURN(L.wk, up.Matrix(name("attn_k.weight"), Cut::kRows, r * c.kv_dim(), c.kv_dim()));
      PC_ASSIGN_OR_RETURN(L.wv, up.Matrix(name("attn_v.weight"), Cut::kRows, r * c.v_dim(), c.v_dim()));
      PC_ASSIGN_OR_RETURN(L.wo, up.Matrix(name("attn_output.weight"), Cut::kCols, r * c.q_dim(), c.q_dim()));
      PC_ASSIGN_OR_RETURN(L.w_gate, up.Matrix(name("ffn_gate.weight"), Cut::kRows, r * c.n_ff, c.n_ff));
      PC_ASSIGN_OR_RETURN(L.w_up, up.Matrix(name("ffn_up.weight"), Cut::kRows, r * c.n_ff, c.n_ff));
      PC_ASSIGN_OR_RETURN(L.w_down, up.Matrix(name("ffn_down.weight"), Cut::kCols, r * c.n_ff, c.n_ff));
    }
    // Biases are optional in both architectures' files (qwen2 has q/k/v biases).
    PC_ASSIGN_OR_RETURN(L.bq, up.OptionalVector(name("attn_q.bias"), c.q_dim(), shard_rank, shard_size));
    PC_ASSIGN_OR_RETURN(L.bk, up.OptionalVector(name("attn_k.bias"), c.kv_dim(), shard_rank, shard_size));
    PC_ASSIGN_OR_RETURN(L.bv, up.OptionalVector(name("attn_v.bias"), c.v_dim(), shard_rank, shard_size));
    // The output bias is added once, by rank 0: the ranks' partial sums are added up after.
    if (shard_rank == 0) {
      PC_ASSIGN_OR_RETURN(L.bo, up.OptionalVector(name("attn_output.bias"), c.n_embd));
    }
  }
  PC_RETURN_IF_ERROR(stream.Synchronize());
  // Each tensor's pages went after its upload, but reading the next one faults its neighbours
  // back in (the kernel maps up to 64 KiB around a fault): one last sweep drops those.
  file.ReleaseDataPages();
  return w;
}

}  // namespace polychip::model
