#include "model/tensor_parallel.h"

#include <algorithm>
#include <string>

namespace polychip::model {

StatusOr<ModelConfig> ShardConfig(const ModelConfig& full, int32_t size) {
  if (size < 1) return InvalidArgument("tensor-parallel size must be at least 1");
  ModelConfig c = full;
  auto divide = [&](int64_t* v, const char* what) -> Status {
    if (*v % size != 0) {
      return InvalidArgument(std::string("tensor-parallel size ") + std::to_string(size) +
                             " does not divide " + what + " (" + std::to_string(*v) + ")");
    }
    *v /= size;
    return Status::Ok();
  };
  PC_RETURN_IF_ERROR(divide(&c.n_head, "the attention head count"));
  PC_RETURN_IF_ERROR(divide(&c.n_head_kv, "the KV head count"));
  PC_RETURN_IF_ERROR(divide(&c.n_ff, "the feed-forward size"));
  return c;
}

VocabShard ShardVocab(int64_t n_vocab, int32_t rank, int32_t size) {
  const int64_t per_rank = (n_vocab + size - 1) / size;
  VocabShard v;
  v.begin = std::min(n_vocab, rank * per_rank);
  v.count = std::min(n_vocab, v.begin + per_rank) - v.begin;
  v.rows = per_rank + 1;
  return v;
}

}  // namespace polychip::model
