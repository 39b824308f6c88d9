#include "cpu_ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

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

// Splits [0, n) into about `per_thread` chunks per thread (dynamic scheduling evens out a
// core that another process is using), each at least `min_chunk` long.
int64_t ChunkSize(int64_t n, int threads, int64_t min_chunk, int per_thread = 4) {
  const int64_t chunks = std::max<int64_t>(1, int64_t(threads) * per_thread);
  return std::max(min_chunk, (n + chunks - 1) / chunks);
}

template <typename F>
void ParallelRange(const OpContext& c, int64_t n, int64_t chunk, F&& body) {
  const int64_t n_tasks = (n + chunk - 1) / chunk;
  if (n_tasks <= 1) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  c.pool->Run(n_tasks, [&](int64_t t) { body(t * chunk, std::min(n, (t + 1) * chunk)); });
}

// ParallelRange with tasks that shrink as the range runs out (guided scheduling): each takes
// 1/(2 x threads) of what is left, at least min_chunk. Early tasks are long (few claims); the
// last ones are short, so the threads finish together instead of one waiting a whole
// fixed-size chunk for the other at the end of every matmul.
template <typename F>
void ParallelRangeGuided(const OpContext& c, int64_t n, int64_t min_chunk, F&& body) {
  const int64_t split = 2 * int64_t{c.pool->size()};
  if (split <= 2 || n <= min_chunk) {
    if (n > 0) body(int64_t{0}, n);
    return;
  }
  thread_local std::vector<int64_t> starts;  // task t is [starts[t], starts[t + 1])
  starts.clear();
  for (int64_t at = 0; at < n; at += std::max(min_chunk, (n - at) / split)) starts.push_back(at);
  starts.push_back(n);
  const int64_t* bounds = starts.data();  // the workers read the caller's vector
  c.pool->Run(static_cast<int64_t>(starts.size()) - 1,
              [&](int64_t t) { body(bounds[t], bounds[t + 1]); });
}

// [0, n) as one contiguous region per thread, each walked from its front by the thread that
// owns it; a thread whose region is done takes items one at a time from the back of the
// others' (so a descheduled or slower core is helped out at the end). body(i) runs item i.
// A thread's items are consecutive, so in a decode matmul each of its weight streams is one
// sequential read from start to end: the hardware prefetcher trains once per matmul, not once
// per chunk as with ParallelRangeGuided's shrinking chunks handed out alternately (q and o of
// qwen2.5-0.5b, 896 x 896 Q5_0: 0.63-0.77 of a plain read of the same bytes -> 0.80-0.95).
template <typename F>
void ParallelRegions(const OpContext& c, int64_t n, F&& body) {
  const int threads = c.pool->size();
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  // Region t is [front, back) packed as (front << 32) | back; n < 2^31 (rows / 16).
  struct alignas(64) Region {
    std::atomic<uint64_t> fb;
  };
  thread_local std::unique_ptr<Region[]> regions;
  thread_local int capacity = 0;
  if (capacity < threads) regions.reset(new Region[capacity = threads]);
  for (int t = 0; t < threads; ++t) {
    const uint64_t front = n * t / threads, back = n * (t + 1) / threads;
    regions[t].fb.store(front << 32 | back, std::memory_order_relaxed);
  }
  Region* r = regions.get();  // the workers use the caller's regions
  c.pool->Run(threads, [&](int64_t self) {
    // Own region from the front, a quarter of what is left per claim: a few atomic operations
    // per region instead of one per item (~8K items per qwen2.5-0.5b token; the same tg64,
    // compare-builds 0.995), and the other threads can still take the region's last items.
    uint64_t v = r[self].fb.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t front = v >> 32, back = v & 0xFFFFFFFFu;
      if (front >= back) break;
      const uint64_t end = front + std::max<uint64_t>(1, (back - front) / 4);
      const uint64_t claimed = end << 32 | back;
      if (!r[self].fb.compare_exchange_weak(v, claimed, std::memory_order_acq_rel)) continue;
      for (uint64_t i = front; i < end; ++i) body(static_cast<int64_t>(i));
      v = r[self].fb.load(std::memory_order_acquire);
    }
    for (int k = 1; k < threads; ++k) {  // then the others', one item at a time from the back
      Region& o = r[(self + k) % threads];
      uint64_t w = o.fb.load(std::memory_order_acquire);
      for (;;) {
        const uint64_t front = w >> 32, back = w & 0xFFFFFFFFu;
        if (front >= back) break;
        if (!o.fb.compare_exchange_weak(w, front << 32 | (back - 1), std::memory_order_acq_rel))
          continue;
        body(static_cast<int64_t>(back - 1));
        w = o.fb.load(std::memory_order_acquire);
      }
    }
  });
}

inline void Store(const pc_matmul_args_t& a, const float* bias, float* out, int64_t i, int64_t j,
                  float v) {
  float& y = out[i * a.out_stride + j];
  v += bias ? bias[j] : 0.f;
  y = a.accumulate ? y + v : v;
}

// y[0..n) = v (+ bias) or, when accumulating, y += v (+ bias): the branches are outside the
// loops so they vectorize.
inline void StoreRow(const pc_matmul_args_t& a, const float* bias, const float* v, int64_t n,
                     float* y) {
  if (a.accumulate) {
    if (bias) {
      for (int64_t r = 0; r < n; ++r) y[r] += v[r] + bias[r];
    } else {
      for (int64_t r = 0; r < n; ++r) y[r] += v[r];
    }
  } else if (bias) {
    for (int64_t r = 0; r < n; ++r) y[r] = v[r] + bias[r];
  } else if (n == kPackRows) {  // the usual case: a constant size is inlined, not a libc call
    std::memcpy(y, v, kPackRows * sizeof(float));
  } else {
    for (int64_t r = 0; r < n; ++r) y[r] = v[r];
  }
}

// Activation rows quantized for the packed kernels; grown as needed, reused across launches
// (launches on one device are serialised by the plugin).
std::vector<ActBlock>& ActBuffer() {
  static std::vector<ActBlock> buf;
  return buf;
}

