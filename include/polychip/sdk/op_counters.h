// polychip SDK — per-op counters (ABI 1.3, pc_backend_iface_t.op_counters_read) for plugins.
//
// OpWorkOf(op, args) says what one launch moves and computes: the bytes it reads and writes
// (the extents of pc_ops.def, a weight at its GGUF size, the rows an EMBEDDING gathers, the
// paged KV cache from the sequence lengths) and its arithmetic operations. OpCounterTable accumulates launches, time and work
// per op with relaxed atomics (a few nanoseconds per launch, so it stays on in production) and
// answers op_counters_read.
//
//   static polychip::sdk::OpCounterTable counters;           // one per device
//   auto t0 = polychip::sdk::OpCounterTable::Now();
//   ... run the op ...
//   counters.Record(op, OpCounterTable::Now() - t0, OpWorkOf(op, args, &memory));
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/op_list.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"

namespace polychip::sdk {

struct OpWork {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t flops = 0;
};

namespace op_counters_internal {

inline uint64_t Pos(int64_t v) { return v > 0 ? static_cast<uint64_t>(v) : 0; }

// The i-th dtype of the op's DTYPES: the i-th Weight member's (pc_ops.def).
template <typename T>
pc_dtype_t WeightDtype(const typename T::Args& a, int i) {
  pc_dtype_t dtype = PC_DTYPE_F32;
  int at = 0;
  T::Dtypes([&](auto member, const char*, DtypeKind) {
    if (at++ == i) dtype = a.*member;
  });
  return dtype;
}

// Sum over the sequences of an ATTENTION launch of the keys each query token attends to (causal:
// the i-th of q new tokens of a sequence of length s sees s - q + i + 1 keys), and of the keys
// read. The per-sequence arrays are read through `mem` where the plugin can (host-visible
// memory); without it every sequence is taken at max_seq_len (an upper bound).
inline void AttentionPairs(const pc_attention_args_t& a, const DeviceMemory* mem, uint64_t* pairs,
                           uint64_t* keys) {
  *pairs = 0;
  *keys = 0;
  const uint64_t n = Pos(a.n_seqs);
  const auto* seq_lens =
      mem != nullptr && n > 0
          ? static_cast<const int32_t*>(mem->to_host(mem->ctx, a.seq_lens, n * 4))
          : nullptr;
  const auto* starts =
      mem != nullptr && n > 0
          ? static_cast<const int32_t*>(mem->to_host(mem->ctx, a.query_start, (n + 1) * 4))
          : nullptr;
  if (seq_lens == nullptr || starts == nullptr) {
    *keys = n * Pos(a.max_seq_len);
    *pairs = Pos(a.n_tokens) * Pos(a.max_seq_len);
    return;
  }
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const uint64_t len = Pos(seq_lens[s]);
    const uint64_t q = std::min<uint64_t>(Pos(starts[s + 1] - starts[s]), len);
    *keys += len;
    *pairs += q * (len - q) + q * (q + 1) / 2;
  }
}

}  // namespace op_counters_internal

// What one launch of `op` with validated `args` reads, writes and computes. `mem` reaches the
// device's memory from the host (IdentityMemory() for host memory), so that the sequence
// lengths of ATTENTION are read; nullptr where the host cannot read it. FLOPs are the op's
// arithmetic as this function counts it (matmul 2·m·n·k, attention 4·heads·head_dim per query-key
// pair, a few per element for the elementwise ops); ops without arithmetic (gathers, stores,
// copies) count 0.
inline OpWork OpWorkOf(pc_op_t op, const void* args, const DeviceMemory* mem) {
  using op_counters_internal::Pos;
  return VisitOp(op, OpWork{}, [&](auto t) {
    using T = decltype(t);
    const auto& a = *static_cast<const typename T::Args*>(args);
    OpWork w;
    int weights = 0;  // Weight members seen
    T::Members(MemberVisitor{
        [](auto&&...) {},
        [&](auto, const char*, Access access, auto extent_fn, uint32_t, size_t) {
          const Extent e = extent_fn(a);
          switch (access) {
            case Access::kIn:
              w.bytes_read += Pos(e.bytes);
              break;
            case Access::kOut:
              w.bytes_written += Pos(e.bytes);
              break;
            case Access::kInOut:
              w.bytes_read += Pos(e.bytes);
              w.bytes_written += Pos(e.bytes);
              break;
            case Access::kWeight: {
              // A gather reads the rows it gathers, not the whole table.
              int64_t rows = e.rows;
              if constexpr (T::kOp == PC_OP_EMBEDDING) rows = std::min(rows, a.n_ids);
              w.bytes_read +=
                  Pos(rows) *
                  Pos(RowBytes(op_counters_internal::WeightDtype<T>(a, weights++), e.cols));
              break;
            }
            case Access::kPaged:
              break;  // per op, below
          }
        }});
    if constexpr (T::kOp == PC_OP_MATMUL) {
      w.flops = 2 * Pos(a.m) * Pos(a.n) * Pos(a.k);
    } else if constexpr (T::kOp == PC_OP_LORA) {
      w.flops = 2 * Pos(a.n_rows) * Pos(a.rank) * (Pos(a.k) + Pos(a.n));
    } else if constexpr (T::kOp == PC_OP_ATTENTION) {
      uint64_t pairs = 0, keys = 0;
      op_counters_internal::AttentionPairs(a, mem, &pairs, &keys);
      // K and V rows of every key read, once per KV head.
      const pc_dtype_t vt =
          a.struct_size >= offsetof(pc_attention_args_t, v_cache_dtype) + sizeof(pc_dtype_t)
              ? a.v_cache_dtype : a.cache_dtype;
      w.bytes_read += keys * Pos(a.n_kv_heads) *
                      (Pos(RowBytes(a.cache_dtype, a.head_dim)) + Pos(RowBytes(vt, a.head_dim)));
      w.flops = 4 * pairs * Pos(a.n_heads) * Pos(a.head_dim);
    } else if constexpr (T::kOp == PC_OP_KV_STORE) {
      const pc_dtype_t vt =
          a.struct_size >= offsetof(pc_kv_store_args_t, v_cache_dtype) + sizeof(pc_dtype_t)
              ? a.v_cache_dtype : a.cache_dtype;
      w.bytes_written += Pos(a.n_tokens) * Pos(a.n_kv_heads) *
                         (Pos(RowBytes(a.cache_dtype, a.head_dim)) + Pos(RowBytes(vt, a.head_dim)));
    } else if constexpr (T::kOp == PC_OP_RMS_NORM) {
      w.flops = 4 * Pos(a.n_rows) * Pos(a.dim);
    } else if constexpr (T::kOp == PC_OP_ROPE) {
      w.flops = 6 * Pos(a.n_tokens) * Pos(a.n_heads) * Pos(a.n_rot / 2);
    } else if constexpr (T::kOp == PC_OP_SWIGLU) {
      w.flops = 5 * Pos(a.n);
    } else if constexpr (T::kOp == PC_OP_ADD) {
      w.flops = Pos(a.n);
    }
    return w;
  });
}

