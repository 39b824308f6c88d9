// Tensor parallelism inside one model: each of `size` ranks holds a contiguous share of the
// attention heads (Wq/Wk/Wv rows, Wo columns) and of the FFN (Wgate/Wup rows, Wdown columns);
// norms are replicated. After the attention output projection and after the FFN down
// projection, each rank holds a partial sum of the residual update; `all_reduce` adds them up
// across ranks (Megatron-style, two all-reduces per layer).
//
// The embedding table and the output matrix are split by vocabulary rows (VocabShard): a rank
// looks up only the tokens of its range (the others read a zero row) and the embeddings are
// all-reduced; each rank computes the logits of its range, which `all_gather` collects.
//
// The model module knows nothing of communicators: whoever runs the ranks (src/dist) supplies
// all_reduce.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>

#include "model/model_config.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::model {

struct TensorParallel {
  int32_t rank = 0;
  int32_t size = 1;  // 1: no tensor parallelism (the hooks below are never called)
  // Sums x [n_rows, n_embd] (f32, device memory, ordered on `stream`) over the ranks, in place:
  // on return every rank holds the total, and later work on the stream may read it.
  std::function<Status(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows)> all_reduce;
  // Gathers `count` floats of host memory from every rank: out [size, count], rank-major, on
  // every rank. Synchronous.
  std::function<Status(const float* send, float* out, int64_t count)> all_gather;
};

// One rank's share of the vocabulary: the rows [begin, begin + count) of the token embedding
// and of the output matrix, count = ceil(n_vocab / size) except where the vocabulary runs out
// (the last ranks hold fewer, since the vocabulary need not divide). Every rank's tables have
// the same `rows` = ceil(n_vocab / size) + 1: its own rows, then zero rows, so that every rank
// gathers logits of one width, and a token outside the range looks up a zero row (LocalId)
// and adds nothing to the all-reduced embedding.
struct VocabShard {
  int64_t begin = 0;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t LocalId(int64_t token) const {
    return token >= begin && token < begin + count ? token - begin : rows - 1;
  }
};
VocabShard ShardVocab(int64_t n_vocab, int32_t rank, int32_t size);

// Pipeline parallelism: stage `stage` of `n_stages` runs layers [first_layer, end_layer) only.
// Stage 0 embeds the tokens; every later stage receives the hidden states [n_rows, n_embd] from
// the stage before it, and every stage but the last sends its output to the next; only the last
// computes logits (the others return zeros in their place).
struct PipelineStage {
  int32_t stage = 0;
  int32_t n_stages = 1;  // 1: no pipeline (the hooks below are never called)
  int64_t first_layer = 0;
  int64_t end_layer = 0;
  std::function<Status(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows)> recv;
  std::function<Status(const runtime::Stream& stream, runtime::DevPtr x, int64_t n_rows)> send;
  bool first() const { return stage == 0; }
  bool last() const { return stage == n_stages - 1; }
};

// Layers [first, end) of stage `stage` when n_layer layers are split into n_stages as evenly as
// possible.
inline std::pair<int64_t, int64_t> StageLayers(int64_t n_layer, int32_t stage, int32_t n_stages) {
  return {n_layer * stage / n_stages, n_layer * (stage + 1) / n_stages};
}

// The configuration one rank sees: n_head, n_head_kv and n_ff divided by `size`. Fails with
// INVALID_ARGUMENT naming the dimension that does not divide.
StatusOr<ModelConfig> ShardConfig(const ModelConfig& full, int32_t size);

}  // namespace polychip::model