const char* MatmulPacked(const OpContext& c, const pc_matmul_args_t& a) {
  PackedFormat f;
  if (!PackedFormatOf(a.w_dtype, &f) || a.k % kBlock != 0) return "packed layout for this dtype";
  const auto* x = Ptr<const float>(a.x);  // [m, x_stride]
  const auto* w = Ptr<const uint8_t>(a.w);
  const auto* bias = Ptr<const float>(a.bias);
  auto* out = Ptr<float>(a.out);  // [m, out_stride]
  const int64_t kb = a.k / kBlock;
  std::vector<ActBlock>& act = ActBuffer();  // [m, kb]
  if (static_cast<int64_t>(act.size()) < a.m * kb) act.resize(a.m * kb);
  ActBlock* xq = act.data();
  const int64_t scale_block = ActScaleBlock(a.w_dtype);
  auto quantize = [&](int64_t i) {
    c.k->quantize_row(x + i * a.x_stride, a.k, scale_block, xq + i * kb);
  };
  if (a.m * a.k <= 32768) {
    for (int64_t i = 0; i < a.m; ++i) quantize(i);
  } else {
    ParallelRange(c, a.m, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) quantize(i);
    });
  }
  const int64_t n_groups = (a.n + kPackRows - 1) / kPackRows;
  const int64_t group_bytes = kb * f.block_bytes();
  if (a.m == 1) {
    // Decode: the groups as `streams` runs of `run` groups (the last run may be shorter), read
    // in lockstep (KernelTable::gemm_packed_streams) so that each thread has that many
    // far-apart parts of the matrix in flight; one run where the ISA has no streams kernel or
    // the matrix is a few groups. Item j is position j of every run; each thread takes a
    // contiguous range of positions (ParallelRegions), so its streams stay sequential. With a
    // tuner (OpContext::streams_tuner) the count and the prefetching are its pick, and the
    // launch is timed for it.
    const bool tuned = c.streams_tuner && c.k->gemm_packed_streams &&
                       n_groups >= 2 * StreamsTuner::kMaxStreams;
    const int candidate = tuned ? c.streams_tuner->Pick(w) : 0;
    WeightRead read{c.weight_streams, c.weight_prefetch};
    if (tuned) {
      read = StreamsTuner::Candidate(candidate);
    } else if (!c.k->gemm_packed_streams || n_groups < 2 * c.weight_streams) {
      read.streams = 1;
    }
    const int streams = read.streams;
    const auto start =
        tuned ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const int64_t run = (n_groups + streams - 1) / streams;
    ParallelRegions(c, run, [&](int64_t j) {
      float tile[kMaxWeightStreams * kPackRows];
      int64_t ns = streams;
      while (ns > 0 && (ns - 1) * run + j >= n_groups) --ns;  // past the matrix's end
      if (c.k->gemm_packed_streams) {
        c.k->gemm_packed_streams(f, w + j * group_bytes, run * group_bytes,
                                 static_cast<int>(ns), kb, xq, tile, read.prefetch);
      } else {
        c.k->gemm_packed(f, w + j * group_bytes, kb, xq, kb, 1, tile);
      }
      for (int64_t s = 0; s < ns; ++s) {
        const int64_t j_row = (s * run + j) * kPackRows;
        const int64_t rows = std::min<int64_t>(kPackRows, a.n - j_row);
        StoreRow(a, bias ? bias + j_row : nullptr, tile + s * kPackRows, rows, out + j_row);
      }
    });
    if (tuned) {
      c.streams_tuner->Record(
          w, candidate,
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                               start)
              .count());
    }
    return nullptr;
  }
  // Rows of activations handled per kernel call: keeps them in L2 while the group's weights
  // are reused from L1 for each 4-row tile.
  constexpr int64_t kMBlock = 64;
  // Group g against activation rows i0 .. i0 + mb (mb <= kMBlock), into the output.
  const auto run_group = [&](int64_t g, int64_t i0, int64_t mb) {
    float tile[kMBlock * kPackRows];
    c.k->gemm_packed(f, w + g * group_bytes, kb, xq + i0 * kb, kb, mb, tile);
    const int64_t j0 = g * kPackRows, rows = std::min<int64_t>(kPackRows, a.n - j0);
    for (int64_t i = 0; i < mb; ++i)
      StoreRow(a, bias ? bias + j0 : nullptr, tile + i * kPackRows, rows,
               out + (i0 + i) * a.out_stride + j0);
  };
  if (a.m <= kMBlock) {
    // Batched decode and short prefills (one block of rows): each thread walks one contiguous
    // region of groups, as decode does (ParallelRegions), instead of the shrinking chunks
    // handed out alternately below, which restart each thread's weight stream at every chunk
    // (decode_kernels, the qwen2.5-0.5b Q4_K_M step's matmuls alternated in one process:
    // m = 2 1.04-1.07, m = 4 1.10, m = 8 1.08, m = 16 1.07-1.08, m = 64 1.03).
    ParallelRegions(c, n_groups, [&](int64_t g) { run_group(g, 0, a.m); });
    return nullptr;
  }
  ParallelRangeGuided(c, n_groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t i0 = 0; i0 < a.m; i0 += kMBlock)
      for (int64_t g = g0; g < g1; ++g) run_group(g, i0, std::min(kMBlock, a.m - i0));
  });
  return nullptr;
}

// Float weights in panels (panel.h). Tasks take runs of panels; per panel, K-blocks of
// about kPanelKBlock elements (up to 32 KiB of F16) stay in L1 while every tile of 8
// activation rows runs over them; decode (m <= 8) takes the whole row length at once.
const char* MatmulPanel(const OpContext& c, const pc_matmul_args_t& a) {
  if (!c.k->gemm_panel || !PanelDtype(a.w_dtype)) return "panel layout for this dtype/ISA";
  const auto* x = Ptr<const float>(a.x);  // [m, x_stride]
  const auto* w = Ptr<const uint8_t>(a.w);
  const auto* bias = Ptr<const float>(a.bias);
  auto* out = Ptr<float>(a.out);  // [m, out_stride]
  constexpr int64_t kPanelKBlock = 512;
  const int64_t es = PanelElemBytes(a.w_dtype), panel_bytes = kPanelRows * a.k * es;
  // Equal K-blocks of at most kPanelKBlock (no short ragged last block).
  const int64_t n_kblocks = std::max<int64_t>(1, (a.k + kPanelKBlock - 1) / kPanelKBlock);
  const int64_t kblock = a.m <= kPanelTileRows ? a.k : (a.k + n_kblocks - 1) / n_kblocks;
  const int64_t n_panels = (a.n + kPanelRows - 1) / kPanelRows;
  ParallelRange(c, n_panels, ChunkSize(n_panels, c.pool->size(), 1), [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> acc;
    acc.resize(a.m * kPanelRows);  // [m, 32]
    const int64_t tiles = (a.m + kPanelTileRows - 1) / kPanelTileRows;
    for (int64_t p = p0; p < p1; ++p) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const uint8_t* panel = w + p * panel_bytes;
      for (int64_t e0 = 0; e0 < a.k; e0 += kblock) {
        const int64_t kb = std::min(kblock, a.k - e0);
        // The next K-block of weights (contiguous: this panel's, then the next panel's),
        // fetched a slice per tile so it streams in while the FMAs run; otherwise the first
        // tile of each block waits on DRAM (~20% of prefill).
        const char* next = reinterpret_cast<const char*>(panel + (e0 + kb) * kPanelRows * es);
        const int64_t next_bytes = kblock * kPanelRows * es;
        for (int64_t i0 = 0, t = 0; i0 < a.m; i0 += kPanelTileRows, ++t) {
          if (tiles > 1) {
            for (int64_t off = t * next_bytes / tiles; off < (t + 1) * next_bytes / tiles;
                 off += 64)
              __builtin_prefetch(next + off, 0, 3);
          }
          c.k->gemm_panel(a.w_dtype, panel + e0 * kPanelRows * es, kb, x + i0 * a.x_stride + e0,
                          a.x_stride, std::min(kPanelTileRows, a.m - i0),
                          acc.data() + i0 * kPanelRows);
        }
      }
      const int64_t j0 = p * kPanelRows, rows = std::min(kPanelRows, a.n - j0);
      for (int64_t i = 0; i < a.m; ++i)
        StoreRow(a, bias ? bias + j0 : nullptr, acc.data() + i * kPanelRows, rows,
                 out + i * a.out_stride + j0);
    }
  });
  return nullptr;
}

