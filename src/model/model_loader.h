// Uploads a GGUF model's weights to a device. Matrices go through the runtime's DeviceWeight
// (the plugin may repack them); 1D tensors (norms, biases, rope_freqs) are converted to F32 on
// the host and copied into pool memory; the embedding table is uploaded in GGUF layout, except
// that with tied embeddings the output matrix serves as the table too when EMBEDDING reads its
// layout. Each tensor's pages of the file mapping are released once the device holds its copy,
// so the file is not resident a second time.
//
// Every transfer goes through the runtime's stream copies: device memory is never touched by
// the host (it is not host-dereferenceable on a discrete device).
//
// A tensor larger than the device's max single allocation is split by rows into allocations
// that each fit (PlanRowSplit): a matrix becomes MatrixRef::pieces, each launched as a MATMUL of
// its own writing its columns of the output; the embedding table becomes embd_pieces, each with
// a zero row after its own rows, so that a gather from every piece (a token outside a piece
// reads the zero row) summed gives each token's row. The limit is hidden, never a load failure.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tensor_parallel.h"
#include "runtime/device.h"
#include "runtime/memory_pool.h"
#include "runtime/ops.h"
#include "util/status.h"

namespace polychip::model {

// A region of pool memory, returned to the pool on destruction.
class PoolBuffer {
 public:
  PoolBuffer() = default;
  PoolBuffer(std::shared_ptr<runtime::MemoryPool> pool, runtime::PoolBlock block)
      : pool_(std::move(pool)), block_(block) {}
  ~PoolBuffer();
  PoolBuffer(PoolBuffer&& other) noexcept { *this = std::move(other); }
  PoolBuffer& operator=(PoolBuffer&& other) noexcept;
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;

  static StatusOr<PoolBuffer> Allocate(const std::shared_ptr<runtime::MemoryPool>& pool,
                                       uint64_t bytes);

  runtime::DevPtr ptr() const { return block_.ptr; }
  uint64_t size() const { return block_.size; }
  explicit operator bool() const { return static_cast<bool>(block_); }

