// Tensor parallelism inside one model: each of `size` ranks holds a contiguous share of the
// attention heads (Wq/Wk/Wv rows, Wo columns) and of the FFN (Wgate/Wup rows, Wdown columns);
// embedding, norms and the output layer are replicated. After the attention output projection
// and after the FFN down projection, each rank holds a partial sum of the residual update;
// `all_reduce` adds them up across ranks (Megatron-style, two all-reduces per layer).
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
};

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