// Float weights (F16/BF16/F32) with several activation rows, on ISAs with gemm_t_f32: the
// activations are transposed once to xt [k, mp] (mp = m rounded up to 32, zero columns), then
// each task takes super-groups of kSuperRows weight rows and, per K-block, converts that slice
// to f32 once and runs it against every 32-column tile of xt, so each converted weight feeds
// m multiply-adds. A K-block of xt (kKBlock x mp floats) stays in L2 for the super-group.
const char* MatmulFloatT(const OpContext& c, const pc_matmul_args_t& a) {
  const auto* x = Ptr<const float>(a.x);  // [m, x_stride]
  const auto* w = Ptr<const uint8_t>(a.w);
  const auto* bias = Ptr<const float>(a.bias);
  auto* out = Ptr<float>(a.out);  // [m, out_stride]
  // Tuned on Zen 5 (1 MiB L2): 32 rows x 512 of f32 weights (64 KiB) and the K-block of xt
  // sit in L2; longer K-blocks convert longer contiguous runs of the (DRAM-bound) weights.
  constexpr int64_t kSuperRows = 32, kKBlock = 512;
  const int64_t mp = (a.m + kGemmTCols - 1) / kGemmTCols * kGemmTCols;
  const int64_t row_bytes = sdk::RowBytes(a.w_dtype, a.k);
  static std::vector<float> xt_buf;  // launches on one device are serialised by the plugin
  if (static_cast<int64_t>(xt_buf.size()) < a.k * mp) xt_buf.resize(a.k * mp);
  float* xt = xt_buf.data();  // [k, mp]
  ParallelRange(c, a.k, ChunkSize(a.k, c.pool->size(), 16), [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      float* dst = xt + e * mp;
      for (int64_t i = 0; i < a.m; ++i) dst[i] = x[i * a.x_stride + e];
      for (int64_t i = a.m; i < mp; ++i) dst[i] = 0.f;
    }
  });
  const int64_t n_super = (a.n + kSuperRows - 1) / kSuperRows;
  ParallelRange(c, n_super, ChunkSize(n_super, c.pool->size(), 1, 2),
                [&](int64_t s0, int64_t s1) {
    thread_local std::vector<float> wf, acc;
    wf.resize(kSuperRows * kKBlock);  // [rows, kb] this K-block of the super-group, as f32
    acc.resize(kSuperRows * mp);      // [rows, mp] running sums, transposed output
    for (int64_t s = s0; s < s1; ++s) {
      const int64_t j0 = s * kSuperRows, rows = std::min(kSuperRows, a.n - j0);
      std::fill(acc.begin(), acc.begin() + rows * mp, 0.f);
      for (int64_t e0 = 0; e0 < a.k; e0 += kKBlock) {
        const int64_t kb = std::min(kKBlock, a.k - e0);
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* src = w + (j0 + r) * row_bytes;
          float* dst = wf.data() + r * kb;
          switch (a.w_dtype) {
            case PC_DTYPE_F16:
              c.k->f16_to_f32(reinterpret_cast<const uint16_t*>(src) + e0, dst, kb);
              break;
            case PC_DTYPE_BF16:
              c.k->bf16_to_f32(reinterpret_cast<const uint16_t*>(src) + e0, dst, kb);
              break;
            default: std::memcpy(dst, reinterpret_cast<const float*>(src) + e0, kb * 4);
          }
        }
        for (int64_t i0 = 0; i0 < mp; i0 += kGemmTCols) {
          for (int64_t r = 0; r < rows; r += kGemmTRows) {
            c.k->gemm_t_f32(wf.data() + r * kb, kb, std::min(kGemmTRows, rows - r),
                            xt + e0 * mp + i0, mp, kb, acc.data() + r * mp + i0, mp);
          }
        }
      }
      for (int64_t i = 0; i < a.m; ++i)
        for (int64_t r = 0; r < rows; ++r) Store(a, bias, out, i, j0 + r, acc[r * mp + i]);
    }
  });
  return nullptr;
}

// GGUF layout: float weights are dotted directly when m == 1; otherwise 4 weight rows at a
// time are converted (or dequantized) to f32 once and dotted against every activation row.
const char* MatmulGguf(const OpContext& c, const pc_matmul_args_t& a) {
  const auto* x = Ptr<const float>(a.x);
  const auto* w = Ptr<const uint8_t>(a.w);
  const auto* bias = Ptr<const float>(a.bias);
  auto* out = Ptr<float>(a.out);
  const int64_t row_bytes = sdk::RowBytes(a.w_dtype, a.k);
  const bool direct = a.m == 1 && (a.w_dtype == PC_DTYPE_F32 || a.w_dtype == PC_DTYPE_F16 ||
                                   a.w_dtype == PC_DTYPE_BF16);
  if (direct) {
    ParallelRange(c, a.n, ChunkSize(a.n, c.pool->size(), 16), [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j)
        Store(a, bias, out, 0, j, DotFloatRow(*c.k, a.w_dtype, x, w + j * row_bytes, a.k));
    });
    return nullptr;
  }
  // The transposed GEMM splits the work by 32 weight rows and transposes x first: a thinner
  // matrix (a rank-16 LoRA A, which weight_upload leaves out of panels) is one task and a copy
  // of x for a few dot products, several times slower at prefill than the dot4x4 path below.
  if (c.k->gemm_t_f32 && a.m >= 4 && a.n >= kPanelRows &&
      (a.w_dtype == PC_DTYPE_F32 || a.w_dtype == PC_DTYPE_F16 || a.w_dtype == PC_DTYPE_BF16))
    return MatmulFloatT(c, a);
  const int64_t n4 = (a.n + 3) / 4;
  bool ok = true;
  ParallelRange(c, n4, ChunkSize(n4, c.pool->size(), 1), [&](int64_t q0, int64_t q1) {
    thread_local std::vector<float> buf;
    buf.resize(4 * a.k);  // [4, k]
    for (int64_t q = q0; q < q1; ++q) {
      const float* rows[4];
      const int64_t nr = std::min<int64_t>(4, a.n - 4 * q);
      if (!FourWeightRows(c, a.w_dtype, w, row_bytes, 4 * q, a.n, a.k, buf.data(), rows)) {
        ok = false;
      }
      DotFourRows(*c.k, x, a.x_stride, 0, a.m, rows, a.k, [&](int64_t i, const float* v) {
        for (int64_t r = 0; r < nr; ++r) Store(a, bias, out, i, 4 * q + r, v[r]);
      });
    }
  });
  return ok ? nullptr : "unsupported weight dtype";
}

