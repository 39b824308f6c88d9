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
#include "polychip/sdk/op_list.h"

namespace polychip::cpu {

struct ByteRange {
  uintptr_t begin = 0, end = 0;
  bool Overlaps(const ByteRange& o) const {
    return begin < end && o.begin < o.end && begin < o.end && o.begin < end;
  }
};

// The activation buffers a launch reads and writes, as the op list gives them. Weights are left
// out: no launch writes one (weight_upload and mem_free wait for the worker).
struct LaunchAccess {
  static constexpr int kMaxRanges = 4;
  ByteRange reads[kMaxRanges], writes[kMaxRanges];
  int n_reads = 0, n_writes = 0;

  // Whether a later launch with access `later` must wait for this one: it writes what this one
  // reads or writes, or reads what this one writes.
  bool OrderedBefore(const LaunchAccess& later) const {
    for (int w = 0; w < later.n_writes; ++w) {
      for (int i = 0; i < n_reads; ++i) {
        if (later.writes[w].Overlaps(reads[i])) return true;
      }
      for (int i = 0; i < n_writes; ++i) {
        if (later.writes[w].Overlaps(writes[i])) return true;
      }
    }
    for (int w = 0; w < n_writes; ++w) {
      for (int i = 0; i < later.n_reads; ++i) {
        if (writes[w].Overlaps(later.reads[i])) return true;
      }
    }
    return false;
  }
};

// The access of a MATMUL or LORA launch (args validated): its address members' extents from
// the op list (polychip/sdk/op_list.h). False for any other op, which waits for a launch on the
// worker: the ops that follow a decode step's adapter terms read their outputs anyway.
inline bool AccessOf(pc_op_t op, const void* args, LaunchAccess* out) {
  *out = LaunchAccess{};
  if (op != PC_OP_MATMUL && op != PC_OP_LORA) return false;
  return sdk::VisitOp(op, false, [&](auto t) {
    using T = decltype(t);
    const auto& a = *static_cast<const typename T::Args*>(args);
    bool known = true;
    T::Members(sdk::MemberVisitor{
        [](auto&&...) {},
        [&](auto member, const char*, sdk::Access access, auto extent_fn, uint32_t, size_t) {
          if (access == sdk::Access::kPaged) known = false;  // reached through tables
          const pc_devptr_t p = a.*member;
          const int64_t bytes = extent_fn(a).bytes;
          if (access == sdk::Access::kWeight || p == 0 || bytes <= 0) return;
          const ByteRange range{p, p + static_cast<uintptr_t>(bytes)};
          const bool reads = access != sdk::Access::kOut, writes = access != sdk::Access::kIn;
          if ((reads && out->n_reads == LaunchAccess::kMaxRanges) ||
              (writes && out->n_writes == LaunchAccess::kMaxRanges)) {
            known = false;
            return;
          }
          if (reads) out->reads[out->n_reads++] = range;
          if (writes) out->writes[out->n_writes++] = range;
        }});
    return known;
  });
}

}  // namespace polychip::cpu
