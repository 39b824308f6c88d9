// MOE on the cpu plugin: the tokens of a launch are routed (the SDK's MoeRoute, so the choice is
// the reference's) and grouped by expert, and each chosen expert runs once over its gathered
// rows: every expert's matrices are read once per launch however many tokens chose it. Packed
// weights (every _0/_K mixture the plugin packs) run all experts in two parallel passes
// (MoePacked); other layouts expert by expert through the plugin's matmul. An adapter's
// per-expert low-rank terms (1.7) are added on both paths (LowRank).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_ops.h"
#include "packed.h"
#include "panel.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"

namespace polychip::cpu {
namespace {

template <typename T>
T* Ptr(pc_devptr_t p) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(p));
}

// Expert e's [rows, cols] part of a [n_experts * rows, cols] weight in `layout`: the byte offset
// of its first row, or -1 when the layout's row groups do not fall on expert boundaries.
int64_t ExpertOffset(pc_dtype_t dtype, uint32_t layout, int64_t e, int64_t rows, int64_t cols) {
  if (layout == kLayoutPacked) {
    PackedFormat f;
    if (!PackedFormatOf(dtype, &f) || rows % kPackRows != 0) return -1;
    return e * (rows / kPackRows) * (cols / kBlock) * f.block_bytes();
  }
  if (layout == kLayoutPanel) {
    if (rows % kPanelRows != 0) return -1;
    return e * rows * cols * PanelElemBytes(dtype);
  }
  return e * rows * sdk::RowBytes(dtype, cols);
}

// out[m, n] = x[m, k] * W_e^T for expert e of a 3-D weight.
const char* ExpertMatmul(const OpContext& c, pc_devptr_t w, pc_dtype_t dtype, uint32_t layout,
                         int64_t e, int64_t n, int64_t k, const float* x, int64_t m, float* out) {
  const int64_t offset = ExpertOffset(dtype, layout, e, n, k);
  if (offset < 0) return "expert rows not a multiple of the weight layout's row group";
  pc_matmul_args_t mm{};
  mm.struct_size = sizeof(mm);
  mm.x = reinterpret_cast<uintptr_t>(x);
  mm.w = w + static_cast<uint64_t>(offset);
  mm.w_dtype = dtype;
  mm.w_layout = layout;
  mm.out = reinterpret_cast<uintptr_t>(out);
  mm.m = m, mm.n = n, mm.k = k, mm.x_stride = k, mm.out_stride = n;
  return Matmul(c, mm);
}

// One projection's low-rank term (ABI 1.7: a LoRA adapter of the experts), in the GGUF layout:
// A [n_experts * rank, cols] and B [n_experts * rows, rank] stacked per expert. Add() puts
// s B_e (A_e x) into rows of y for expert e, one thread; the callers run it in parallel over
// experts, or Prepare() an expert once and Apply() it to chunks of its rows in parallel. Each
// product rounds its input as the host path and llama.cpp do against a weight of that type:
// against Q8_0 to the SDK's Q8_0 (int8 in blocks of 32 with an f16 scale; the plugin's packed
// MATMUL and LORA keep an f32 scale, which differs in the last bits), against F32/F16/BF16 not
// at all.
struct LowRank {
  const uint8_t* a = nullptr;
  const uint8_t* b = nullptr;
  pc_dtype_t a_dtype = PC_DTYPE_F32, b_dtype = PC_DTYPE_F32;
  int64_t rank = 0, rows = 0, cols = 0;
  float scale = 0;

  bool present() const { return a != nullptr; }

  // Expert e's A_e [rank, cols] and B_e^T [rank, rows] as F32: Apply's operands. B is
  // transposed so that the product with it is `rank` axpys of a whole row each, rather than
  // `rows` dots `rank` long (16 at rank 16, too short for the SIMD dots).
  struct Expert {
    const float* a;
    const float* bt;
  };
  Expert Prepare(int64_t e, std::vector<float>* a_buf, std::vector<float>* bt_buf) const {
    thread_local std::vector<float> wb;
    const float* be = Rows(b, b_dtype, e * rows, rows, rank, &wb);  // [rows, rank]
    bt_buf->resize(rank * rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < rank; ++j) (*bt_buf)[j * rows + r] = be[r * rank + j];
    return {Rows(a, a_dtype, e * rank, rank, cols, a_buf), bt_buf->data()};
  }