// Bytes of one KV head's row of head_dim elements in a cache of dtype (a block type's row is
// head_dim / 32 blocks).
int64_t CacheRowBytes(pc_dtype_t t, int64_t head_dim) { return sdk::RowBytes(t, head_dim); }

// Positions per attention step (the width of one gemm_t_f32 column tile).
constexpr int64_t kAttnChunk = kGemmTCols;
constexpr int64_t kAttnLookahead = 3;  // chunks of K/V rows prefetched ahead

}  // namespace

bool FourWeightRows(const OpContext& c, pc_dtype_t dtype, const uint8_t* w, int64_t row_bytes,
                    int64_t j0, int64_t n, int64_t k, float* buf, const float* rows[4]) {
  bool ok = true;
  for (int r = 0; r < 4; ++r) {
    const uint8_t* src = w + std::min<int64_t>(j0 + r, n - 1) * row_bytes;
    float* dst = buf + r * k;
    rows[r] = dst;
    switch (dtype) {
      case PC_DTYPE_F32: rows[r] = reinterpret_cast<const float*>(src); break;
      case PC_DTYPE_F16: c.k->f16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, k); break;
      case PC_DTYPE_BF16: c.k->bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, k); break;
      default:
        if (!sdk::DequantizeRow(dtype, src, dst, k)) ok = false;
    }
  }
  return ok;
}

const char* Matmul(const OpContext& c, const pc_matmul_args_t& a) {
  if (a.m == 0) return nullptr;
  if (!a.x || !a.w || !a.out) return "null operand";
  if (a.w_layout == kLayoutPacked) return MatmulPacked(c, a);
  if (a.w_layout == kLayoutPanel) return MatmulPanel(c, a);
  if (a.w_layout != PC_LAYOUT_GGUF) return "unknown weight layout";
  return MatmulGguf(c, a);
}

namespace {

// acc[j * ldc + i] += sum_{e < n} w[j * ldw + e] * xt[e * ldx + i] for j < nw, i < cols: the
// kernel table's gemm_t_f32 for full 32-column tiles (where the ISA has it), plain loops for the
// rest (ragged head dims, ISAs without it).
void GemmT(const OpContext& c, const float* w, int64_t ldw, int64_t nw, const float* xt,
           int64_t ldx, int64_t n, int64_t cols, float* acc, int64_t ldc) {
  for (int64_t j0 = 0; j0 < nw; j0 += kGemmTRows) {
    const int64_t rows = std::min(kGemmTRows, nw - j0);
    for (int64_t i0 = 0; i0 < cols; i0 += kGemmTCols) {
      const int64_t width = std::min(kGemmTCols, cols - i0);
      float* a = acc + j0 * ldc + i0;
      if (c.k->gemm_t_f32 && width == kGemmTCols) {
        c.k->gemm_t_f32(w + j0 * ldw, ldw, rows, xt + i0, ldx, n, a, ldc);
        continue;
      }
      for (int64_t j = 0; j < rows; ++j)
        for (int64_t e = 0; e < n; ++e) {
          const float wv = w[(j0 + j) * ldw + e];
          const float* x = xt + e * ldx + i0;
          for (int64_t i = 0; i < width; ++i) a[j * ldc + i] += wv * x[i];
        }
    }
  }
}

// Byte offsets of cache positions [p0, p0 + n) of KV head kvh (n <= kAttnChunk) in a cache of
// rows of row_bytes (K's, or V's where its type differs); addresses advance slot by slot within
// a page, with no division per row.
void ChunkRowOffsets(const pc_attention_args_t& a, const int32_t* table, int64_t kvh, int64_t p0,
                     int64_t n, int64_t row_bytes, int64_t* offsets) {
  const int64_t slot_bytes = a.n_kv_heads * row_bytes;
  int64_t page = p0 / a.block_size, in_page = p0 % a.block_size;
  for (int64_t j = 0; j < n; ++j) {
    offsets[j] = (int64_t(table[page]) * a.block_size + in_page) * slot_bytes + kvh * row_bytes;
    if (++in_page == a.block_size) {
      in_page = 0;
      ++page;
    }
  }
}

// Asks for a chunk's rows of both caches at once: the rows are scattered over pages, and
// fetching them one miss after another made attention latency-bound in batched decode (~9% of a
// serving step with 16 sequences of 256 tokens).
// K's offsets serve V's too when the types agree; else V's are K's rescaled (an offset is a
// row index times the row's bytes).
void PrefetchChunk(const pc_attention_args_t& a, const int64_t* offsets, int64_t n) {
  const int64_t k_row = CacheRowBytes(a.cache_dtype, a.head_dim);
  const int64_t v_row = CacheRowBytes(sdk::AttentionVDtype(a), a.head_dim);
  const auto* kc = Ptr<const uint8_t>(a.k_cache);
  const auto* vc = Ptr<const uint8_t>(a.v_cache);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t off = 0; off < k_row; off += 64) __builtin_prefetch(kc + offsets[j] + off, 0, 3);
    const int64_t v_at = v_row == k_row ? offsets[j] : offsets[j] / k_row * v_row;
    for (int64_t off = 0; off < v_row; off += 64) __builtin_prefetch(vc + v_at + off, 0, 3);
  }
}

// V's offsets from K's (the same rows; their sizes differ when the types do).
void VRowOffsets(const int64_t* k_offsets, int64_t n, int64_t k_row, int64_t v_row,
                 int64_t* v_offsets) {
  for (int64_t j = 0; j < n; ++j) v_offsets[j] = k_offsets[j] / k_row * v_row;
}

// q . (row of the cache), the row in the cache's dtype. A block type's row is dequantized into
// a small buffer first (head_dim values, never more than one row).
float DotCacheRow(const OpContext& c, pc_dtype_t dtype, const float* q, const uint8_t* row,
                  int64_t n) {
  switch (dtype) {
    case PC_DTYPE_F32:
    case PC_DTYPE_BF16:
    case PC_DTYPE_F16: return DotFloatRow(*c.k, dtype, q, row, n);
    default: {
      thread_local std::vector<float> f;
      f.resize(n);
      const int64_t offset = 0;
      c.k->cache_rows_to_f32(dtype, row, &offset, 1, n, f.data());
      return c.k->dot_f32(q, f.data(), n);
    }
  }
}

