#include "model/model_loader.h"

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

  // A matrix for MATMUL (the plugin may repack it).
  StatusOr<MatrixRef> Matrix(const std::string& name) {
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    PC_ASSIGN_OR_RETURN(auto weight,
                        runtime::DeviceWeight::Upload(device_, t->dtype, t->n_rows(),
                                                      t->row_len(), t->data, t->n_bytes));
    MatrixRef ref{weight->data(), t->dtype, weight->layout(), t->n_rows(), t->row_len()};
    w_.device_bytes += weight->bytes();
    w_.matrices.push_back(std::move(weight));
    return ref;
  }

  // Raw GGUF bytes in a device allocation of their own (embedding table).
  StatusOr<DevPtr> Raw(const GgufTensor& t) {
    PC_ASSIGN_OR_RETURN(auto buffer, device_->Allocate(t.n_bytes));
    PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer->ptr(), t.data, t.n_bytes));
    const DevPtr ptr = buffer->ptr();
    w_.device_bytes += t.n_bytes;
    w_.buffers.push_back(std::move(buffer));
    return ptr;
  }

  // A 1D tensor converted to F32 (norm weights may be stored as F16 or BF16).
  StatusOr<DevPtr> Vector(const std::string& name, int64_t expected_len) {
    PC_ASSIGN_OR_RETURN(const GgufTensor* t, Find(name));
    if (t->n_elements != expected_len) {
      return InvalidArgument("tensor " + name + " has " + std::to_string(t->n_elements) +
                             " elements, expected " + std::to_string(expected_len));
    }
    std::vector<float> host(t->n_elements);
    if (!DequantizeRow(t->dtype, t->data, host.data(), t->n_elements)) {
      return Unimplemented("tensor " + name + ": cannot convert " + DTypeName(t->dtype) +
                           " to F32");
    }
    PC_ASSIGN_OR_RETURN(PoolBuffer buffer, PoolBuffer::Allocate(pool_, host.size() * 4));
    PC_RETURN_IF_ERROR(stream_.CopyH2D(buffer.ptr(), host.data(), host.size() * 4));
    // The host vector dies here: wait for the copy to read it.
    PC_RETURN_IF_ERROR(stream_.Synchronize());
    const DevPtr ptr = buffer.ptr();
    w_.device_bytes += buffer.size();
    w_.vectors.push_back(std::move(buffer));
    return ptr;
  }

  StatusOr<DevPtr> OptionalVector(const std::string& name, int64_t expected_len) {
    if (file_.FindTensor(name) == nullptr) return DevPtr{0};
    return Vector(name, expected_len);
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
    const std::shared_ptr<runtime::MemoryPool>& pool, runtime::Stream& stream) {
  auto w = std::make_unique<ModelWeights>();
  Uploader up(file, device, pool, stream, *w);

  PC_ASSIGN_OR_RETURN(const GgufTensor* embd, up.Find("token_embd.weight"));
  w->embd_dtype = embd->dtype;
  if (c.tied_output) {
    // The output projection is the embedding table. Share one copy unless the plugin
    // repacked it (EMBEDDING reads GGUF layout only).
    PC_ASSIGN_OR_RETURN(w->output, up.Matrix("token_embd.weight"));
    if (w->output.layout == runtime::kLayoutGguf) {
      w->embd = w->output.data;
    } else {
      PC_ASSIGN_OR_RETURN(w->embd, up.Raw(*embd));
    }
  } else {
    PC_ASSIGN_OR_RETURN(w->embd, up.Raw(*embd));
    PC_ASSIGN_OR_RETURN(w->output, up.Matrix("output.weight"));
  }
  PC_ASSIGN_OR_RETURN(w->output_norm, up.Vector("output_norm.weight", c.n_embd));
  if (c.has_output_bias) {
    PC_ASSIGN_OR_RETURN(w->output_bias, up.Vector("output.bias", c.n_vocab));
  }
  if (c.has_rope_freqs) {
    PC_ASSIGN_OR_RETURN(w->rope_freqs, up.Vector("rope_freqs.weight", c.n_rot / 2));
  }

  w->layers.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w->layers[l];
    auto name = [l](const char* suffix) { return LayerTensorName(l, suffix); };
    PC_ASSIGN_OR_RETURN(L.attn_norm, up.Vector(name("attn_norm.weight"), c.n_embd));
    PC_ASSIGN_OR_RETURN(L.ffn_norm, up.Vector(name("ffn_norm.weight"), c.n_embd));
    PC_ASSIGN_OR_RETURN(L.wq, up.Matrix(name("attn_q.weight")));
    PC_ASSIGN_OR_RETURN(L.wk, up.Matrix(name("attn_k.weight")));
    PC_ASSIGN_OR_RETURN(L.wv, up.Matrix(name("attn_v.weight")));
    PC_ASSIGN_OR_RETURN(L.wo, up.Matrix(name("attn_output.weight")));
    PC_ASSIGN_OR_RETURN(L.w_gate, up.Matrix(name("ffn_gate.weight")));
    PC_ASSIGN_OR_RETURN(L.w_up, up.Matrix(name("ffn_up.weight")));
    PC_ASSIGN_OR_RETURN(L.w_down, up.Matrix(name("ffn_down.weight")));
    // Biases are optional in both architectures' files (qwen2 has q/k/v biases).
    PC_ASSIGN_OR_RETURN(L.bq, up.OptionalVector(name("attn_q.bias"), c.q_dim()));
    PC_ASSIGN_OR_RETURN(L.bk, up.OptionalVector(name("attn_k.bias"), c.kv_dim()));
    PC_ASSIGN_OR_RETURN(L.bv, up.OptionalVector(name("attn_v.bias"), c.v_dim()));
    PC_ASSIGN_OR_RETURN(L.bo, up.OptionalVector(name("attn_output.bias"), c.n_embd));
  }
  PC_RETURN_IF_ERROR(stream.Synchronize());
  return w;
}

}  // namespace polychip::model