  // y[i, 0..rows) += s B_e (A_e x[i]) for the m rows of x [m, ldx]; y is [m, ldy].
  void Apply(const OpContext& c, const Expert& w, const float* x, int64_t ldx, int64_t m,
             float* y, int64_t ldy) const {
    thread_local std::vector<float> rounded, t;
    t.resize(rank);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = Rounded(a_dtype, x + i * ldx, cols, &rounded);
      for (int64_t j = 0; j < rank; ++j) t[j] = scale * c.k->dot_f32(xi, w.a + j * cols, cols);
      const float* ti = Rounded(b_dtype, t.data(), rank, &rounded);
      float* yi = y + i * ldy;
      for (int64_t j = 0; j < rank; ++j) c.k->axpy_f32(ti[j], w.bt + j * rows, yi, rows);
    }
  }

  // Prepare and Apply on this thread.
  void Add(const OpContext& c, int64_t e, const float* x, int64_t ldx, int64_t m, float* y,
           int64_t ldy) const {
    thread_local std::vector<float> wa, bt;
    Apply(c, Prepare(e, &wa, &bt), x, ldx, m, y, ldy);
  }

 private:
  // Rows [first, first + n) of a [*, len] matrix as F32 (F32 read in place, else into *buf).
  static const float* Rows(const uint8_t* w, pc_dtype_t dtype, int64_t first, int64_t n,
                           int64_t len, std::vector<float>* buf) {
    const int64_t row_bytes = sdk::RowBytes(dtype, len);
    if (dtype == PC_DTYPE_F32) return reinterpret_cast<const float*>(w + first * row_bytes);
    buf->resize(n * len);
    sdk::DequantizeRow(dtype, w + first * row_bytes, buf->data(), n * len);
    return buf->data();
  }
  // v [n] as a product against a `dtype` weight reads it.
  static const float* Rounded(pc_dtype_t dtype, const float* v, int64_t n,
                              std::vector<float>* buf) {
    if (dtype != PC_DTYPE_Q8_0) return v;
    thread_local std::vector<uint8_t> q8;
    q8.resize(sdk::RowBytes(PC_DTYPE_Q8_0, n));
    buf->resize(n);
    sdk::QuantizeRow(PC_DTYPE_Q8_0, v, q8.data(), n);
    sdk::DequantizeRow(PC_DTYPE_Q8_0, q8.data(), buf->data(), n);
    return buf->data();
  }
};

// The launch's terms: gate, up, down (absent ones not present()).
struct LowRanks {
  LowRank p[3];
  bool any() const { return p[0].present() || p[1].present() || p[2].present(); }
};

LowRanks LowRanksOf(const pc_moe_args_t& a) {
  LowRanks l;
  for (int i = 0; i < 3; ++i) {
    const sdk::MoeLowRank t = sdk::MoeLowRankOf(a, i);
    if (!t.present()) continue;
    l.p[i] = {Ptr<const uint8_t>(t.a), Ptr<const uint8_t>(t.b), a.lora_a_dtype, a.lora_b_dtype,
              t.rank, t.rows, t.cols, t.scale};
  }
  return l;
}

// Runs fn(j, g) for every expert group j < n_jobs and row group g < n_groups, in parallel.
template <typename F>
void ForEachJobGroup(const OpContext& c, int64_t n_jobs, int64_t n_groups, F&& fn) {
  const int64_t n = n_jobs * n_groups;
  const int64_t per_task = std::max<int64_t>(1, n / (int64_t(c.pool->size()) * 4));
  const int64_t n_tasks = (n + per_task - 1) / per_task;
  auto body = [&](int64_t task) {
    for (int64_t i = task * per_task; i < std::min(n, (task + 1) * per_task); ++i)
      fn(i / n_groups, i % n_groups);
  };
  if (n_tasks <= 1) {
    body(0);
  } else {
    c.pool->Run(n_tasks, body);
  }
}

// One token's row in an expert's group of rows.
struct Routed {
  int64_t token;
  float weight;
};

