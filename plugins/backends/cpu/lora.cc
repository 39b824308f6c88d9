// LORA on the cpu plugin (ABI 1.8): one adapter's low-rank term over the listed rows of a batch,
// out[rows] += scale (x[rows] A^T) B^T, with A and B in the layouts weight_upload gave them
// (panels for float matrices of 32 rows or more, the GGUF layout for the thinner A of a rank
// under 32, packed groups for Q8_0).
//
// A launch of a few rows (decode: one adapter's sequences of a step) with float A and B reads
// 30-750 KB that come from memory (an adapter's matrices are read once per step), so its cost is
// how fast those bytes stream: A's rows are read once, unpadded, with prefetches ahead of the
// reads (the hardware prefetcher stops at each 4 KiB page), and t goes straight into B's pass.
// Under kMinParallelBytes it runs on the calling thread; above, as one region of the pool
// (FewRowsRegion). The panel layout's padding of A to 32 rows, a MATMUL launch for A and a
// second parallel pass for B made qwen2.5-0.5b's rank-16 adapter cost 1.23 ms of a decode step;
// this way it costs 0.83-0.97 ms (bench/decode_kernels lora).
//
// More rows (prefill, batches) with a thin float A and float B (a rank under 32, the usual
// adapter) run as shares of the rows, one per thread (RowShares): each thread computes its rows
// of t and adds its rows of t B^T, so no part of t passes between threads and a launch is one
// region of the pool. Other types take two steps: t is the plugin's MATMUL against A (x rounded
// as that MATMUL rounds it; a thin float A takes its dot4x4 path), then one parallel pass over
// B's row groups. Both add B's products with the kernel MATMUL runs on B's layout (gemm_panel on
// float panels, gemm_packed on packed Q8_0 with t in its int8 blocks) against many rows at once,
// straight from the kernel's tile into the listed rows, so the rows are scattered inside the
// pass, and a row's sums are the same on both paths.
#include <algorithm>
#include <atomic>
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
// Up to this many listed rows, a launch with float A and B is the few-rows pass (the file's
// comment).
constexpr int64_t kFewRows = 8;

// A weight's row groups as the kernel of its layout takes them: panels of 32 rows, packed
// groups of 16, or single GGUF rows.
struct Groups {
  int64_t rows = 1, bytes = 0;
  PackedFormat packed;  // kLayoutPacked's format
  // Groups holding n rows.
  int64_t CountFor(int64_t n) const { return (n + rows - 1) / rows; }
};

// nullptr, or why the plugin has no kernel for a [n, k] weight of dtype in layout.
const char* GroupsOf(const OpContext& c, pc_dtype_t dtype, uint32_t layout, int64_t k,
                     Groups* g) {
  g->rows = 1;
  g->bytes = sdk::RowBytes(dtype, k);
  if (layout == kLayoutPanel) {
    if (!c.k->gemm_panel) return "panel layout for this ISA";
    g->rows = kPanelRows;
    g->bytes = kPanelRows * k * PanelElemBytes(dtype);
  } else if (layout == kLayoutPacked) {
    if (!PackedFormatOf(dtype, &g->packed) || k % kBlock != 0)
      return "packed layout for this dtype";
    g->rows = kPackRows;
    g->bytes = k / kBlock * g->packed.block_bytes();
  }
  return nullptr;
}

