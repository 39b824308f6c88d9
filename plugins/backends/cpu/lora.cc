// LORA on the cpu plugin (ABI 1.8): one adapter's low-rank term over the listed rows of a batch.
// t = scale (x[rows] A^T) is the plugin's MATMUL against A (in the layout weight_upload gave it,
// x rounded as that MATMUL rounds it: the numbers of the MATMUL the op replaces); then
// out[rows] += t B^T is one parallel pass over B's row groups, each run by the kernel MATMUL
// runs on that layout (gemm_panel on float panels, gemm_packed on packed Q8_0 with t in its
// int8 blocks) against every listed row at once, the products added into the listed rows
// straight from the kernel's tile. So the rows are scattered inside the pass, and B is read once
// per launch however the adapter's rows lie in the batch.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_ops.h"
#include "packed.h"
#include "panel.h"
#include "polychip/sdk/quant.h"

namespace polychip::cpu {
namespace {

template <typename T>
T* Ptr(pc_devptr_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

// Rows of t per kernel call (MatmulPacked's block: they stay in L2 while a group is reused).
constexpr int64_t kMBlock = 64;

}  // namespace

const char* Lora(const OpContext& c, const pc_lora_args_t& a) {
  if (a.n_rows == 0) return nullptr;
  if (!a.x || !a.out || !a.a || !a.b) return "null operand";
  const auto* rows = Ptr<const int32_t>(a.rows);  // [n_rows], or null for 0..n_rows-1
  for (int64_t i = 0; rows && i < a.n_rows; ++i) {
    if (rows[i] < 0 || rows[i] >= a.m) return "lora row out of range";
  }
  const auto row_of = [&](int64_t i) { return rows ? int64_t{rows[i]} : i; };
  const auto* x = Ptr<const float>(a.x);  // [m, k]
  auto* out = Ptr<float>(a.out);          // [m, n]
  // Launches on one device are serialised by the plugin: the buffers are reused across them.
  static std::vector<float> gathered, t;
  const float* xs = x;  // [n_rows, k]: the listed rows of x
  if (rows) {
    gathered.resize(a.n_rows * a.k);
    for (int64_t i = 0; i < a.n_rows; ++i)
      std::memcpy(gathered.data() + i * a.k, x + rows[i] * a.k, a.k * sizeof(float));
    xs = gathered.data();
  }
  t.resize(a.n_rows * a.rank);  // [n_rows, rank]
  pc_matmul_args_t mm{};
  mm.struct_size = sizeof(mm);
  mm.x = reinterpret_cast<uintptr_t>(xs);
  mm.w = a.a, mm.w_dtype = a.a_dtype, mm.w_layout = a.a_layout;
  mm.out = reinterpret_cast<uintptr_t>(t.data());
  mm.m = a.n_rows, mm.n = a.rank, mm.k = a.k, mm.x_stride = a.k, mm.out_stride = a.rank;
  if (const char* why = Matmul(c, mm)) return why;
  for (float& v : t) v *= a.scale;  // before B's product, as the SCALE launch was

  const auto* b = Ptr<const uint8_t>(a.b);
  const float* ts = t.data();
  // B's row groups: panels of 32 rows, packed groups of 16, or single GGUF rows.
  int64_t group_rows = 1, group_bytes = sdk::RowBytes(a.b_dtype, a.rank);
  PackedFormat f;
  static std::vector<ActBlock> tq;  // [n_rows, rank / 32]: t as the packed kernel reads it
  const int64_t kb = a.rank / kBlock;
  if (a.b_layout == kLayoutPanel) {
    if (!c.k->gemm_panel) return "panel layout for this ISA";
    group_rows = kPanelRows;
    group_bytes = kPanelRows * a.rank * PanelElemBytes(a.b_dtype);
  } else if (a.b_layout == kLayoutPacked) {
    if (!PackedFormatOf(a.b_dtype, &f) || a.rank % kBlock != 0)
      return "packed layout for this dtype";
    group_rows = kPackRows;
    group_bytes = kb * f.block_bytes();
    tq.resize(a.n_rows * kb);
    for (int64_t i = 0; i < a.n_rows; ++i)
      c.k->quantize_row(ts + i * a.rank, a.rank, ActScaleBlock(a.b_dtype), &tq[i * kb]);
  }
  const int64_t n_groups = (a.n + group_rows - 1) / group_rows;
  // Groups [g0, g1) against every listed row, added into out.
  const auto add_groups = [&](int64_t g0, int64_t g1) {
    thread_local std::vector<float> acc, w;
    acc.resize(std::min(a.n_rows, kMBlock) * group_rows);  // [rows of a block, group_rows]
    w.resize(a.rank);
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* group = b + g * group_bytes;
      const int64_t j0 = g * group_rows, n_cols = std::min(group_rows, a.n - j0);
      for (int64_t i0 = 0; i0 < a.n_rows; i0 += kMBlock) {
        const int64_t mb = std::min(kMBlock, a.n_rows - i0);
        if (a.b_layout == kLayoutPanel) {
          std::fill(acc.begin(), acc.begin() + mb * group_rows, 0.f);
          for (int64_t i = 0; i < mb; i += kPanelTileRows) {
            c.k->gemm_panel(a.b_dtype, group, a.rank, ts + (i0 + i) * a.rank, a.rank,
                            std::min(kPanelTileRows, mb - i), acc.data() + i * group_rows);
          }
        } else if (a.b_layout == kLayoutPacked) {
          c.k->gemm_packed(f, group, kb, &tq[i0 * kb], kb, mb, acc.data());
        } else {  // a GGUF row: its dot with every row of t
          sdk::DequantizeRow(a.b_dtype, group, w.data(), a.rank);
          for (int64_t i = 0; i < mb; ++i)
            acc[i] = c.k->dot_f32(ts + (i0 + i) * a.rank, w.data(), a.rank);
        }
        for (int64_t i = 0; i < mb; ++i) {
          float* y = out + row_of(i0 + i) * a.n + j0;
          const float* v = acc.data() + i * group_rows;
          for (int64_t r = 0; r < n_cols; ++r) y[r] += v[r];
        }
      }
    }
  };
  // A thin product (the k and v projections of a few rows) is not worth waking the pool for.
  constexpr int64_t kMinParallelWork = 1 << 16;  // multiply-adds
  const int threads = c.pool->size();
  if (threads <= 1 || a.n_rows * a.n * a.rank < kMinParallelWork) {
    add_groups(0, n_groups);
    return nullptr;
  }
  // About four tasks per thread (a core another process is using is helped out).
  const int64_t chunk = std::max<int64_t>(1, (n_groups + 4 * threads - 1) / (4 * threads));
  c.pool->Run((n_groups + chunk - 1) / chunk, [&](int64_t task) {
    add_groups(task * chunk, std::min(n_groups, (task + 1) * chunk));
  });
  return nullptr;
}

}  // namespace polychip::cpu