// Up to this many query vectors per task (decode: one token's GQA group), scores are dot
// products straight from the cache rows: the GEMM would pad them to 32 columns.
constexpr int64_t kFewQueries = 4;

// Attention of a batch whose sequences each have one query token (decode), as flash-decoding
// splits the keys: a task is a range of one sequence's positions for every KV head at once, so
// it reads whole cache slots (all KV heads of a position lie together, 2 KB for 8 heads of 128)
// in order, where a task per KV head would read 256-byte pieces 2 KB apart. Each task leaves a
// partial softmax per query vector (running max, sum, weighted sum of V rows); the partials of
// a sequence are merged at the end. Arguments are validated by the caller.
void AttentionDecode(const OpContext& c, const pc_attention_args_t& a) {
  const auto* q = Ptr<const float>(a.q);
  auto* out = Ptr<float>(a.out);
  const auto* qstart = Ptr<const int32_t>(a.query_start);
  const auto* seq_lens = Ptr<const int32_t>(a.seq_lens);
  const auto* tables = Ptr<const int32_t>(a.block_tables);
  const auto* kc = Ptr<const uint8_t>(a.k_cache);
  const auto* vc = Ptr<const uint8_t>(a.v_cache);
  const int64_t hd = a.head_dim, nh = a.n_heads, n_kv = a.n_kv_heads, group = nh / n_kv;
  const pc_dtype_t kt = a.cache_dtype, vt = sdk::AttentionVDtype(a);
  const int64_t row_bytes = CacheRowBytes(kt, hd), slot_bytes = n_kv * row_bytes;  // K's
  const int64_t v_row_bytes = CacheRowBytes(vt, hd), v_slot_bytes = n_kv * v_row_bytes;
  struct Part {
    int32_t seq;
    int64_t p0, p1;  // positions
  };
  std::vector<Part> parts;
  int64_t active = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) active += qstart[s + 1] > qstart[s];
  if (active == 0) return;
  // Two parts per thread in all, none under a chunk of positions.
  const int64_t want = std::max<int64_t>(1, (2 * c.pool->size() + active - 1) / active);
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    if (qstart[s + 1] == qstart[s]) continue;
    const int64_t len = seq_lens[s], lo = sdk::AttentionFirstPosition(a, len - 1), n = len - lo;
    const int64_t n_parts = std::clamp<int64_t>((n + kAttnChunk - 1) / kAttnChunk, 1, want);
    const int64_t size = (n + n_parts - 1) / n_parts;
    for (int64_t p0 = lo; p0 < len; p0 += size)
      parts.push_back({int32_t(s), p0, std::min(len, p0 + size)});
  }
  std::vector<float> part_m(parts.size() * nh), part_s(parts.size() * nh),
      part_o(parts.size() * nh * hd);
  c.pool->Run(static_cast<int64_t>(parts.size()), [&](int64_t pi) {
    const Part& part = parts[pi];
    const int64_t t = qstart[part.seq];
    const int32_t* table = tables + part.seq * a.max_blocks_per_seq;
    float* m = part_m.data() + pi * nh;
    float* sum = part_s.data() + pi * nh;
    float* o = part_o.data() + pi * nh * hd;
    std::fill(m, m + nh, -INFINITY);
    std::fill(sum, sum + nh, 0.f);
    std::fill(o, o + nh * hd, 0.f);
    thread_local std::vector<float> qs, sc, vf, kf, k_t;
    thread_local std::vector<int64_t> row_offsets, v_offsets;
    qs.resize(nh * hd);
    for (int64_t i = 0; i < nh * hd; ++i) qs[i] = q[t * nh * hd + i] * a.scale;
    sc.resize(nh * kAttnChunk);  // [query vector, position in the chunk]
    vf.resize(kAttnChunk * n_kv * hd);
    k_t.resize(hd * kAttnChunk);  // one KV head's K rows of a chunk, [element][position]
    row_offsets.resize(kAttnChunk * n_kv);
    v_offsets.resize(kAttnChunk * n_kv);
    // Byte offsets of the chunk's slots (KV head 0's rows), this chunk's and the next one's,
    // which is prefetched whole while this one is computed.
    int64_t slots[2][kAttnChunk];
    auto chunk_slots = [&](int64_t p, int64_t* out) {
      const int64_t n = std::min(kAttnChunk, part.p1 - p);
      if (n > 0) ChunkRowOffsets(a, table, /*kvh=*/0, p, n, row_bytes, out);
      return n;
    };
    chunk_slots(part.p0, slots[0]);
    for (int64_t p0 = part.p0, chunk = 0; p0 < part.p1; p0 += kAttnChunk, ++chunk) {
      const int64_t pc = std::min(kAttnChunk, part.p1 - p0);
      const int64_t* here = slots[chunk & 1];
      int64_t* next = slots[(chunk + 1) & 1];
      const int64_t next_n = chunk_slots(p0 + kAttnChunk, next);
      for (int64_t j = 0; j < next_n; ++j) {
        for (int64_t off = 0; off < slot_bytes; off += 64)
          __builtin_prefetch(kc + next[j] + off, 0, 3);
        const int64_t v_at = next[j] / slot_bytes * v_slot_bytes;
        for (int64_t off = 0; off < v_slot_bytes; off += 64)
          __builtin_prefetch(vc + v_at + off, 0, 3);
      }
      for (int64_t j = 0; j < pc; ++j)
        for (int64_t kvh = 0; kvh < n_kv; ++kvh) {
          row_offsets[j * n_kv + kvh] = here[j] + kvh * row_bytes;
          v_offsets[j * n_kv + kvh] = here[j] / slot_bytes * v_slot_bytes + kvh * v_row_bytes;
        }
      if (group > kFewQueries) {
        // A GQA group of several query vectors: the chunk's K rows once as f32, transposed to
        // [element][position], so each group's scores are one GEMM over 32 positions (broadcast
        // FMAs, no per-dot reductions). One call per (position, query vector) took ~6x the
        // time of reading the cache (qwen2.5-0.5b, 7 query vectors per KV head, 1K positions).
        for (int64_t kvh = 0; kvh < n_kv; ++kvh) {
          int64_t k_rows[kAttnChunk];  // this KV head's rows of the chunk
          for (int64_t j = 0; j < pc; ++j) k_rows[j] = here[j] + kvh * row_bytes;
          c.k->cache_rows_to_f32_t(kt, kc, k_rows, pc, hd, k_t.data(), kAttnChunk);
          float* scores = sc.data() + kvh * group * kAttnChunk;
          std::fill(scores, scores + group * kAttnChunk, 0.f);
          // All kAttnChunk columns, also of a short chunk (every chunk of a context under 32
          // positions): the full-width kernel, where pc columns fell back to plain loops (~8 us
          // per layer of qwen2.5-0.5b at a few positions). Columns from pc on hold zeros or an
          // earlier chunk's K values; their scores are computed and never read.
          GemmT(c, qs.data() + kvh * group * hd, hd, group, k_t.data(), kAttnChunk, hd,
                kAttnChunk, scores, kAttnChunk);
        }
      } else if (kt != PC_DTYPE_F32 && kt != PC_DTYPE_F16 && kt != PC_DTYPE_BF16) {
        // A block-quantized K (q8_0, q4_0, fp8_e4m3): the chunk's rows decoded to f32 in one
        // call, then plain dots. DotCacheRow decoded a row once per query vector of the group,
        // one call per row, which made a q8_0 cache's decode slower than f16's.
        kf.resize(kAttnChunk * n_kv * hd);
        c.k->cache_rows_to_f32(kt, kc, row_offsets.data(), pc * n_kv, hd, kf.data());
        for (int64_t j = 0; j < pc; ++j) {
          for (int64_t kvh = 0; kvh < n_kv; ++kvh) {
            const float* row = kf.data() + (j * n_kv + kvh) * hd;
            for (int64_t g = 0; g < group; ++g) {
              const int64_t v = kvh * group + g;
              sc[v * kAttnChunk + j] = c.k->dot_f32(qs.data() + v * hd, row, hd);
            }
          }
        }
      } else {
        for (int64_t j = 0; j < pc; ++j) {
          for (int64_t kvh = 0; kvh < n_kv; ++kvh) {
            const int64_t row = row_offsets[j * n_kv + kvh];
            for (int64_t g = 0; g < group; ++g) {
              const int64_t v = kvh * group + g;
              sc[v * kAttnChunk + j] =
                  DotCacheRow(c, kt, qs.data() + v * hd, kc + row, hd);
            }
          }
        }
      }
      for (int64_t v = 0; v < nh; ++v) {
        float* p = sc.data() + v * kAttnChunk;
        const float mx = std::max(m[v], *std::max_element(p, p + pc));
        const float rescale = std::exp(m[v] - mx);  // 0 on the first chunk (m = -inf)
        sum[v] = sum[v] * rescale + c.k->exp_sum(p, mx, p, pc);
        if (rescale != 1.f) c.k->scale_f32(rescale, o + v * hd, hd);
        m[v] = mx;
      }
      c.k->cache_rows_to_f32(vt, vc, v_offsets.data(), pc * n_kv, hd, vf.data());
      for (int64_t kvh = 0; kvh < n_kv; ++kvh) {
        GemmT(c, sc.data() + kvh * group * kAttnChunk, kAttnChunk, group, vf.data() + kvh * hd,
              n_kv * hd, pc, hd, o + kvh * group * hd, hd);
      }
    }
  });
  // Merge each sequence's parts (consecutive in `parts`).
  for (size_t first = 0; first < parts.size();) {
    size_t end = first;
    while (end < parts.size() && parts[end].seq == parts[first].seq) ++end;
    const int64_t t = qstart[parts[first].seq];
    for (int64_t v = 0; v < nh; ++v) {
      float mx = -INFINITY;
      for (size_t i = first; i < end; ++i) mx = std::max(mx, part_m[i * nh + v]);
      float total = 0.f;
      float* dst = out + (t * nh + v) * hd;
      std::fill(dst, dst + hd, 0.f);
      for (size_t i = first; i < end; ++i) {
        const float w = std::exp(part_m[i * nh + v] - mx);
        total += w * part_s[i * nh + v];
        c.k->axpy_f32(w, part_o.data() + (i * nh + v) * hd, dst, hd);
      }
      c.k->scale_f32(1.f / total, dst, hd);
    }
    first = end;
  }
}

}  // namespace