// Asks for bytes [p, p + n) ahead of their use. An adapter's matrices are small and read once
// per step, so they come from memory, and the hardware prefetcher stops at every 4 KiB page: a
// launch that waited for each line would read at half the speed both cores can.
inline void Prefetch(const uint8_t* p, int64_t n) {
  for (int64_t off = 0; off < n; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// A float weight (F32, F16, BF16: the types panels hold) the few-rows region reads directly,
// with no int8 rounding of its input.
bool FloatLayout(pc_dtype_t dtype, uint32_t layout) {
  return PanelDtype(dtype) && (layout == kLayoutPanel || layout == PC_LAYOUT_GGUF);
}

// Bytes a stream is prefetched ahead of its reads.
constexpr int64_t kPrefetchAhead = 2048;

// x . row over pieces of 512 bytes, each asking (with `end`, where the caller's reads stop; null
// for none) for the bytes kPrefetchAhead past it. Summed the same way with or without, so a
// row's result does not depend on its place in the launch.
float DotRowPrefetched(const OpContext& c, pc_dtype_t dtype, const float* x, const uint8_t* row,
                       int64_t k, const uint8_t* end) {
  const int64_t elem = sdk::RowBytes(dtype, 1), piece = 512 / elem;
  float sum = 0;
  for (int64_t e = 0; e < k; e += piece) {
    const uint8_t* at = row + e * elem;
    if (end && at + kPrefetchAhead < end)
      Prefetch(at + kPrefetchAhead, std::min<int64_t>(512, end - at - kPrefetchAhead));
    sum += DotFloatRow(*c.k, dtype, x + e, at, std::min(piece, k - e));
  }
  return sum;
}

// t[i, at + r] = scale * x_i . A_(g * rows + r) for the rank rows of A's group g (a float panel
// or GGUF row) and every listed row i (xs [n_rows, k], t [n_rows, width]). A GGUF row streams
// with prefetches up to `end`, where the caller's reads of A stop.
void ProductOfAGroup(const OpContext& c, const pc_lora_args_t& a, const Groups& ga, int64_t g,
                     const float* xs, int64_t width, int64_t at, float* t, const uint8_t* end) {
  const uint8_t* group = Ptr<const uint8_t>(a.a) + g * ga.bytes;
  if (a.a_layout != kLayoutPanel) {
    for (int64_t i = 0; i < a.n_rows; ++i) {
      const float* x = xs + i * a.k;
      // The first row's reads bring the group into cache for the others.
      t[i * width + at] =
          a.scale * DotRowPrefetched(c, a.a_dtype, x, group, a.k, i == 0 ? end : nullptr);
    }
    return;
  }
  const int64_t nr = std::min(ga.rows, a.rank - g * ga.rows);  // the panel's rows of A
  float acc[kPanelTileRows * kPanelRows];
  for (int64_t i0 = 0; i0 < a.n_rows; i0 += kPanelTileRows) {
    const int64_t mb = std::min(kPanelTileRows, a.n_rows - i0);
    std::fill(acc, acc + mb * kPanelRows, 0.f);
    c.k->gemm_panel(a.a_dtype, group, a.k, xs + i0 * a.k, a.k, mb, acc);
    for (int64_t i = 0; i < mb; ++i)
      for (int64_t r = 0; r < nr; ++r)
        t[(i0 + i) * width + at + r] = a.scale * acc[i * kPanelRows + r];
  }
}

// kPrefetchAhead in whole row groups of g (at least one).
int64_t GroupsAhead(const Groups& g) { return std::max<int64_t>(1, kPrefetchAhead / g.bytes); }

// out[rows] += t B^T over B's row groups [g0, g1) for the listed rows [r0, r1): each group
// against all those rows at once (t [r1 - r0, rank]; tq, t in int8 blocks, for packed B). Rows
// go through the kernel in tiles of kPanelTileRows from r0, so with r0 a multiple of it a row's
// sums do not depend on how the rows are shared out.
void AddGroups(const OpContext& c, const pc_lora_args_t& a, const Groups& gb, const float* t,
               const ActBlock* tq, int64_t g0, int64_t g1, int64_t r0, int64_t r1) {
  const auto* rows = Ptr<const int32_t>(a.rows);  // [n_rows], or null for 0..n_rows-1
  auto* out = Ptr<float>(a.out);                  // [m, n]
  const auto* b = Ptr<const uint8_t>(a.b);
  const int64_t kb = a.rank / kBlock;
  thread_local std::vector<float> acc, w;
  acc.resize(std::min(a.n_rows, kMBlock) * gb.rows);  // [rows of a block, gb.rows]
  w.resize(a.rank);
  const int64_t ahead = GroupsAhead(gb);
  Prefetch(b + g0 * gb.bytes, std::min(g1 - g0, ahead) * gb.bytes);
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* group = b + g * gb.bytes;
    if (g + ahead < g1) Prefetch(group + ahead * gb.bytes, gb.bytes);
    const int64_t j0 = g * gb.rows, n_cols = std::min(gb.rows, a.n - j0);
    for (int64_t i0 = r0; i0 < r1; i0 += kMBlock) {
      const int64_t mb = std::min(kMBlock, r1 - i0);
      const float* ti = t + (i0 - r0) * a.rank;  // the block's rows of t
      if (a.b_layout == kLayoutPanel) {
        std::fill(acc.begin(), acc.begin() + mb * gb.rows, 0.f);
        for (int64_t i = 0; i < mb; i += kPanelTileRows) {
          c.k->gemm_panel(a.b_dtype, group, a.rank, ti + i * a.rank, a.rank,
                          std::min(kPanelTileRows, mb - i), acc.data() + i * gb.rows);
        }
      } else if (a.b_layout == kLayoutPacked) {
        c.k->gemm_packed(gb.packed, group, kb, tq + (i0 - r0) * kb, kb, mb, acc.data());
      } else {  // a GGUF row: its dot with every row of t
        sdk::DequantizeRow(a.b_dtype, group, w.data(), a.rank);
        for (int64_t i = 0; i < mb; ++i) acc[i] = c.k->dot_f32(ti + i * a.rank, w.data(), a.rank);
      }
      for (int64_t i = 0; i < mb; ++i) {
        const int64_t row = rows ? int64_t{rows[i0 + i]} : i0 + i;
        float* y = out + row * a.n + j0;
        const float* v = acc.data() + i * gb.rows;
        for (int64_t r = 0; r < n_cols; ++r) y[r] += v[r];
      }
    }
  }
}

float* AlignedTo64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// [begin, end) of part p of n items split into n_parts.
inline int64_t PartBegin(int64_t n, int64_t n_parts, int64_t p) { return n * p / n_parts; }

// The few-rows launch (float A and B) as one region of the pool. Each task computes its part of
// t (a contiguous share of A's row groups), reads the others' parts, then adds B's row groups of
// the parts it claims: its own (four), then, from the back, any another task has not reached.
// A cache line another core wrote costs ~0.15 us to read on these VMs and a launch lasts a few
// microseconds, so the tasks share little: each part of t in lines of its own, one flag per
// part in a line of its own, tagged with the launch's number so that nothing is reset between
// launches. A task that finds a part of A unclaimed once its own is done computes it itself
// (its task may not have started: the pool runs a sleeping worker's tasks on the caller, one
// after the other), and it waits only for parts claimed by a running task, so the region
// completes whoever runs its tasks.
class FewRowsRegion {
 public:
  // Whether a launch runs on the calling thread. One under kMinParallelBytes does: waking the
  // other threads and passing t between them costs more than they save. qwen2.5-0.5b on a
  // 2-core Zen 5, one thread against two: rank 16's 33-184 KB launches 1.8-8.5 us on one, as
  // long or 1-2 us longer on two; rank 64's 229 KB q 8.5 against 9.8 us, its 737 KB gate 25
  // against 18 us.
  static bool OnOneThread(const pc_lora_args_t& a, const Groups& ga, const Groups& gb) {
    constexpr int64_t kMinParallelBytes = 256 << 10;
    return ga.CountFor(a.rank) * ga.bytes + gb.CountFor(a.n) * gb.bytes < kMinParallelBytes;
  }

  static constexpr int kMaxTasks = 16;
  static constexpr int kBPartsPerTask = 4;

  void Run(const OpContext& c, const pc_lora_args_t& a, const Groups& ga, const Groups& gb,
           const float* xs) {
    const int64_t a_groups = ga.CountFor(a.rank);
    const int64_t b_groups = gb.CountFor(a.n);
    const int tasks = OnOneThread(a, ga, gb) ? 1 : std::min(c.pool->size(), kMaxTasks);
    const int64_t a_parts = std::min<int64_t>(tasks, a_groups);
    const int64_t b_parts = std::min<int64_t>(tasks * kBPartsPerTask, b_groups);
    const int64_t launch = ++launches_;
    const int64_t stride = (a.n_rows * a.rank + 15) / 16 * 16;  // a part of t, [n_rows, its rows]
    parts_t_.resize(a_parts * stride + 16);
    float* const parts_t = AlignedTo64(parts_t_.data());
    const auto rank_rows = [&](int64_t p) {  // [first, end) rank rows of A's part p
      return std::pair{std::min(a.rank, PartBegin(a_groups, a_parts, p) * ga.rows),
                       std::min(a.rank, PartBegin(a_groups, a_parts, p + 1) * ga.rows)};
    };
    const auto compute = [&](int64_t p) {
      const auto [r0, r1] = rank_rows(p);
      const uint8_t* first = Ptr<const uint8_t>(a.a) + r0 / ga.rows * ga.bytes;
      const uint8_t* end = Ptr<const uint8_t>(a.a) + ga.CountFor(r1) * ga.bytes;
      Prefetch(first, std::min<int64_t>(kPrefetchAhead, end - first));
      for (int64_t g = r0 / ga.rows; g * ga.rows < r1; ++g) {
        ProductOfAGroup(c, a, ga, g, xs, r1 - r0, g * ga.rows - r0, parts_t + p * stride, end);
      }
      a_state_[p].done.store(launch, std::memory_order_release);
    };
    const auto claim = [&](Flags& f) {
      return f.claimed.exchange(launch, std::memory_order_acq_rel) != launch;
    };
    c.pool->Run(tasks, [&](int64_t task) {
      // The start of this task's share of B, asked for now, arrives while A is multiplied.
      const int64_t own_b = PartBegin(b_groups, b_parts, PartBegin(b_parts, tasks, task));
      Prefetch(Ptr<const uint8_t>(a.b) + own_b * gb.bytes,
               std::min(b_groups - own_b, GroupsAhead(gb)) * gb.bytes);
      if (task < a_parts && claim(a_state_[task])) compute(task);
      for (int64_t p = 0; p < a_parts; ++p) {
        if (a_state_[p].claimed.load(std::memory_order_relaxed) != launch && claim(a_state_[p]))
          compute(p);
      }
      thread_local std::vector<float> t;  // [n_rows, rank], gathered from the parts
      t.resize(a.n_rows * a.rank);
      for (int64_t p = 0; p < a_parts; ++p) {
        for (int round = 0; a_state_[p].done.load(std::memory_order_acquire) != launch; ++round)
          ThreadPool::Backoff(round);
        const auto [r0, r1] = rank_rows(p);
        for (int64_t i = 0; i < a.n_rows; ++i)
          std::copy_n(parts_t + p * stride + i * (r1 - r0), r1 - r0, t.data() + i * a.rank + r0);
      }
      const auto add_part = [&](int64_t p) {
        AddGroups(c, a, gb, t.data(), nullptr, PartBegin(b_groups, b_parts, p),
                  PartBegin(b_groups, b_parts, p + 1), 0, a.n_rows);
      };
      // Owners claim their parts forwards and helpers backwards, so a claimed part means the
      // rest of the way is taken: one look at another task's parts when it needs no help.
      const int64_t own0 = PartBegin(b_parts, tasks, task);
      const int64_t own1 = PartBegin(b_parts, tasks, task + 1);
      for (int64_t p = own0; p < own1 && claim(b_state_[p]); ++p) add_part(p);
      for (int k = 1; k < tasks; ++k) {
        const int64_t other = (task + k) % tasks;
        for (int64_t p = PartBegin(b_parts, tasks, other + 1) - 1;
             p >= PartBegin(b_parts, tasks, other) && claim(b_state_[p]); --p)
          add_part(p);
      }
    });
  }

 private:
  struct alignas(64) Flags {
    std::atomic<int64_t> claimed{0}, done{0};  // the number of the launch that claimed, finished
  };
  int64_t launches_ = 0;
  Flags a_state_[kMaxTasks], b_state_[kMaxTasks * kBPartsPerTask];
  std::vector<float> parts_t_;  // the parts of t, from its first 64-byte boundary
};

// Whether a launch of more rows than the few-rows pass takes runs as RowShares: a thin float A
// as the file has it (a rank under 32) and float B in panels, on a pool of several threads.
bool TakesRowShares(const OpContext& c, const pc_lora_args_t& a) {
  return c.pool->size() > 1 && a.a_layout == PC_LAYOUT_GGUF && PanelDtype(a.a_dtype) &&
         a.b_layout == kLayoutPanel;
}

// A launch of more rows (a batch's decode, a prefill) as shares of its rows, one per thread in
// whole tiles of kPanelTileRows: each task computes its rows of t, A's rows converted to f32
// four at a time against its rows of x four at a time (FourWeightRows and DotFourRows, as
// MatmulGguf does for the two-step path's A product), then adds its rows of t B^T over every
// group of B (AddGroups). No part of t passes between threads and a launch is one region: the
// two-step path runs two, each thread reading all of x against a share of A, then the rows of
// out a share of B's groups covers, half of them stored by the other core. A row's sums are the
// two-step path's.
void RowShares(const OpContext& c, const pc_lora_args_t& a, const Groups& gb, const float* xs) {
  const int64_t tiles = (a.n_rows + kPanelTileRows - 1) / kPanelTileRows;
  const int tasks = static_cast<int>(std::min<int64_t>(c.pool->size(), tiles));
  const int64_t row_bytes = sdk::RowBytes(a.a_dtype, a.k);
  const auto* w = Ptr<const uint8_t>(a.a);
  c.pool->Run(tasks, [&](int64_t task) {
    const int64_t r0 = kPanelTileRows * PartBegin(tiles, tasks, task);
    const int64_t r1 = std::min(a.n_rows, kPanelTileRows * PartBegin(tiles, tasks, task + 1));
    thread_local std::vector<float> t, buf;
    t.resize((r1 - r0) * a.rank);  // [r1 - r0, rank]
    buf.resize(4 * a.k);           // [4, k]: four rows of A as f32
    for (int64_t j0 = 0; j0 < a.rank; j0 += 4) {
      const float* rows[4];
      const int64_t nr = std::min<int64_t>(4, a.rank - j0);
      // A float A (TakesRowShares): it has an f32 form.
      (void)FourWeightRows(c, a.a_dtype, w, row_bytes, j0, a.rank, a.k, buf.data(), rows);
      DotFourRows(*c.k, xs, a.k, r0, r1, rows, a.k, [&](int64_t i, const float* v) {
        for (int64_t r = 0; r < nr; ++r) t[(i - r0) * a.rank + j0 + r] = v[r];
      });
    }
    for (float& v : t) v *= a.scale;  // as the two-step path scales t
    AddGroups(c, a, gb, t.data(), nullptr, 0, gb.CountFor(a.n), r0, r1);
  });
}

// nullptr, or why the plugin cannot run the launch; the row groups of A and B.
const char* Prepare(const OpContext& c, const pc_lora_args_t& a, Groups* ga, Groups* gb) {
  if (!a.x || !a.out || !a.a || !a.b) return "null operand";
  const auto* rows = Ptr<const int32_t>(a.rows);  // [n_rows], or null for 0..n_rows-1
  for (int64_t i = 0; rows && i < a.n_rows; ++i) {
    if (rows[i] < 0 || rows[i] >= a.m) return "lora row out of range";
  }
  if (const char* why = GroupsOf(c, a.a_dtype, a.a_layout, a.k, ga)) return why;
  return GroupsOf(c, a.b_dtype, a.b_layout, a.rank, gb);
}

bool FewRows(const pc_lora_args_t& a) {
  return a.n_rows <= kFewRows && FloatLayout(a.a_dtype, a.a_layout) &&
         FloatLayout(a.b_dtype, a.b_layout);
}

}  // namespace