// Every weight packed (packed.h): the chosen experts' products run in two parallel passes over
// (expert, row group) pairs, gate and up together (sharing the quantized activations; the
// SwiGLU applied to each tile as it is made), then down, so a decode step pays the pool's
// start-up twice rather than three times per expert, and the work of all experts is balanced
// across the threads at once.
const char* MoePacked(const OpContext& c, const pc_moe_args_t& a, const LowRanks& low,
                      const std::vector<std::vector<Routed>>& rows_of) {
  PackedFormat fg, fu, fd;
  if (!PackedFormatOf(a.gate_dtype, &fg) || !PackedFormatOf(a.up_dtype, &fu) ||
      !PackedFormatOf(a.down_dtype, &fd) || a.n_ff % kPackRows != 0 ||
      a.n_embd % kPackRows != 0 || a.n_embd % kBlock != 0 || a.n_ff % kBlock != 0)
    return "expert rows not a multiple of the packed row group";
  const auto* x = Ptr<const float>(a.x);
  auto* out = Ptr<float>(a.out);
  const auto* gate = Ptr<const uint8_t>(a.gate);
  const auto* up = Ptr<const uint8_t>(a.up);
  const auto* down = Ptr<const uint8_t>(a.down);
  const int64_t kb_embd = a.n_embd / kBlock, kb_ff = a.n_ff / kBlock;
  const int64_t gate_group = kb_embd * fg.block_bytes(), up_group = kb_embd * fu.block_bytes();
  const int64_t down_group = kb_ff * fd.block_bytes();
  const int64_t ff_groups = a.n_ff / kPackRows, embd_groups = a.n_embd / kPackRows;

  // The experts that run, and where their rows start in the gathered row space [R].
  struct Job {
    int64_t expert, first, m;
  };
  std::vector<Job> jobs;
  int64_t n_rows = 0;
  for (int64_t e = 0; e < a.n_experts; ++e) {
    const int64_t m = static_cast<int64_t>(rows_of[e].size());
    if (m == 0) continue;
    jobs.push_back({e, n_rows, m});
    n_rows += m;
  }
  // Gate and up share the quantized tokens unless their dtypes round activations differently
  // (ActScaleBlock: a K-quant beside a 32-block type), when up gets its own copy.
  const int64_t gate_block = ActScaleBlock(a.gate_dtype), up_block = ActScaleBlock(a.up_dtype);
  const bool up_own = up_block != gate_block;
  static std::vector<ActBlock> xq, xq_up, hq;  // launches on one device are serialised
  static std::vector<float> hidden, down_out;
  xq.resize(n_rows * kb_embd);    // [R, n_embd / 32] gathered, quantized tokens
  xq_up.resize(up_own ? n_rows * kb_embd : 0);
  hidden.resize(n_rows * a.n_ff);  // [R, n_ff] silu(gate) * up
  hq.resize(n_rows * kb_ff);      // [R, n_ff / 32] quantized hidden
  down_out.resize(n_rows * a.n_embd);  // [R, n_embd]
  // Each token is quantized once, then copied to its rows.
  std::vector<ActBlock> token_q(a.n_tokens * kb_embd), token_q_up(up_own ? token_q.size() : 0);
  ForEachJobGroup(c, a.n_tokens, 1, [&](int64_t t, int64_t) {
    c.k->quantize_row(x + t * a.n_embd, a.n_embd, gate_block, &token_q[t * kb_embd]);
    if (up_own) c.k->quantize_row(x + t * a.n_embd, a.n_embd, up_block, &token_q_up[t * kb_embd]);
  });
  for (const Job& j : jobs)
    for (int64_t i = 0; i < j.m; ++i) {
      const int64_t token = rows_of[j.expert][i].token;
      std::memcpy(&xq[(j.first + i) * kb_embd], &token_q[token * kb_embd],
                  kb_embd * sizeof(ActBlock));
      if (up_own)
        std::memcpy(&xq_up[(j.first + i) * kb_embd], &token_q_up[token * kb_embd],
                    kb_embd * sizeof(ActBlock));
    }

  // The low-rank terms of gate and up [R, n_ff] each, in parallel over (expert, projection),
  // added to the tiles before the SwiGLU.
  static std::vector<float> low_gate, low_up, xg;
  low_gate.clear();  // empty: no term (these persist between launches)
  low_up.clear();
  if (low.p[0].present() || low.p[1].present()) {
    xg.resize(n_rows * a.n_embd);  // [R, n_embd] gathered tokens
    for (const Job& j : jobs)
      for (int64_t i = 0; i < j.m; ++i)
        std::memcpy(&xg[(j.first + i) * a.n_embd], x + rows_of[j.expert][i].token * a.n_embd,
                    a.n_embd * sizeof(float));
    low_gate.assign(low.p[0].present() ? n_rows * a.n_ff : 0, 0.f);
    low_up.assign(low.p[1].present() ? n_rows * a.n_ff : 0, 0.f);
    ForEachJobGroup(c, static_cast<int64_t>(jobs.size()), 2, [&](int64_t ji, int64_t p) {
      const Job& j = jobs[ji];
      if (!low.p[p].present()) return;
      float* y = (p == 0 ? low_gate : low_up).data() + j.first * a.n_ff;
      low.p[p].Add(c, j.expert, &xg[j.first * a.n_embd], a.n_embd, j.m, y, a.n_ff);
    });
  }
  constexpr int64_t kMBlock = 64;  // activation rows per kernel call, as MatmulPacked
  ForEachJobGroup(c, static_cast<int64_t>(jobs.size()), ff_groups, [&](int64_t ji, int64_t g) {
    const Job& j = jobs[ji];
    thread_local std::vector<float> tile_g, tile_u;
    tile_g.resize(kMBlock * kPackRows);
    tile_u.resize(kMBlock * kPackRows);
    const uint8_t* wg = gate + (j.expert * ff_groups + g) * gate_group;
    const uint8_t* wu = up + (j.expert * ff_groups + g) * up_group;
    for (int64_t i0 = 0; i0 < j.m; i0 += kMBlock) {
      const int64_t mb = std::min(kMBlock, j.m - i0);
      const ActBlock* xr = &xq[(j.first + i0) * kb_embd];
      const ActBlock* xr_up = up_own ? &xq_up[(j.first + i0) * kb_embd] : xr;
      c.k->gemm_packed(fg, wg, kb_embd, xr, kb_embd, mb, tile_g.data());
      c.k->gemm_packed(fu, wu, kb_embd, xr_up, kb_embd, mb, tile_u.data());
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t at = (j.first + i0 + i) * a.n_ff + g * kPackRows;
        if (!low_gate.empty())
          for (int64_t r = 0; r < kPackRows; ++r) tile_g[i * kPackRows + r] += low_gate[at + r];
        if (!low_up.empty())
          for (int64_t r = 0; r < kPackRows; ++r) tile_u[i * kPackRows + r] += low_up[at + r];
        c.k->swiglu(&tile_g[i * kPackRows], &tile_u[i * kPackRows],
                    &hidden[(j.first + i0 + i) * a.n_ff + g * kPackRows], kPackRows);
      }
    }
  });
  ForEachJobGroup(c, n_rows, 1, [&](int64_t r, int64_t) {
    c.k->quantize_row(&hidden[r * a.n_ff], a.n_ff, ActScaleBlock(a.down_dtype), &hq[r * kb_ff]);
  });
  ForEachJobGroup(c, static_cast<int64_t>(jobs.size()), embd_groups, [&](int64_t ji, int64_t g) {
    const Job& j = jobs[ji];
    thread_local std::vector<float> tile;
    tile.resize(kMBlock * kPackRows);
    const uint8_t* wd = down + (j.expert * embd_groups + g) * down_group;
    for (int64_t i0 = 0; i0 < j.m; i0 += kMBlock) {
      const int64_t mb = std::min(kMBlock, j.m - i0);
      c.k->gemm_packed(fd, wd, kb_ff, &hq[(j.first + i0) * kb_ff], kb_ff, mb, tile.data());
      for (int64_t i = 0; i < mb; ++i) {
        std::memcpy(&down_out[(j.first + i0 + i) * a.n_embd + g * kPackRows],
                    &tile[i * kPackRows], kPackRows * sizeof(float));
      }
    }
  });
  // down's low-rank term on the hidden rows, in parallel over experts (rows apart).
  if (low.p[2].present()) {
    ForEachJobGroup(c, static_cast<int64_t>(jobs.size()), 1, [&](int64_t ji, int64_t) {
      const Job& j = jobs[ji];
      low.p[2].Add(c, j.expert, &hidden[j.first * a.n_ff], a.n_ff, j.m,
                   &down_out[j.first * a.n_embd], a.n_embd);
    });
  }
  // The weighted sum, expert by expert in index order (as the per-expert path adds them).
  if (!a.accumulate) std::fill(out, out + a.n_tokens * a.n_embd, 0.f);
  for (const Job& j : jobs) {
    for (int64_t i = 0; i < j.m; ++i) {
      const Routed& r = rows_of[j.expert][i];
      c.k->axpy_f32(r.weight, &down_out[(j.first + i) * a.n_embd], out + r.token * a.n_embd,
                    a.n_embd);
    }
  }
  return nullptr;
}

}  // namespace

