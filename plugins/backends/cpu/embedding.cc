// EMBEDDING from a table in the packed layout (packed.h): a tied model's output matrix, uploaded
// once by weight_upload, also serves as its embedding table.
#include "cpu_ops.h"
#include "packed.h"

namespace polychip::cpu {

const char* EmbeddingPacked(const pc_embedding_args_t& a) {
  const auto* table = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(a.table));
  const auto* ids = reinterpret_cast<const int32_t*>(static_cast<uintptr_t>(a.ids));
  auto* out = reinterpret_cast<float*>(static_cast<uintptr_t>(a.out));
  if (!table || (a.n_ids > 0 && (!ids || !out))) return "null operand";
  // A handful of rows per step (one per token): not worth waking the thread pool.
  for (int64_t i = 0; i < a.n_ids; ++i) {
    if (ids[i] < 0 || ids[i] >= a.n_rows) return "embedding id out of range";
    UnpackRow(a.table_dtype, table, a.row_len, ids[i], out + i * a.row_len);
  }
  return nullptr;
}

}  // namespace polychip::cpu
