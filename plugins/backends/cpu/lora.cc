// LORA on the cpu plugin (ABI 1.8): one adapter's low-rank term over the listed rows of a batch.
// t = scale (x[rows] A^T) is the plugin's MATMUL against A (in the layout weight_upload gave it,
// x rounded as that MATMUL rounds it: the numbers of the MATMUL the op replaces); then
// out[rows] += t B^T is one parallel pass over column chunks of B, each task unpacking its B
// rows once to F32 and adding their products into each listed row (rank axpys per row for a
// few rows, the float GEMM for many). So the listed rows are scattered inside the pass, and B
// is read once per launch however the adapter's rows lie in the batch.
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

// Row j of B [n, rank] as F32, in any layout weight_upload gives B.
void BRow(const pc_lora_args_t& a, const uint8_t* b, int64_t j, float* out) {
  if (a.b_layout == kLayoutPanel) {
    UnpackPanelRow(a.b_dtype, b, a.rank, j, out);
  } else if (a.b_layout == kLayoutPacked) {
    UnpackRow(a.b_dtype, b, a.rank, j, out);
  } else {
    sdk::DequantizeRow(a.b_dtype, b + j * sdk::RowBytes(a.b_dtype, a.rank), out, a.rank);
  }
}

}  // namespace

const char* Lora(const OpContext& c, const pc_lora_args_t& a) {
  if (a.n_rows == 0) return nullptr;
  if (!a.x || !a.out || !a.a || !a.b) return "null operand";
  const auto* rows = Ptr<const int32_t>(a.rows);  // [n_rows], or null for 0..n_rows-1
  for (int64_t i = 0; rows && i < a.n_rows; ++i) {
    if (rows[i] < 0 || rows[i] >= a.m) return "lora row out of range";
  }
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
  // Scaled before B's product (as the SCALE launch was), then rounded as the MATMUL against B
  // rounds its input: a packed B's to the kernels' int8 activation blocks (an f32 scale per 32,
  // not the f16 of a Q8_0 block), a GGUF one's not at all.
  for (float& v : t) v *= a.scale;
  if (a.b_layout == kLayoutPacked) {
    std::vector<ActBlock> blocks(a.rank / kBlock);
    for (int64_t i = 0; i < a.n_rows; ++i) {
      float* ti = t.data() + i * a.rank;
      c.k->quantize_row(ti, a.rank, ActScaleBlock(a.b_dtype), blocks.data());
      for (int64_t e = 0; e < a.rank; ++e)
        ti[e] = blocks[e / kBlock].q[e % kBlock] * blocks[e / kBlock].d;
    }
  }
  const auto* b = Ptr<const uint8_t>(a.b);
  const float* ts = t.data();
  const auto row_of = [&](int64_t i) { return rows ? int64_t{rows[i]} : i; };
  // Many rows (a prefill): B's product as the float GEMM on transposed activations MATMUL runs
  // float weights with (gemm_t_f32), t transposed once to tt [rank, mp] (rows padded to 32 with
  // zeros); its output comes transposed, and is added into the listed rows from there. A few
  // rows (decode): rank axpys per row, which pad nothing.
  const bool gemm = c.k->gemm_t_f32 != nullptr && a.n_rows > kGemmTRows;
  const int64_t mp = (a.n_rows + kGemmTCols - 1) / kGemmTCols * kGemmTCols;
  static std::vector<float> tt;
  if (gemm) {
    tt.assign(a.rank * mp, 0.f);
    for (int64_t i = 0; i < a.n_rows; ++i)
      for (int64_t r = 0; r < a.rank; ++r) tt[r * mp + i] = ts[i * a.rank + r];
  }
  const float* tts = tt.data();
  // Columns [j0, j1) of every listed row.
  const auto add_columns = [&](int64_t j0, int64_t j1) {
    if (gemm) {
      thread_local std::vector<float> bw, acc;
      bw.resize(kGemmTRows * a.rank);  // [nw, rank]: B's rows j..j + nw
      acc.resize(kGemmTRows * mp);     // [nw, mp]: their products with every listed row
      for (int64_t j = j0; j < j1; j += kGemmTRows) {
        const int64_t nw = std::min(kGemmTRows, j1 - j);
        for (int64_t r = 0; r < nw; ++r) BRow(a, b, j + r, bw.data() + r * a.rank);
        std::fill(acc.begin(), acc.begin() + nw * mp, 0.f);
        for (int64_t i0 = 0; i0 < mp; i0 += kGemmTCols) {
          c.k->gemm_t_f32(bw.data(), a.rank, nw, tts + i0, mp, a.rank, acc.data() + i0, mp);
        }
        for (int64_t i = 0; i < a.n_rows; ++i) {
          float* y = out + row_of(i) * a.n + j;
          for (int64_t r = 0; r < nw; ++r) y[r] += acc[r * mp + i];
        }
      }
      return;
    }
    thread_local std::vector<float> bt, row;
    const int64_t len = j1 - j0;
    bt.resize(a.rank * len);  // [rank, len]: B's rows j0..j1 transposed
    row.resize(a.rank);
    for (int64_t j = j0; j < j1; ++j) {
      BRow(a, b, j, row.data());
      for (int64_t r = 0; r < a.rank; ++r) bt[r * len + (j - j0)] = row[r];
    }
    for (int64_t i = 0; i < a.n_rows; ++i) {
      float* y = out + row_of(i) * a.n + j0;
      for (int64_t r = 0; r < a.rank; ++r)
        c.k->axpy_f32(ts[i * a.rank + r], bt.data() + r * len, y, len);
    }
  };
  // A thin product (the k and v projections of a few rows) is not worth waking the pool for.
  constexpr int64_t kMinParallelWork = 1 << 16;  // multiply-adds
  const int threads = c.pool->size();
  if (threads <= 1 || a.n_rows * a.n * a.rank < kMinParallelWork) {
    add_columns(0, a.n);
    return nullptr;
  }
  // Two chunks per thread (a core another process is using is helped out), 16 columns at least.
  const int64_t per_task = (a.n + 2 * threads - 1) / (2 * threads);
  const int64_t chunk = std::max<int64_t>(16, (per_task + 15) / 16 * 16);
  const int64_t n_tasks = (a.n + chunk - 1) / chunk;
  c.pool->Run(n_tasks,
              [&](int64_t task) { add_columns(task * chunk, std::min(a.n, (task + 1) * chunk)); });
  return nullptr;
}

}  // namespace polychip::cpu