bool LoraRunsAlone(const OpContext& c, const pc_lora_args_t& a) {
  Groups ga, gb;
  return a.n_rows > 0 && !Prepare(c, a, &ga, &gb) && FewRows(a) &&
         FewRowsRegion::OnOneThread(a, ga, gb);
}

const char* Lora(const OpContext& c, const pc_lora_args_t& a) {
  if (a.n_rows == 0) return nullptr;
  Groups ga, gb;
  if (const char* why = Prepare(c, a, &ga, &gb)) return why;
  const auto* rows = Ptr<const int32_t>(a.rows);
  const auto* x = Ptr<const float>(a.x);  // [m, k]
  // Per thread: a launch the plugin runs on a worker (LoraRunsAlone) may overlap one on the
  // caller. A thread's launches follow each other, and reuse them.
  thread_local std::vector<float> gathered;
  const float* xs = x;  // [n_rows, k]: the listed rows of x
  if (rows) {
    gathered.resize(a.n_rows * a.k);
    for (int64_t i = 0; i < a.n_rows; ++i)
      std::memcpy(gathered.data() + i * a.k, x + rows[i] * a.k, a.k * sizeof(float));
    xs = gathered.data();
  }
  if (FewRows(a)) {
    thread_local FewRowsRegion region;  // its parts of t are its own
    region.Run(c, a, ga, gb, xs);
    return nullptr;
  }
  if (TakesRowShares(c, a)) {
    RowShares(c, a, gb, xs);
    return nullptr;
  }

  static std::vector<float> t;  // the two-step path runs on the caller only
  t.resize(a.n_rows * a.rank);  // [n_rows, rank]
  pc_matmul_args_t mm{};
  mm.struct_size = sizeof(mm);
  mm.x = reinterpret_cast<uintptr_t>(xs);
  mm.w = a.a, mm.w_dtype = a.a_dtype, mm.w_layout = a.a_layout;
  mm.out = reinterpret_cast<uintptr_t>(t.data());
  mm.m = a.n_rows, mm.n = a.rank, mm.k = a.k, mm.x_stride = a.k, mm.out_stride = a.rank;
  if (const char* why = Matmul(c, mm)) return why;
  for (float& v : t) v *= a.scale;  // before B's product, as the SCALE launch was

  static std::vector<ActBlock> tq;  // [n_rows, rank / 32]: t as the packed kernel reads it
  if (a.b_layout == kLayoutPacked) {
    const int64_t kb = a.rank / kBlock;
    tq.resize(a.n_rows * kb);
    for (int64_t i = 0; i < a.n_rows; ++i)
      c.k->quantize_row(t.data() + i * a.rank, a.rank, ActScaleBlock(a.b_dtype), &tq[i * kb]);
  }
  const int64_t n_groups = gb.CountFor(a.n);
  // A thin product (the k and v projections of a few rows) is not worth waking the pool for.
  constexpr int64_t kMinParallelWork = 1 << 16;  // multiply-adds
  const int threads = c.pool->size();
  if (threads <= 1 || a.n_rows * a.n * a.rank < kMinParallelWork) {
    AddGroups(c, a, gb, t.data(), tq.data(), 0, n_groups, 0, a.n_rows);
    return nullptr;
  }
  // About four tasks per thread (a core another process is using is helped out).
  const int64_t chunk = std::max<int64_t>(1, (n_groups + 4 * threads - 1) / (4 * threads));
  c.pool->Run((n_groups + chunk - 1) / chunk, [&](int64_t task) {
    AddGroups(c, a, gb, t.data(), tq.data(), task * chunk, std::min(n_groups, (task + 1) * chunk),
              0, a.n_rows);
  });
  return nullptr;
}

}  // namespace polychip::cpu
