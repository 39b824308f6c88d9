// Conformance checks of the per-op counters domain (ABI 1.3, op_counters_read): what a plugin
// claims to count must move when the op runs, by exactly the launches made, with honest time
// (> 0 when measured, 0 when not) and plausible bytes and FLOPs; the record stride and the
// capacity are the caller's.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/conformance/harness.h"

namespace polychip::runtime::conformance {
namespace {

bool HasOpCounters(const pc_backend_iface_t* api) {
  return PC_HAS_MEMBER(api, pc_backend_iface_t, op_counters_read) &&
         api->op_counters_read != nullptr;
}

// The record of `op` in a snapshot (zeros if the op has not run); nullopt when switched off.
std::optional<pc_op_counters_t> Snapshot(const Harness& h, pc_op_t op, std::string* problem) {
  std::vector<pc_op_counters_t> records(64);
  records[0].struct_size = sizeof(pc_op_counters_t);
  const int32_t n =
      h.api->op_counters_read(h.device, records.data(), static_cast<int32_t>(records.size()));
  if (n < 0) return std::nullopt;
  pc_op_counters_t found{};
  found.op = op;
  for (int32_t i = 0; i < n && i < static_cast<int32_t>(records.size()); ++i) {
    if (i > 0 && records[i].op <= records[i - 1].op) *problem = "records not in ascending op order";
    if (records[i].op == op) found = records[i];
  }
  return found;
}

// Runs MATMUL F32 [m=3, n=8, k=16] `launches` times and ADD once, and compares the counters'
// movement with what was launched.
Verdict CountersMove(Harness& h) {
  if (!HasOpCounters(h.api)) return Skip("op_counters_read absent (ABI < 1.3 or not offered)");
  if (!h.Supports(PC_OP_MATMUL, {PC_DTYPE_F32})) return Skip("MATMUL F32 not claimed");
  std::string problem;
  const auto before = Snapshot(h, PC_OP_MATMUL, &problem);
  if (!before) return Skip("counting switched off (op_counters_read returned -1)");
  const int64_t m = 3, n = 8, k = 16;
  const int launches = 3;
  PCC_ASSIGN(pc_devptr_t x, h.UploadVec(h.RandomFloats(m * k)));
  PCC_ASSIGN(pc_devptr_t w, h.UploadVec(h.RandomFloats(n * k)));
  PCC_ASSIGN(pc_devptr_t out, h.Alloc(m * n * 4));
  pc_matmul_args_t a{};
  a.struct_size = sizeof(a);
  a.x = x;
  a.w = w;
  a.w_dtype = PC_DTYPE_F32;
  a.w_layout = PC_LAYOUT_GGUF;
  a.out = out;
  a.m = m;
  a.n = n;
  a.k = k;
  a.x_stride = k;
  a.out_stride = n;
  for (int i = 0; i < launches; ++i) PCC_TRY(h.Launch(PC_OP_MATMUL, &a));
  // A rejected launch is not a launch.
  pc_matmul_args_t bad = a;
  bad.k = -1;
  if (h.Launch(PC_OP_MATMUL, &bad).ok()) return Fail("MATMUL with k = -1 accepted");
  PCC_TRY(h.Sync());
  const auto after = Snapshot(h, PC_OP_MATMUL, &problem);
  if (!after) return Fail("op_counters_read returned -1 after returning counters");
  if (!problem.empty()) return Fail(problem);
  const uint64_t d_launches = after->launches - before->launches;
  if (d_launches != static_cast<uint64_t>(launches)) {
    return Fail("matmul launches moved by " + std::to_string(d_launches) + ", " +
                std::to_string(launches) + " were made (one more rejected)");
  }
  const uint32_t flags = after->flags;
  const uint64_t d_ns = after->device_ns - before->device_ns;
  if ((flags & PC_OP_COUNTERS_TIME) && d_ns == 0) return Fail("time measured but did not move");
  if (!(flags & PC_OP_COUNTERS_TIME) && after->device_ns != 0)
    return Fail("device_ns is nonzero without PC_OP_COUNTERS_TIME");
  const uint64_t min_read = launches * static_cast<uint64_t>((m * k + n * k) * 4);
  const uint64_t min_written = launches * static_cast<uint64_t>(m * n * 4);
  const uint64_t d_read = after->bytes_read - before->bytes_read;
  const uint64_t d_written = after->bytes_written - before->bytes_written;
  if (flags & PC_OP_COUNTERS_BYTES) {
    // Plausible: at least the operands, at most a few times them (a kernel that reads its
    // input twice is honest to say so; orders of magnitude off is a counting bug).
    if (d_read < min_read || d_read > 8 * min_read || d_written < min_written ||
        d_written > 8 * min_written) {
      return Fail("bytes read " + std::to_string(d_read) + " / written " +
                  std::to_string(d_written) + ", operands are " + std::to_string(min_read) + " / " +
                  std::to_string(min_written));
    }
  } else if (after->bytes_read != 0 || after->bytes_written != 0) {
    return Fail("bytes nonzero without PC_OP_COUNTERS_BYTES");
  }
  const uint64_t flops = launches * static_cast<uint64_t>(2 * m * n * k);
  const uint64_t d_flops = after->flops - before->flops;
  if ((flags & PC_OP_COUNTERS_FLOPS) && (d_flops < flops || d_flops > 2 * flops))
    return Fail("flops moved by " + std::to_string(d_flops) +
                ", 2·m·n·k·launches = " + std::to_string(flops));
  if (!(flags & PC_OP_COUNTERS_FLOPS) && after->flops != 0)
    return Fail("flops nonzero without PC_OP_COUNTERS_FLOPS");
  return Pass(std::to_string(d_launches) + " launches, " + std::to_string(d_ns) + " ns, " +
              std::to_string(d_read) + " B read, " + std::to_string(d_written) + " B written, " +
              std::to_string(d_flops) + " flops");
}

// The caller's stride and capacity: a larger record (a newer host) is filled up to the
// plugin's size and no further; capacity 0 writes nothing and still says how many.
Verdict CountersStride(Harness& h) {
  if (!HasOpCounters(h.api)) return Skip("op_counters_read absent (ABI < 1.3 or not offered)");
  if (!h.Supports(PC_OP_ADD, {PC_DTYPE_F32})) return Skip("ADD not claimed");
  PCC_ASSIGN(pc_devptr_t x, h.UploadVec(h.RandomFloats(16)));
  pc_add_args_t a{};
  a.struct_size = sizeof(a);
  a.a = x;
  a.b = x;
  a.out = x;
  a.n = 16;
  PCC_TRY(h.Launch(PC_OP_ADD, &a));
  PCC_TRY(h.Sync());
  const int32_t count = h.api->op_counters_read(h.device, nullptr, 0);
  if (count < 0) return Skip("counting switched off (op_counters_read returned -1)");
  if (count < 1) return Fail("no record after an ADD launch (capacity 0 returned 0)");
  constexpr size_t kPad = 24;
  const size_t stride = sizeof(pc_op_counters_t) + kPad;
  std::vector<unsigned char> buffer(stride * (count + 1), 0xA5);
  auto* first = reinterpret_cast<pc_op_counters_t*>(buffer.data());
  first->struct_size = stride;
  const int32_t n = h.api->op_counters_read(h.device, first, count);
  if (n != count) return Fail("count " + std::to_string(n) + " after " + std::to_string(count));
  bool saw_add = false;
  for (int32_t i = 0; i < n; ++i) {
    const unsigned char* rec = buffer.data() + i * stride;
    pc_op_counters_t r;
    std::memcpy(&r, rec, sizeof(r));
    if (r.struct_size < offsetof(pc_op_counters_t, launches) + sizeof(r.launches) ||
        r.struct_size > sizeof(pc_op_counters_t)) {
      return Fail("record " + std::to_string(i) + " has struct_size " +
                  std::to_string(r.struct_size));
    }
    for (size_t b = r.struct_size; b < stride; ++b) {
      if (rec[b] != 0xA5) return Fail("record " + std::to_string(i) + " written past its size");
    }
    if (r.op == PC_OP_ADD && r.launches > 0) saw_add = true;
  }
  const unsigned char* past = buffer.data() + n * stride;
  for (size_t b = 0; b < stride; ++b) {
    if (past[b] != 0xA5) return Fail("written past capacity");
  }
  if (!saw_add) return Fail("no ADD record with launches > 0 after an ADD launch");
  return Pass(std::to_string(n) + " records at stride " + std::to_string(stride));
}

}  // namespace

void AddCounterChecks(std::vector<Check>& checks) {
  checks.push_back({"counters.op_counters_move", Stage::kDevice, CountersMove});
  checks.push_back({"counters.op_counters_stride", Stage::kDevice, CountersStride});
}

}  // namespace polychip::runtime::conformance