// Counters of one device, indexed by op id. Thread-safe; Record and Read never block.
class OpCounterTable {
 public:
  static constexpr int kMaxOps = 64;  // op ids are small and dense (pc_ops.def)

  static uint64_t Now() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }

  OpCounterTable() = default;  // measures time, bytes and FLOPs
  // `flags`: the PC_OP_COUNTERS_* this plugin measures (reported in every record).
  explicit OpCounterTable(uint32_t flags) : flags_(flags) {}

  void Record(pc_op_t op, uint64_t device_ns, const OpWork& work) {
    if (op <= 0 || op >= kMaxOps) return;
    Slot& s = slots_[op];
    s.launches.fetch_add(1, std::memory_order_relaxed);
    s.device_ns.fetch_add(device_ns, std::memory_order_relaxed);
    s.bytes_read.fetch_add(work.bytes_read, std::memory_order_relaxed);
    s.bytes_written.fetch_add(work.bytes_written, std::memory_order_relaxed);
    s.flops.fetch_add(work.flops, std::memory_order_relaxed);
  }

  // Device time of a launch already counted by Record: for devices whose timestamps are read
  // back after the work has run (the Vulkan plugin resolves them when a batch retires).
  void AddDeviceTime(pc_op_t op, uint64_t device_ns) {
    if (op <= 0 || op >= kMaxOps) return;
    slots_[op].device_ns.fetch_add(device_ns, std::memory_order_relaxed);
  }
  // Which of time, bytes and FLOPs are measured; set before the first Read.
  void set_flags(uint32_t flags) { flags_ = flags; }

  // op_counters_read: the records of the ops run at least once (see pc_backend.h).
  int32_t Read(pc_op_counters_t* out, int32_t capacity) const {
    const size_t stride = out != nullptr && capacity > 0 ? out[0].struct_size : 0;
    const size_t write = std::min(stride, sizeof(pc_op_counters_t));
    int32_t n = 0;
    for (int op = 1; op < kMaxOps; ++op) {
      const Slot& s = slots_[op];
      const uint64_t launches = s.launches.load(std::memory_order_relaxed);
      if (launches == 0) continue;
      if (n < capacity && write >= offsetof(pc_op_counters_t, flags) + sizeof(uint32_t)) {
        pc_op_counters_t r{};
        r.struct_size = write;
        r.op = op;
        r.flags = flags_;
        r.launches = launches;
        r.device_ns =
            flags_ & PC_OP_COUNTERS_TIME ? s.device_ns.load(std::memory_order_relaxed) : 0;
        const bool bytes = flags_ & PC_OP_COUNTERS_BYTES;
        r.bytes_read = bytes ? s.bytes_read.load(std::memory_order_relaxed) : 0;
        r.bytes_written = bytes ? s.bytes_written.load(std::memory_order_relaxed) : 0;
        r.flops = flags_ & PC_OP_COUNTERS_FLOPS ? s.flops.load(std::memory_order_relaxed) : 0;
        std::memcpy(reinterpret_cast<char*>(out) + static_cast<size_t>(n) * stride, &r, write);
      }
      ++n;
    }
    return n;
  }

 private:
  struct Slot {
    std::atomic<uint64_t> launches{0}, device_ns{0}, bytes_read{0}, bytes_written{0}, flops{0};
  };
  uint32_t flags_ = PC_OP_COUNTERS_TIME | PC_OP_COUNTERS_BYTES | PC_OP_COUNTERS_FLOPS;
  Slot slots_[kMaxOps];
};

}  // namespace polychip::sdk