const char* Moe(const OpContext& c, const pc_moe_args_t& a) {
  if (a.n_tokens == 0) return nullptr;
  const auto* x = Ptr<const float>(a.x);            // [n_tokens, n_embd]
  const auto* logits = Ptr<const float>(a.logits);  // [n_tokens, n_experts]
  auto* out = Ptr<float>(a.out);                    // [n_tokens, n_embd]
  if (!x || !logits || !a.gate || !a.up || !a.down || !out) return "null operand";

  // Routing, then each expert's (token, weight) list in token order.
  std::vector<int32_t> chosen(a.n_tokens * a.n_used);
  std::vector<float> weights(a.n_tokens * a.n_used);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    sdk::MoeRoute(logits + t * a.n_experts, a.n_experts, a.n_used, a.norm_weights != 0,
                  &chosen[t * a.n_used], &weights[t * a.n_used]);
  }
  const LowRanks low = LowRanksOf(a);  // 1.7: none in an older host's shorter struct
  std::vector<std::vector<Routed>> rows_of(a.n_experts);
  for (int64_t i = 0; i < a.n_tokens * a.n_used; ++i)
    rows_of[chosen[i]].push_back({i / a.n_used, weights[i]});
  if (a.gate_layout == kLayoutPacked && a.up_layout == kLayoutPacked &&
      a.down_layout == kLayoutPacked && a.n_ff % kPackRows == 0 && a.n_embd % kPackRows == 0)
    return MoePacked(c, a, low, rows_of);

  if (!a.accumulate) std::fill(out, out + a.n_tokens * a.n_embd, 0.f);
  // Scratch for the largest group; launches on one device are serialised by the plugin.
  static std::vector<float> xg, gate, up, down, low_a, low_bt;
  // A projection's low-rank term for expert e's m rows: A_e and B_e^T made once, then applied
  // in parallel over chunks of rows.
  auto add_low = [&](int p, int64_t e, const float* in, int64_t ld_in, int64_t m, float* y,
                     int64_t ld_y) {
    if (!low.p[p].present()) return;
    const LowRank::Expert w = low.p[p].Prepare(e, &low_a, &low_bt);
    const int64_t chunk = std::max<int64_t>(1, m / (int64_t(c.pool->size()) * 2));
    ForEachJobGroup(c, (m + chunk - 1) / chunk, 1, [&](int64_t q, int64_t) {
      const int64_t i0 = q * chunk, n = std::min(chunk, m - i0);
      low.p[p].Apply(c, w, in + i0 * ld_in, ld_in, n, y + i0 * ld_y, ld_y);
    });
  };
  for (int64_t e = 0; e < a.n_experts; ++e) {
    const auto& rows = rows_of[e];
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) continue;
    xg.resize(m * a.n_embd);      // [m, n_embd] the gathered tokens
    gate.resize(m * a.n_ff);      // [m, n_ff]
    up.resize(m * a.n_ff);        // [m, n_ff]
    down.resize(m * a.n_embd);    // [m, n_embd]
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(&xg[i * a.n_embd], x + rows[i].token * a.n_embd, a.n_embd * sizeof(float));
    if (const char* why = ExpertMatmul(c, a.gate, a.gate_dtype, a.gate_layout, e, a.n_ff,
                                       a.n_embd, xg.data(), m, gate.data()))
      return why;
    if (const char* why = ExpertMatmul(c, a.up, a.up_dtype, a.up_layout, e, a.n_ff, a.n_embd,
                                       xg.data(), m, up.data()))
      return why;
    add_low(0, e, xg.data(), a.n_embd, m, gate.data(), a.n_ff);
    add_low(1, e, xg.data(), a.n_embd, m, up.data(), a.n_ff);
    c.k->swiglu(gate.data(), up.data(), gate.data(), m * a.n_ff);
    if (const char* why = ExpertMatmul(c, a.down, a.down_dtype, a.down_layout, e, a.n_embd,
                                       a.n_ff, gate.data(), m, down.data()))
      return why;
    add_low(2, e, gate.data(), a.n_ff, m, down.data(), a.n_embd);
    for (int64_t i = 0; i < m; ++i)
      c.k->axpy_f32(rows[i].weight, &down[i * a.n_embd], out + rows[i].token * a.n_embd,
                    a.n_embd);
  }
  return nullptr;
}

}  // namespace polychip::cpu