 private:
  std::shared_ptr<runtime::MemoryPool> pool_;
  runtime::PoolBlock block_;
};

// A weight matrix [rows, cols] as the MATMUL op wants it.
struct MatrixRef {
  runtime::DevPtr data = 0;
  DType dtype = DType::kF32;
  uint32_t layout = runtime::kLayoutGguf;
  int64_t rows = 0, cols = 0;
  // Larger than the device's max single allocation: the rows in allocations of their own, each
  // piece the rows [begin, begin + rows) of the whole (data is then 0). Empty: data holds all.
  // An expert tensor's pieces (GGUF layout) hold whole experts, each followed by a zero
  // expert that `rows` does not count.
  std::vector<MatrixRef> pieces;
  int64_t begin = 0;  // of a piece: its first row in the whole matrix
};

// How a tensor of `rows` rows of `row_bytes` each is cut to fit allocations of `max_alloc`
// bytes, leaving room for `spare_rows` more rows in each piece (the embedding pieces' zero
// row): `pieces` as even as possible, each at most `rows_per_piece` rows. One piece: no split.
struct RowSplit {
  int64_t pieces = 1;
  int64_t rows_per_piece = 0;
};
RowSplit PlanRowSplit(int64_t rows, int64_t row_bytes, uint64_t max_alloc, int64_t spare_rows = 0);
// How a layer's expert tensors ([n_expert, rows, cols] each) are cut when any of them exceeds
// `max_alloc`: at the same whole experts for all of them, rows_per_piece experts a piece, each
// piece with room for one zero expert more (transformer.cc routes over the pieces).
RowSplit PlanExpertSplit(std::span<const GgufTensor* const> experts, uint64_t max_alloc);

// A tensor the loader splits, for the load log and `polychip doctor`'s coverage report.
struct WeightSplit {
  std::string tensor;
  uint64_t bytes = 0;
  int64_t pieces = 0;
};
// The matrices of `file` over `max_alloc` bytes and how many allocations each takes (the
// embedding table's pieces with their zero rows; tensor parallelism not counted).
std::vector<WeightSplit> PlanWeightSplits(const GgufFile& file, uint64_t max_alloc);

// One piece of an embedding table split by rows: rows [begin, begin + count) of the table, then
// one zero row, at `data` in the table's layout (`count + 1` rows).
struct TablePiece {
  runtime::DevPtr data = 0;
  int64_t begin = 0;
  int64_t count = 0;
  // The piece-local id of `id` (a row of the whole table): its row here, else the zero row.
  int64_t LocalId(int64_t id) const {
    return id >= begin && id < begin + count ? id - begin : count;
  }
};

struct LayerWeights {
  runtime::DevPtr attn_norm = 0;  // f32 [n_embd]
  runtime::DevPtr ffn_norm = 0;   // f32 [n_embd]
  runtime::DevPtr q_norm = 0, k_norm = 0;  // f32 [head_dim] each (qwen3), or 0
  // f32 [n_embd] each (gemma3: post_attention_norm, post_ffw_norm), or 0
  runtime::DevPtr post_attn_norm = 0, post_ffn_norm = 0;
  runtime::DevPtr bq = 0, bk = 0, bv = 0;  // f32 [q_dim], [kv_dim], [v_dim], or 0
  runtime::DevPtr bo = 0;                  // f32 [n_embd], or 0
  MatrixRef wq, wk, wv, wo;     // [q_dim, n_embd], [kv_dim, n_embd], [v_dim, n_embd], [n_embd, q_dim]
  MatrixRef w_gate, w_up;       // [n_ff, n_embd]
  MatrixRef w_down;             // [n_embd, n_ff]
  // Mixture of experts (n_expert > 0) instead of w_gate/w_up/w_down: the router, and the
  // experts' 3-D tensors as matrices of n_expert blocks of rows (the MOE op's operands).
  MatrixRef router;                    // [n_expert, n_embd] ffn_gate_inp
  MatrixRef gate_exps, up_exps;        // [n_expert * n_ff_exp, n_embd]
  MatrixRef down_exps;                 // [n_expert * n_embd, n_ff_exp]
};

struct ModelWeights {
  // token_embd: [n_vocab, n_embd] of embd_dtype in layout embd_layout (GGUF, or the output
  // matrix's when tied and EMBEDDING reads it). A tensor-parallel rank holds vocab.rows rows
  // instead, of its share of the vocabulary (tensor_parallel.h), and so does `output`.
  runtime::DevPtr embd = 0;
  DType embd_dtype = DType::kF32;
  uint32_t embd_layout = runtime::kLayoutGguf;
  // The table split by rows (over the max single allocation; embd is then 0); empty: whole.
  std::vector<TablePiece> embd_pieces;
  std::vector<WeightSplit> splits;  // the tensors split at load
  std::vector<LayerWeights> layers;
  runtime::DevPtr output_norm = 0;  // f32 [n_embd]
  MatrixRef output;                 // [n_vocab, n_embd] (token_embd when tied)
  runtime::DevPtr output_bias = 0;  // f32 [n_vocab] (sharded: [vocab.rows]), or 0
  VocabShard vocab;                 // tensor parallel only: rows of embd and output held here
  runtime::DevPtr rope_freqs = 0;   // f32 [n_rot / 2], or 0
  uint64_t device_bytes = 0;        // everything uploaded

  // Owners of the memory above.
  std::vector<std::unique_ptr<runtime::DeviceWeight>> matrices;
  std::vector<std::unique_ptr<runtime::DeviceBuffer>> buffers;
  std::vector<PoolBuffer> vectors;
};

// Uploads every tensor the configuration uses. `stream` carries the copies; the call returns
// after they completed. With shard_size > 1, `config` is one tensor-parallel rank's share
// (ShardConfig in tensor_parallel.h) and rank shard_rank's slices of the matrices are loaded,
// the embedding and output layer by vocabulary rows (ShardVocab).
// Only the layers [layer_begin, layer_end) are loaded (layer_end -1: all), for a pipeline stage.
StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(
    const GgufFile& file, const ModelConfig& config,
    const std::shared_ptr<runtime::Device>& device,
    const std::shared_ptr<runtime::MemoryPool>& pool, runtime::Stream& stream,
    int32_t shard_rank = 0, int32_t shard_size = 1, int64_t layer_begin = 0,
    int64_t layer_end = -1);

}  // namespace polychip::model
