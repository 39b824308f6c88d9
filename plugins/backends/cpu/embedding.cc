// EMBEDDING from a table in one of the plugin's layouts (packed.h for quantized types, panel.h
// for floats): a tied model's output matrix, uploaded once by weight_upload, also serves as its
// embedding table.
#include "cpu_ops.h"
#include "packed.h"
#include "panel.h"

namespace polychip::cpu {

const char* EmbeddingPacked(const pc_embedding_args_t& a, uint32_t layout) {
  const auto* table = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(a.table));
  const auto* ids = reinterpret_cast<const int32_t*>(static_cast<uintptr_t>(a.ids));
  auto* out = reinterpret_cast<float*>(static_cast<uintptr_t>(a.out));
  if (!table || (a.n_ids > 0 && (!ids || !out))) return "null operand";
  // A handful of rows per step (one per token): not worth waking the thread pool.
  for (int64_t i = 0; i < a.n_ids; ++i) {
    if (ids[i] < 0 || ids[i] >= a.n_rows) return "embedding id out of range";
    if (layout == kLayoutPanel) {
      UnpackPanelRow(a.table_dtype, table, a.row_len, ids[i], out + i * a.row_len);
    } else {
      UnpackRow(a.table_dtype, table, a.row_len, ids[i], out + i * a.row_len);
    }
  }
  return nullptr;
}

}  // namespace polychip::cpu