// Flash-style paged attention. A task is (sequence, KV head, a few consecutive query tokens):
// every query head of the GQA group and every token of the task reads the same K/V rows, so
// those are converted to f32 once per task instead of once per head and token. Positions are
// taken kAttnChunk at a time: scores = K_chunk x Q^T and out += P x V_chunk are small GEMMs
// (gemm_t_f32), and an online softmax (running max and sum per query vector) rescales what was
// accumulated when a later chunk raises the max.
const char* Attention(const OpContext& c, const pc_attention_args_t& a) {
  const auto* q = Ptr<const float>(a.q);  // [n_tokens, n_heads, head_dim]
  auto* out = Ptr<float>(a.out);          // [n_tokens, n_heads, head_dim]
  const auto* qstart = Ptr<const int32_t>(a.query_start);  // [n_seqs + 1]
  const auto* seq_lens = Ptr<const int32_t>(a.seq_lens);   // [n_seqs]
  const auto* tables = Ptr<const int32_t>(a.block_tables); // [n_seqs, max_blocks_per_seq]
  const auto* kc = Ptr<const uint8_t>(a.k_cache);  // [n_blocks, block_size, n_kv_heads, hd]
  const auto* vc = Ptr<const uint8_t>(a.v_cache);
  if (a.n_tokens == 0) return nullptr;
  if (!q || !out || !qstart || !seq_lens || !tables || !kc || !vc) return "null operand";
  if (a.n_heads % a.n_kv_heads != 0) return "n_heads is not a multiple of n_kv_heads";
  const int64_t hd = a.head_dim, group = a.n_heads / a.n_kv_heads;
  // Query tokens per task: enough for about one 32-wide column tile of query vectors; four
  // tiles for long prefill chunks, where every task re-reads the K/V rows before its last token
  // (still 8+ tasks per KV head).
  const int64_t base_rows = std::max<int64_t>(1, kGemmTCols / group);
  struct Task {
    int32_t seq, kv_head;
    int64_t t0, t1;  // query rows
  };
  std::vector<uint8_t> owned(a.n_tokens, 0);
  bool decode = true;  // every sequence has at most one query token
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t q0 = qstart[s], q1 = qstart[s + 1], len = seq_lens[s];
    if (q0 < 0 || q1 > a.n_tokens || q1 < q0 || q1 - q0 > len) return "bad query_start/seq_lens";
    if ((len + a.block_size - 1) / a.block_size > a.max_blocks_per_seq)
      return "seq_len exceeds the block table";
    for (int64_t b = 0; b < (len + a.block_size - 1) / a.block_size; ++b)
      if (tables[s * a.max_blocks_per_seq + b] < 0) return "negative block index";
    for (int64_t t = q0; t < q1; ++t) owned[t] = 1;
    decode = decode && q1 - q0 <= 1;
  }
  for (int64_t t = 0; t < a.n_tokens; ++t)  // rows no sequence owns: defined as zeros
    if (!owned[t]) std::memset(out + t * a.n_heads * hd, 0, a.n_heads * hd * sizeof(float));
  if (decode) {
    AttentionDecode(c, a);
    return nullptr;
  }
  std::vector<Task> tasks;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t q0 = qstart[s], q1 = qstart[s + 1];
    const int64_t rows_per_task = q1 - q0 >= 32 * base_rows ? 4 * base_rows : base_rows;
    for (int64_t kvh = 0; kvh < a.n_kv_heads; ++kvh)
      for (int64_t t0 = q0; t0 < q1; t0 += rows_per_task)
        tasks.push_back({int32_t(s), int32_t(kvh), t0, std::min(q1, t0 + rows_per_task)});
  }

  c.pool->Run(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
    const Task& task = tasks[ti];
    const int64_t s = task.seq, kvh = task.kv_head;
    const int64_t n_q = qstart[s + 1] - qstart[s];
    const int64_t first_pos = seq_lens[s] - n_q + (task.t0 - qstart[s]);
    const int64_t rows = task.t1 - task.t0, nv = rows * group;  // query vectors v = r * group + g
    const int64_t last_pos = first_pos + rows - 1;
    const bool few = nv <= kFewQueries;
    const int64_t ncols = few ? nv : (nv + kGemmTCols - 1) / kGemmTCols * kGemmTCols;
    const int32_t* table = tables + s * a.max_blocks_per_seq;
    thread_local std::vector<float> qt, kf, vf, st, pm, o, mx, sum;
    // [hd, ncols] scaled queries, transposed ([ncols, hd] when few: one per dot product)
    qt.assign(hd * ncols, 0.f);
    kf.resize(kAttnChunk * hd);  // [chunk, hd]
    vf.resize(kAttnChunk * hd);
    st.resize(kAttnChunk * ncols);  // [chunk, ncols] scores, transposed
    pm.resize(nv * kAttnChunk);     // [nv, chunk] probabilities
    o.assign(nv * hd, 0.f);
    mx.assign(nv, -INFINITY);
    sum.assign(nv, 0.f);
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t t = task.t0 + v / group, h = kvh * group + v % group;
      const float* qv = q + (t * a.n_heads + h) * hd;
      for (int64_t e = 0; e < hd; ++e) (few ? qt[v * hd + e] : qt[e * ncols + v]) = qv[e] * a.scale;
    }
    // Row offsets of this chunk and of the next, whose rows are prefetched (they arrive while
    // this chunk is computed). A sliding window starts at the first position the task's first
    // query sees.
    const int64_t lo_pos = sdk::AttentionFirstPosition(a, first_pos);
    int64_t offsets[2][kAttnChunk];
    const pc_dtype_t kt = a.cache_dtype, vt = sdk::AttentionVDtype(a);
    const int64_t k_row = CacheRowBytes(kt, hd), v_row = CacheRowBytes(vt, hd);
    ChunkRowOffsets(a, table, kvh, lo_pos, std::min(kAttnChunk, last_pos + 1 - lo_pos), k_row,
                    offsets[0]);
    // The rows of the first kAttnLookahead chunks are asked for at once, then each chunk asks
    // for the one kAttnLookahead ahead: a head's rows are 256 B pieces 2 KB apart (every KV
    // head of a slot lies together), which the hardware prefetcher does not follow.
    int64_t ahead[kAttnChunk];
    auto prefetch = [&](int64_t p) {
      const int64_t n = std::min(kAttnChunk, last_pos + 1 - p);
      if (n <= 0) return;
      ChunkRowOffsets(a, table, kvh, p, n, k_row, ahead);
      PrefetchChunk(a, ahead, n);
    };
    for (int64_t k = 0; k < kAttnLookahead; ++k) prefetch(lo_pos + k * kAttnChunk);
    for (int64_t p0 = lo_pos, chunk = 0; p0 <= last_pos; p0 += kAttnChunk, ++chunk) {
      const int64_t pc = std::min(kAttnChunk, last_pos + 1 - p0);
      const int64_t* rows = offsets[chunk & 1];
      const int64_t next_pc = std::min(kAttnChunk, last_pos + 1 - (p0 + kAttnChunk));
      if (next_pc > 0) {
        ChunkRowOffsets(a, table, kvh, p0 + kAttnChunk, next_pc, k_row, offsets[(chunk + 1) & 1]);
      }
      prefetch(p0 + kAttnLookahead * kAttnChunk);
      if (few) {
        for (int64_t j = 0; j < pc; ++j)
          for (int64_t v = 0; v < nv; ++v)
            st[j * ncols + v] = DotCacheRow(c, kt, qt.data() + v * hd, kc + rows[j], hd);
      } else {
        c.k->cache_rows_to_f32(kt, kc, rows, pc, hd, kf.data());
        std::fill(st.begin(), st.begin() + pc * ncols, 0.f);
        GemmT(c, kf.data(), hd, pc, qt.data(), ncols, hd, ncols, st.data(), ncols);
      }
      for (int64_t v = 0; v < nv; ++v) {
        float* p = pm.data() + v * kAttnChunk;
        // Causal: query row r sees positions <= first_pos + r (and, in a window, those after
        // its first visible position: the chunk's entries [skip, valid)).
        const int64_t pos = first_pos + v / group;
        const int64_t valid = std::clamp<int64_t>(pos - p0 + 1, 0, pc);
        const int64_t skip = std::clamp<int64_t>(sdk::AttentionFirstPosition(a, pos) - p0, 0,
                                                 valid);
        float m = mx[v];
        for (int64_t j = skip; j < valid; ++j) {
          p[j] = st[j * ncols + v];
          m = std::max(m, p[j]);
        }
        std::fill(p, p + skip, 0.f);
        std::fill(p + valid, p + kAttnChunk, 0.f);
        if (valid == skip) continue;
        const float rescale = std::exp(mx[v] - m);  // 0 on the first chunk (mx = -inf)
        sum[v] = sum[v] * rescale + c.k->exp_sum(p + skip, m, p + skip, valid - skip);
        if (rescale != 1.f) c.k->scale_f32(rescale, o.data() + v * hd, hd);
        mx[v] = m;
      }
      const int64_t* v_rows = rows;
      int64_t v_at[kAttnChunk];
      if (v_row != k_row) {
        VRowOffsets(rows, pc, k_row, v_row, v_at);
        v_rows = v_at;
      }
      c.k->cache_rows_to_f32(vt, vc, v_rows, pc, hd, vf.data());
      GemmT(c, pm.data(), kAttnChunk, nv, vf.data(), hd, pc, hd, o.data(), hd);
    }
    for (int64_t v = 0; v < nv; ++v) {
      const int64_t t = task.t0 + v / group, h = kvh * group + v % group;
      float* dst = out + (t * a.n_heads + h) * hd;
      const float inv = 1.f / sum[v];
      for (int64_t e = 0; e < hd; ++e) dst[e] = o[v * hd + e] * inv;
    }
  });
  return nullptr;
}

