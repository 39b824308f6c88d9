// Which launches may run beside a LORA launch the plugin has handed to a worker.
//
// A decode step with a LoRA adapter launches small LORAs (168 a token on qwen2.5-0.5b, 33-184
// KB each), each on one thread (two cost more, lora.cc), which leaves the other core idle. The
// plugin instead runs such a launch on a worker (ThreadPool::Post) and returns: the caller goes
// on to the launches after it that do not touch what it reads or writes (the next adapter
// term, run on the caller beside it, or a MATMUL, whose tasks the worker joins when it is
// done), and waits for it before any other launch or call. Launches on a stream still take
// effect in order: only independent ones overlap, and what the host can observe (copies,
// events, synchronize) waits.
#pragma once

#include <cstdint>

#include "polychip/plugin/pc_ops.h"

namespace polychip::cpu {

struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool Overlaps(const ByteRange& o) const {
    return begin < end && o.begin < o.end && begin < o.end && o.begin < end;
  }
};

// The activation buffers a launch reads and writes. Weights are left out: no launch writes one
// (weight_upload and mem_free wait for the worker).
struct LaunchAccess {
  static constexpr int kMaxReads = 2;
  ByteRange reads[kMaxReads];
  int n_reads = 0;
  ByteRange write;

  // Whether a later launch with access `later` must wait for this one: it writes what this one
  // reads or writes, or reads what this one writes.
  bool OrderedBefore(const LaunchAccess& later) const {
    if (later.write.Overlaps(write)) return true;
    for (int i = 0; i < n_reads; ++i) {
      if (later.write.Overlaps(reads[i])) return true;
    }
    for (int i = 0; i < later.n_reads; ++i) {
      if (write.Overlaps(later.reads[i])) return true;
    }
    return false;
  }
};

// The access of a MATMUL or LORA launch (args validated); false for any other op, which may
// touch anything and so waits for a launch on the worker.
inline bool AccessOf(pc_op_t op, const void* args, LaunchAccess* out) {
  *out = LaunchAccess{};
  const auto range = [](pc_devptr_t p, int64_t elems) {  // of 4-byte elements (f32, int32)
    return ByteRange{p, p + static_cast<uintptr_t>(elems > 0 ? elems : 0) * 4};
  };
  if (op == PC_OP_MATMUL) {
    const auto& a = *static_cast<const pc_matmul_args_t*>(args);
    const int64_t x_stride = a.x_stride > a.k ? a.x_stride : a.k;
    const int64_t out_stride = a.out_stride > a.n ? a.out_stride : a.n;
    if (a.m > 0) {
      out->reads[out->n_reads++] = range(a.x, (a.m - 1) * x_stride + a.k);
      out->write = range(a.out, (a.m - 1) * out_stride + a.n);
    }
    if (a.bias) out->reads[out->n_reads++] = range(a.bias, a.n);
    return true;
  }
  if (op == PC_OP_LORA) {
    const auto& a = *static_cast<const pc_lora_args_t*>(args);
    out->reads[out->n_reads++] = range(a.x, a.m * a.k);
    if (a.rows) out->reads[out->n_reads++] = range(a.rows, a.n_rows);
    out->write = range(a.out, a.m * a.n);
    return true;
  }
  return false;
}

}  // namespace polychip::cpu
