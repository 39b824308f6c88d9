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

// The configuration one rank sees: n_head, n_head_kv and n_ff divided by `size`. Fails with
// INVALID_ARGUMENT naming the dimension that does not divide.
StatusOr<ModelConfig> ShardConfig(const ModelConfig& full, int32_t size);

}  // namespace polychip::model