// The reference stores element by element through a software conversion (~10 us per decoded
// token of a 0.6B model, 2% of its step); here a row at a time with the ISA's conversion, in
// the same rounding (nearest even).
const char* KvStore(const OpContext& c, const pc_kv_store_args_t& a) {
  const auto* k = Ptr<const float>(a.k);  // [n_tokens, n_kv_heads * head_dim]
  const auto* v = Ptr<const float>(a.v);
  const auto* slots = Ptr<const int32_t>(a.slots);
  auto* kc = Ptr<uint8_t>(a.k_cache);
  auto* vc = Ptr<uint8_t>(a.v_cache);
  if (a.n_tokens == 0) return nullptr;
  if (!k || !v || !slots || !kc || !vc) return "null operand";
  const int64_t row = a.n_kv_heads * a.head_dim;  // elements per token
  const pc_dtype_t kt = a.cache_dtype, vt = sdk::KvStoreVDtype(a);
  const int64_t k_slot = a.n_kv_heads * CacheRowBytes(kt, a.head_dim);  // bytes per token
  const int64_t v_slot = a.n_kv_heads * CacheRowBytes(vt, a.head_dim);
  auto store = [&](pc_dtype_t dtype, const float* src, uint8_t* dst) {
    switch (dtype) {
      case PC_DTYPE_F32: std::memcpy(dst, src, row * 4); break;
      case PC_DTYPE_BF16:
        for (int64_t i = 0; i < row; ++i)
          reinterpret_cast<uint16_t*>(dst)[i] = sdk::Fp32ToBf16(src[i]);
        break;
      case PC_DTYPE_F16: c.k->f32_to_f16(src, reinterpret_cast<uint16_t*>(dst), row); break;
      default: {  // a block type: each head's row its own blocks
        const int64_t head_bytes = CacheRowBytes(dtype, a.head_dim);
        for (int64_t h = 0; h < a.n_kv_heads; ++h)
          sdk::QuantizeRow(dtype, src + h * a.head_dim, dst + h * head_bytes, a.head_dim);
      }
    }
  };
  ParallelRange(c, a.n_tokens, ChunkSize(a.n_tokens, c.pool->size(), 16),
                [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      if (slots[t] < 0) continue;
      store(kt, k + t * row, kc + int64_t(slots[t]) * k_slot);
      store(vt, v + t * row, vc + int64_t(slots[t]) * v_slot);
    }
  });
  return nullptr;
}

const char* Rope(const OpContext& c, const pc_rope_args_t& a) {
  auto* x = Ptr<float>(a.x);                       // [n_tokens, n_heads, head_dim]
  const auto* pos = Ptr<const int32_t>(a.positions);  // [n_tokens]
  const auto* ff = Ptr<const float>(a.freq_factors);  // [n_rot / 2] or null
  if (a.n_tokens == 0) return nullptr;
  if (!x || !pos) return "null operand";
  const int64_t half = a.n_rot / 2;
  ParallelRange(c, a.n_tokens, ChunkSize(a.n_tokens, c.pool->size(), 4),
                [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> cs;
    cs.resize(2 * half);  // the angles of one position, shared by all heads
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < half; ++i)
        sdk::RopeCosSin(a, pos[t], i, ff ? ff[i] : 1.f, &cs[2 * i], &cs[2 * i + 1]);
      for (int64_t h = 0; h < a.n_heads; ++h) {
        float* v = x + (t * a.n_heads + h) * a.head_dim;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i0 = a.mode == PC_ROPE_NEOX ? i : 2 * i;
          const int64_t i1 = a.mode == PC_ROPE_NEOX ? i + half : 2 * i + 1;
          const float x0 = v[i0], x1 = v[i1], co = cs[2 * i], si = cs[2 * i + 1];
          v[i0] = x0 * co - x1 * si;
          v[i1] = x0 * si + x1 * co;
        }
      }
    }
  });
  return nullptr;
}

const char* RmsNorm(const OpContext& c, const pc_rms_norm_args_t& a) {
  const auto* x = Ptr<const float>(a.x);  // [n_rows, dim]
  const auto* w = Ptr<const float>(a.weight);
  auto* out = Ptr<float>(a.out);
  if (a.n_rows == 0) return nullptr;
  if (!x || !out) return "null operand";
  ParallelRange(c, a.n_rows, ChunkSize(a.n_rows, c.pool->size(), 8), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) c.k->rms_norm(x + r * a.dim, w, out + r * a.dim, a.dim, a.eps);
  });
  return nullptr;
}

// SWIGLU and GEGLU: the same args layout, elementwise over chunks of n.
template <typename Args, typename Kernel>
const char* GatedActivation(const OpContext& c, const Args& a, Kernel kernel) {
  const auto* g = Ptr<const float>(a.gate);
  const auto* u = Ptr<const float>(a.up);
  auto* out = Ptr<float>(a.out);
  if (a.n == 0) return nullptr;
  if (!g || !u || !out) return "null operand";
  ParallelRange(c, a.n, ChunkSize(a.n, c.pool->size(), 16384), [&](int64_t i0, int64_t i1) {
    (c.k->*kernel)(g + i0, u + i0, out + i0, i1 - i0);
  });
  return nullptr;
}

const char* Geglu(const OpContext& c, const pc_geglu_args_t& a) {
  return GatedActivation(c, a, &KernelTable::geglu);
}

const char* Swiglu(const OpContext& c, const pc_swiglu_args_t& a) {
  return GatedActivation(c, a, &KernelTable::swiglu);
}

void PackPanelsParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n,
                        int64_t k, void* dst) {
  const int64_t n_panels = (n + kPanelRows - 1) / kPanelRows;
  ParallelRange(c, n_panels, ChunkSize(n_panels, c.pool->size(), 1, 16),
                [&](int64_t p0, int64_t p1) {
    PackPanels(dtype, static_cast<const uint8_t*>(src), n, k, p0, p1, static_cast<uint8_t*>(dst));
  });
}

void PackParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n, int64_t k,
                  void* dst) {
  const int64_t n_groups = (n + kPackRows - 1) / kPackRows;
  ParallelRange(c, n_groups, ChunkSize(n_groups, c.pool->size(), 1, 16),
                [&](int64_t g0, int64_t g1) {
    PackGroups(dtype, static_cast<const uint8_t*>(src), n, k, g0, g1, static_cast<uint8_t*>(dst));
  });
}

}  // namespace polychip::cpu
