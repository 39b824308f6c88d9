// Comm plugin conformance: N ranks as N threads of this process (or, with options.process_rank
// set, as N processes started by a launcher such as mpirun, one rank each), each with its own
// communicator, check every collective against a plain reference computed in double (odd sizes,
// F32/F16/BF16/I32, sum/max/min), point-to-point patterns, overlapping sub-communicators, and
// that creation with a missing rank fails with UNAVAILABLE in bounded time.
//
// Every rank regenerates every rank's inputs from the seed, so each can check its own output
// alone. A check that does not finish within its deadline aborts the communicators (which must
// unblock every waiter) and fails: the kit never hangs on a plugin that deadlocks.
//
// With processes, unique ids travel through a FileKvStore in options.kv_dir, and after the checks
// every rank but 0 publishes its verdicts there; rank 0 folds them into its report, so a check
// fails when any rank failed it.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "polychip/plugin/pc_comm.h"
#include "runtime/abi_internal.h"
#include "runtime/conformance/conformance.h"
#include "runtime/conformance/harness.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/host_services.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"

namespace polychip::runtime::conformance {
namespace {

using Clock = std::chrono::steady_clock;

// A device-memory plugin's rank: a device of the plugin's device_plugin (rank r on device r),
// a stream its collectives follow, and the buffers of the check running.
struct RankDevice {
  std::shared_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
};

struct World {
  const pc_comm_iface_t* api = nullptr;
  int32_t n = 0;
  uint32_t seed = 0;
  std::vector<pc_comm_t*> comms;  // by rank; with processes only comms[self] is set
  int32_t self = -1;              // >= 0: this process is rank `self` alone
  KvStore* kv = nullptr;          // with processes: where ids and verdicts are exchanged
  // Device-memory plugins: the device plugin and each rank's device (empty for host memory).
  std::shared_ptr<Backend> backend;
  std::vector<RankDevice>* devices = nullptr;
  bool on_device() const { return devices != nullptr; }
};

// The stream a rank's collectives take: its device's (device memory), else none.
void* StreamOf(const World& w, int32_t rank) {
  return w.on_device() ? (*w.devices)[rank].stream->raw() : nullptr;
}

// What a collective of `rank` is given for `host`'s bytes: host itself (host memory), or a copy
// on the rank's device (device memory), uploaded on the rank's stream.
StatusOr<void*> Put(const World& w, int32_t rank, std::vector<uint8_t>& host) {
  if (!w.on_device()) return static_cast<void*>(host.data());
  RankDevice& d = (*w.devices)[rank];
  PC_ASSIGN_OR_RETURN(auto buffer, d.device->Allocate(std::max<size_t>(host.size(), 1)));
  PC_RETURN_IF_ERROR(d.stream->CopyH2D(buffer->ptr(), host.data(), host.size()));
  void* p = reinterpret_cast<void*>(static_cast<uintptr_t>(buffer->ptr()));
  d.buffers.push_back(std::move(buffer));
  return p;
}
// Brings what a collective wrote at `p` (from Put) back into `host` (device memory: after the
// rank's stream reached it).
Status Get(const World& w, int32_t rank, void* p, std::vector<uint8_t>& host) {
  if (!w.on_device()) return Status::Ok();
  RankDevice& d = (*w.devices)[rank];
  PC_RETURN_IF_ERROR(d.stream->CopyD2H(host.data(), reinterpret_cast<uintptr_t>(p), host.size()));
  return d.stream->Synchronize();
}

Status Take(const pc_comm_iface_t* api, pc_error_t* e, const std::string& what) {
  if (e == nullptr) return Status::Ok();
  const pc_code_t code = api->error_code(e);
  const char* msg = api->error_message(e);
  Status s(FromPcCode(code), what + ": " + (msg != nullptr ? msg : "(no message)"));
  api->error_destroy(e);
  return s;
}

// Rank 0 makes a unique id; with processes it publishes it under `key` and the others read it.
Status ShareId(World& w, const std::string& key, pc_comm_unique_id_t* id) {
  if (w.self <= 0) return Take(w.api, w.api->get_unique_id(id), "get_unique_id");
  PC_ASSIGN_OR_RETURN(std::string bytes, w.kv->Get(key, 60000));
  if (bytes.size() != sizeof(id->bytes)) return InvalidArgument("bad id under " + key);
  std::memcpy(id->bytes, bytes.data(), sizeof(id->bytes));
  return Status::Ok();
}
Status PublishId(World& w, const std::string& key, const pc_comm_unique_id_t& id) {
  if (w.self != 0) return Status::Ok();
  return w.kv->Set(key, std::string(id.bytes, sizeof(id.bytes)));
}

#define PCC_COMM(expr, what)                                      \
  do {                                                            \
    ::polychip::Status pcc_status_ = Take(w.api, (expr), (what)); \
    if (!pcc_status_.ok()) return Fail(pcc_status_.ToString());   \
  } while (0)

// Runs body(rank) on n threads (with processes: on one, for this process's rank); the first
// failing rank's verdict wins. Past the deadline the communicators are aborted so that blocked
// ranks return.
Verdict RunRanks(World& w, const std::function<Verdict(int32_t)>& body, double deadline_s = 60) {
  std::vector<std::future<Verdict>> futures;
  const int32_t first_rank = w.self >= 0 ? w.self : 0;
  const int32_t end_rank = w.self >= 0 ? w.self + 1 : w.n;
  for (int32_t r = first_rank; r < end_rank; ++r) {
    futures.push_back(std::async(std::launch::async, [&body, &w, r] {
      Verdict v;
      try {
        v = body(r);
      } catch (const std::exception& e) {
        v = Fail(std::string("exception: ") + e.what());
      }
      if (w.on_device()) {  // the check's device buffers, once its stream is done with them
        RankDevice& d = (*w.devices)[r];
        (void)d.stream->Synchronize();
        d.buffers.clear();
      }
      return v;
    }));
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(deadline_s);
  bool timed_out = false;
  for (auto& f : futures) {
    if (f.wait_until(deadline) != std::future_status::ready) timed_out = true;
  }
  if (timed_out) {
    for (pc_comm_t* c : w.comms) {
      if (c != nullptr) w.api->comm_abort(c);
    }
    for (auto& f : futures) f.wait();  // comm_abort must unblock every waiter
    return Fail("did not complete within " + std::to_string(int(deadline_s)) +
                " s (communicators aborted)");
  }
  Verdict first;
  for (int32_t r = first_rank; r < end_rank; ++r) {
    Verdict v = futures[r - first_rank].get();
    if (v.outcome == Outcome::kFail) return Fail("rank " + std::to_string(r) + ": " + v.detail);
    if (r == first_rank) first = v;
  }
  return first;
}

// ---- typed data -----------------------------------------------------------------------------

size_t SizeOf(DType t) { return t == DType::kF16 || t == DType::kBF16 ? 2 : 4; }

std::vector<uint8_t> Encode(DType t, const std::vector<double>& v) {
  std::vector<uint8_t> out(v.size() * SizeOf(t));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = out.data() + i * SizeOf(t);
    if (t == DType::kF32) {
      const float f = static_cast<float>(v[i]);
      std::memcpy(p, &f, 4);
    } else if (t == DType::kI32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(p, &x, 4);
    } else {
      const uint16_t h = t == DType::kF16 ? Fp32ToFp16(float(v[i])) : Fp32ToBf16(float(v[i]));
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}

std::vector<double> Decode(DType t, const std::vector<uint8_t>& bytes) {
  std::vector<double> out(bytes.size() / SizeOf(t));
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t* p = bytes.data() + i * SizeOf(t);
    if (t == DType::kF32) {
      float f;
      std::memcpy(&f, p, 4);
      out[i] = f;
    } else if (t == DType::kI32) {
      int32_t x;
      std::memcpy(&x, p, 4);
      out[i] = x;
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      out[i] = t == DType::kF16 ? Fp16ToFp32(h) : Bf16ToFp32(h);
    }
  }
  return out;
}

// Rank r's input for a check: reproducible, already representable in the dtype.
std::vector<double> Input(const World& w, DType t, int32_t rank, uint64_t count, uint32_t salt) {
  std::mt19937 rng(w.seed * 2654435761u + rank * 7919u + salt);
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  std::uniform_int_distribution<int32_t> integer(-1000, 1000);
  std::vector<double> v(count);
  for (double& x : v) x = t == DType::kI32 ? integer(rng) : real(rng);
  return Decode(t, Encode(t, v));
}

double Tolerance(DType t) {
  switch (t) {
    case DType::kF32: return 1e-5;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 1.6e-2;
    default: return 0;  // integers: exact
  }
}

enum class Op { kSum, kMax, kMin };
const char* OpName(Op op) { return op == Op::kSum ? "sum" : op == Op::kMax ? "max" : "min"; }
pc_reduce_op_t PcOp(Op op) {
  return op == Op::kSum ? PC_REDUCE_SUM : op == Op::kMax ? PC_REDUCE_MAX : PC_REDUCE_MIN;
}
double Apply(Op op, double a, double b) {
  return op == Op::kSum ? a + b : op == Op::kMax ? std::max(a, b) : std::min(a, b);
}

Verdict Compare(DType t, const std::vector<double>& got, const std::vector<double>& want,
                const std::string& what) {
  double max_diff = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::isnan(got[i]) ? INFINITY : std::fabs(got[i] - want[i]);
    if (d > max_diff) max_diff = d, worst = i;
    max_ref = std::max(max_ref, std::fabs(want[i]));
  }
  const double err = max_diff / std::max(max_ref, 1e-30);
  char buf[200];
  if (err <= Tolerance(t)) {
    std::snprintf(buf, sizeof(buf), "max rel err %.1e", err);
    return Pass(buf);
  }
  std::snprintf(buf, sizeof(buf), "%s: rel err %.2e > %.0e; worst [%zu]: got %g, want %g",
                what.c_str(), err, Tolerance(t), worst, got[worst], want[worst]);
  return Fail(buf);
}

const uint64_t kSizes[] = {1, 7, 4099, 262147};

// ---- the checks -----------------------------------------------------------------------------

Verdict AllReduce(World& w, DType t, Op op, bool in_place) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    Verdict last = Pass();
    for (uint64_t count : kSizes) {
      std::vector<double> want = Input(w, t, 0, count, count);
      for (int32_t r = 1; r < w.n; ++r) {
        const std::vector<double> in = Input(w, t, r, count, count);
        for (uint64_t i = 0; i < count; ++i) want[i] = Apply(op, want[i], in[i]);
      }
      std::vector<uint8_t> send = Encode(t, Input(w, t, rank, count, count));
      std::vector<uint8_t> recv(send.size(), 0xcd);
      PCC_ASSIGN(void* in, Put(w, rank, send));
      void* out = in;
      if (!in_place) {
        PCC_ASSIGN(out, Put(w, rank, recv));
      }
      PCC_COMM(w.api->all_reduce(w.comms[rank], in, out, count, static_cast<pc_dtype_t>(t),
                                 PcOp(op), StreamOf(w, rank)),
               "all_reduce");
      PCC_TRY(Get(w, rank, out, in_place ? send : recv));
      last = Compare(t, Decode(t, in_place ? send : recv), want,
                     "count " + std::to_string(count));
      if (last.outcome == Outcome::kFail) return last;
    }
    return last;
  });
}

Verdict AllGather(World& w, DType t) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    for (uint64_t count : kSizes) {
      std::vector<double> want;
      for (int32_t r = 0; r < w.n; ++r) {
        const std::vector<double> in = Input(w, t, r, count, count + 1);
        want.insert(want.end(), in.begin(), in.end());
      }
      std::vector<uint8_t> send = Encode(t, Input(w, t, rank, count, count + 1));
      std::vector<uint8_t> recv(send.size() * w.n, 0xcd);
      PCC_ASSIGN(void* in, Put(w, rank, send));
      PCC_ASSIGN(void* out, Put(w, rank, recv));
      PCC_COMM(w.api->all_gather(w.comms[rank], in, out, count, static_cast<pc_dtype_t>(t),
                                 StreamOf(w, rank)),
               "all_gather");
      PCC_TRY(Get(w, rank, out, recv));
      // A gather copies: it must be exact whatever the dtype.
      if (Decode(t, recv) != want) return Fail("count " + std::to_string(count) + ": data differs");
    }
    return Pass("exact");
  });
}

Verdict ReduceScatter(World& w, DType t) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    Verdict last = Pass();
    for (uint64_t count : {1ull, 7ull, 4099ull}) {
      std::vector<double> want;  // this rank's slice, reduced
      for (int32_t r = 0; r < w.n; ++r) {
        const std::vector<double> in = Input(w, t, r, count * w.n, count + 2);
        for (uint64_t i = 0; i < count; ++i) {
          const double x = in[rank * count + i];
          if (r == 0) want.push_back(x); else want[i] += x;
        }
      }
      std::vector<uint8_t> send = Encode(t, Input(w, t, rank, count * w.n, count + 2));
      std::vector<uint8_t> recv(count * SizeOf(t), 0xcd);
      PCC_ASSIGN(void* in, Put(w, rank, send));
      PCC_ASSIGN(void* out, Put(w, rank, recv));
      PCC_COMM(w.api->reduce_scatter(w.comms[rank], in, out, count, static_cast<pc_dtype_t>(t),
                                     PC_REDUCE_SUM, StreamOf(w, rank)),
               "reduce_scatter");
      PCC_TRY(Get(w, rank, out, recv));
      last = Compare(t, Decode(t, recv), want, "count " + std::to_string(count));
      if (last.outcome == Outcome::kFail) return last;
    }
    return last;
  });
}

Verdict Broadcast(World& w, DType t) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    for (int32_t root = 0; root < w.n; ++root) {
      for (uint64_t count : {1ull, 4099ull}) {
        const std::vector<double> want = Input(w, t, root, count, count + 3);
        std::vector<uint8_t> buf = rank == root ? Encode(t, want)
                                                : std::vector<uint8_t>(count * SizeOf(t), 0xcd);
        PCC_ASSIGN(void* p, Put(w, rank, buf));
        PCC_COMM(w.api->broadcast(w.comms[rank], p, p, count, static_cast<pc_dtype_t>(t), root,
                                  StreamOf(w, rank)),
                 "broadcast");
        PCC_TRY(Get(w, rank, p, buf));
        if (Decode(t, buf) != want) {
          return Fail("root " + std::to_string(root) + ", count " + std::to_string(count) +
                      ": data differs");
        }
      }
    }
    return Pass("every root, exact");
  });
}

// Each rank sends to the next and receives from the previous (a ring). Without group calls a
// rendezvous send would deadlock if every rank sent first, so even ranks send first.
Verdict SendRecvRing(World& w) {
  if (w.n < 2) return Skip("needs 2 ranks");
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    const uint64_t count = 70001;
    const int32_t next = (rank + 1) % w.n, prev = (rank + w.n - 1) % w.n;
    std::vector<uint8_t> send = Encode(DType::kF32, Input(w, DType::kF32, rank, count, 5));
    std::vector<uint8_t> recv(send.size(), 0xcd);
    PCC_ASSIGN(void* in, Put(w, rank, send));
    PCC_ASSIGN(void* out, Put(w, rank, recv));
    auto do_send = [&] {
      return Take(w.api,
                  w.api->send(w.comms[rank], in, count, PC_DTYPE_F32, next, StreamOf(w, rank)),
                  "send");
    };
    auto do_recv = [&] {
      return Take(w.api,
                  w.api->recv(w.comms[rank], out, count, PC_DTYPE_F32, prev, StreamOf(w, rank)),
                  "recv");
    };
    Status a, b;
    if (w.api->group_start != nullptr && w.api->group_end != nullptr) {
      PCC_COMM(w.api->group_start(), "group_start");
      a = do_send();
      b = do_recv();
      PCC_COMM(w.api->group_end(), "group_end");
    } else if (rank % 2 == 0) {
      a = do_send();
      b = do_recv();
    } else {
      b = do_recv();
      a = do_send();
    }
    PCC_TRY(a);
    PCC_TRY(b);
    PCC_TRY(Get(w, rank, out, recv));
    if (Decode(DType::kF32, recv) != Input(w, DType::kF32, prev, count, 5)) {
      return Fail("data from rank " + std::to_string(prev) + " differs");
    }
    return Pass("exact");
  });
}

Verdict Barriers(World& w) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    for (int i = 0; i < 50; ++i) {
      PCC_COMM(w.api->barrier(w.comms[rank], StreamOf(w, rank)), "barrier");
    }
    if (w.on_device()) PCC_TRY((*w.devices)[rank].stream->Synchronize());
    return Pass("50 barriers");
  });
}

// Two overlapping splits (rank % 2 and rank / 2) used interleaved, plus a split that leaves
// every rank but the last out (color -1).
Verdict Split(World& w) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    pc_comm_t* a = nullptr;
    pc_comm_t* b = nullptr;
    pc_comm_t* solo = nullptr;
    PCC_COMM(w.api->comm_split(w.comms[rank], rank % 2, rank, &a), "comm_split(rank % 2)");
    PCC_COMM(w.api->comm_split(w.comms[rank], rank / 2, -rank, &b), "comm_split(rank / 2)");
    PCC_COMM(w.api->comm_split(w.comms[rank], rank == w.n - 1 ? 0 : -1, 0, &solo),
             "comm_split(-1)");
    auto cleanup = [&] {
      for (pc_comm_t* c : {a, b, solo}) {
        if (c != nullptr) (void)Take(w.api, w.api->comm_destroy(c), "comm_destroy");
      }
    };
    auto check = [&]() -> Verdict {
      if (a == nullptr || b == nullptr) return Fail("comm_split gave no communicator");
      if ((solo != nullptr) != (rank == w.n - 1)) return Fail("color -1 must give NULL");
      // Expected groups.
      std::vector<int32_t> ga, gb;
      for (int32_t r = 0; r < w.n; ++r) {
        if (r % 2 == rank % 2) ga.push_back(r);
        if (r / 2 == rank / 2) gb.insert(gb.begin(), r);  // key -rank: reversed
      }
      int32_t ra = -1, na = -1, rb = -1, nb = -1;
      PCC_COMM(w.api->comm_rank(a, &ra), "comm_rank");
      PCC_COMM(w.api->comm_size(a, &na), "comm_size");
      PCC_COMM(w.api->comm_rank(b, &rb), "comm_rank");
      PCC_COMM(w.api->comm_size(b, &nb), "comm_size");
      const int32_t want_ra = std::find(ga.begin(), ga.end(), rank) - ga.begin();
      const int32_t want_rb = std::find(gb.begin(), gb.end(), rank) - gb.begin();
      if (na != int32_t(ga.size()) || ra != want_ra || nb != int32_t(gb.size()) || rb != want_rb) {
        return Fail("rank/size in sub-communicators: got (" + std::to_string(ra) + "/" +
                    std::to_string(na) + ", " + std::to_string(rb) + "/" + std::to_string(nb) +
                    "), want (" + std::to_string(want_ra) + "/" + std::to_string(ga.size()) +
                    ", " + std::to_string(want_rb) + "/" + std::to_string(gb.size()) + ")");
      }
      for (int round = 0; round < 3; ++round) {
        const int32_t value = rank * 100 + round;
        std::vector<uint8_t> v(4), ra_bytes(4, 0), rb_bytes(4, 0);
        std::memcpy(v.data(), &value, 4);
        PCC_ASSIGN(void* in, Put(w, rank, v));
        PCC_ASSIGN(void* out_a, Put(w, rank, ra_bytes));
        PCC_ASSIGN(void* out_b, Put(w, rank, rb_bytes));
        PCC_COMM(w.api->all_reduce(a, in, out_a, 1, PC_DTYPE_I32, PC_REDUCE_SUM, StreamOf(w, rank)),
                 "all_reduce on split a");
        PCC_COMM(w.api->all_reduce(b, in, out_b, 1, PC_DTYPE_I32, PC_REDUCE_SUM, StreamOf(w, rank)),
                 "all_reduce on split b");
        PCC_TRY(Get(w, rank, out_a, ra_bytes));
        PCC_TRY(Get(w, rank, out_b, rb_bytes));
        int32_t sa = 0, sb = 0;
        std::memcpy(&sa, ra_bytes.data(), 4);
        std::memcpy(&sb, rb_bytes.data(), 4);
        int32_t want_a = 0, want_b = 0;
        for (int32_t r : ga) want_a += r * 100 + round;
        for (int32_t r : gb) want_b += r * 100 + round;
        if (sa != want_a || sb != want_b) {
          return Fail("sums in sub-communicators: got " + std::to_string(sa) + ", " +
                      std::to_string(sb) + "; want " + std::to_string(want_a) + ", " +
                      std::to_string(want_b));
        }
      }
      if (solo != nullptr) {
        const float x = 2.5f;
        std::vector<uint8_t> xb(4), yb(4, 0);
        std::memcpy(xb.data(), &x, 4);
        PCC_ASSIGN(void* in, Put(w, rank, xb));
        PCC_ASSIGN(void* out, Put(w, rank, yb));
        PCC_COMM(
            w.api->all_reduce(solo, in, out, 1, PC_DTYPE_F32, PC_REDUCE_SUM, StreamOf(w, rank)),
            "all_reduce on a group of one");
        PCC_TRY(Get(w, rank, out, yb));
        float y = 0;
        std::memcpy(&y, yb.data(), 4);
        if (y != 2.5f) return Fail("group of one changed the value");
      }
      return Pass("groups of " + std::to_string(ga.size()) + " and " + std::to_string(gb.size()));
    };
    Verdict v = check();
    cleanup();
    return v;
  });
}

// n ranks join a communicator created for n + 1: every one must fail with UNAVAILABLE soon
// after the timeout, never hang.
Verdict MissingRank(World& w) {
  pc_comm_unique_id_t id{};
  PCC_TRY(ShareId(w, "missing_rank", &id));
  PCC_TRY(PublishId(w, "missing_rank", id));
  const int64_t timeout_ms = 500;
  const auto start = Clock::now();
  World missing = w;
  missing.comms.assign(w.n, nullptr);
  Verdict v = RunRanks(
      missing,
      [&](int32_t rank) -> Verdict {
        pc_comm_t* c = nullptr;
        Status s = Take(w.api, w.api->comm_init_rank(&id, w.n + 1, rank, timeout_ms, &c),
                        "comm_init_rank");
        if (s.ok()) {
          if (c != nullptr) (void)Take(w.api, w.api->comm_destroy(c), "comm_destroy");
          return Fail("succeeded with a rank missing");
        }
        // A plugin whose world is fixed by its launcher (mpi) can refuse a size it can never
        // reach at once; anything else must time out with UNAVAILABLE.
        if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kInvalidArgument) {
          return Fail("want UNAVAILABLE (or INVALID_ARGUMENT): " + s.ToString());
        }
        return Pass(s.message());
      },
      timeout_ms / 1000.0 + 10);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (v.outcome == Outcome::kPass) {
    v.detail = "after " + std::to_string(int(seconds * 1000)) + " ms: " + v.detail;
    if (v.detail.size() > 160) v.detail = v.detail.substr(0, 157) + "...";
  }
  return v;
}

// Arguments a plugin must refuse with INVALID_ARGUMENT (locally, without waiting for peers).
Verdict BadArguments(World& w) {
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    std::vector<uint8_t> xb(4, 0);
    PCC_ASSIGN(void* x, Put(w, rank, xb));
    pc_error_t* e =
        w.api->broadcast(w.comms[rank], x, x, 1, PC_DTYPE_F32, w.n + 5, StreamOf(w, rank));
    const std::string bad_root = CheckCommError(w.api, e, {PC_CODE_INVALID_ARGUMENT});
    if (!bad_root.empty()) return Fail("broadcast with root n+5: " + bad_root);
    e = w.api->send(w.comms[rank], x, 1, PC_DTYPE_F32, -1, StreamOf(w, rank));
    const std::string bad_peer = CheckCommError(w.api, e, {PC_CODE_INVALID_ARGUMENT});
    if (!bad_peer.empty()) return Fail("send to peer -1: " + bad_peer);
    return Pass();
  });
}

// Optional (ABI 1.1): the buffer bytes a communicator takes grow with its ranks and are refused
// for n_ranks < 1.
Verdict BufferBytes(World& w) {
  if (!PC_HAS_MEMBER(w.api, pc_comm_iface_t, comm_buffer_bytes) ||
      w.api->comm_buffer_bytes == nullptr) {
    return Skip("comm_buffer_bytes not provided (optional)");
  }
  uint64_t one = 0, n = 0;
  PCC_COMM(w.api->comm_buffer_bytes(1, &one), "comm_buffer_bytes(1)");
  PCC_COMM(w.api->comm_buffer_bytes(w.n + 1, &n), "comm_buffer_bytes(n + 1)");
  if (n < one) {
    return Fail(std::to_string(w.n + 1) + " ranks report fewer bytes (" + std::to_string(n) +
                ") than 1 rank (" + std::to_string(one) + ")");
  }
  const std::string bad = CheckCommError(w.api, w.api->comm_buffer_bytes(0, &one),
                                         {PC_CODE_INVALID_ARGUMENT});
  if (!bad.empty()) return Fail("comm_buffer_bytes(0): " + bad);
  return Pass(std::to_string(n) + " bytes for " + std::to_string(w.n + 1) + " ranks");
}

// ---- device-memory plugins ----------------------------------------------------------------

// A collective enqueued on a stream after an op sees the op's result: x += 1 twenty times with
// ADD, then all_reduce(x) on the same stream, one synchronize at the end.
Verdict DeviceStreamOrder(World& w) {
  if (!w.on_device()) return Skip("host-memory plugin");
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    const int64_t m = 4099;
    const int kAdds = 20;
    const Stream& stream = *(*w.devices)[rank].stream;
    std::vector<uint8_t> zeros(m * 4, 0), ones(m * 4);
    for (int64_t i = 0; i < m; ++i) {
      const float one = 1.0f;
      std::memcpy(ones.data() + i * 4, &one, 4);
    }
    PCC_ASSIGN(void* x, Put(w, rank, zeros));
    PCC_ASSIGN(void* one, Put(w, rank, ones));
    AddArgs add;
    add.a = add.out = reinterpret_cast<uintptr_t>(x);
    add.b = reinterpret_cast<uintptr_t>(one);
    add.n = m;
    for (int i = 0; i < kAdds; ++i) PCC_TRY(Launch(stream, add));
    PCC_COMM(w.api->all_reduce(w.comms[rank], x, x, m, PC_DTYPE_F32, PC_REDUCE_SUM, stream.raw()),
             "all_reduce");
    PCC_TRY(Get(w, rank, x, zeros));
    for (int64_t i = 0; i < m; ++i) {
      float got;
      std::memcpy(&got, zeros.data() + i * 4, 4);
      if (got != float(kAdds * w.n)) {
        return Fail("element " + std::to_string(i) + " is " + std::to_string(got) + ", want " +
                    std::to_string(kAdds * w.n) + ": the collective did not follow the ADDs");
      }
    }
    return Pass(std::to_string(kAdds) + " ADDs, then all_reduce, one synchronize");
  });
}

// The call only enqueues: rank 0's all_reduce returns while the others have not called yet
// (they wait 400 ms), and the result is right once its stream is synchronized.
Verdict DeviceEnqueueReturns(World& w) {
  if (!w.on_device()) return Skip("host-memory plugin");
  if (w.n < 2) return Skip("needs 2 ranks");
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    const int32_t value = rank + 1;
    std::vector<uint8_t> v(4);
    std::memcpy(v.data(), &value, 4);
    PCC_ASSIGN(void* p, Put(w, rank, v));
    if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    const auto t0 = Clock::now();
    PCC_COMM(
        w.api->all_reduce(w.comms[rank], p, p, 1, PC_DTYPE_I32, PC_REDUCE_SUM, StreamOf(w, rank)),
        "all_reduce");
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (rank == 0 && ms > 200) {
      return Fail("all_reduce blocked the host for " + std::to_string(int(ms)) +
                  " ms waiting for peers; it must only enqueue on the stream");
    }
    PCC_TRY(Get(w, rank, p, v));
    int32_t sum = 0;
    std::memcpy(&sum, v.data(), 4);
    if (sum != w.n * (w.n + 1) / 2) return Fail("sum " + std::to_string(sum));
    return Pass(rank == 0 ? "returned in " + std::to_string(int(ms)) + " ms" : "");
  });
}

// A host pointer (or any address that is not the device's memory) is INVALID_ARGUMENT at the
// call, never a crash on the stream.
Verdict DeviceHostPointer(World& w) {
  if (!w.on_device()) return Skip("host-memory plugin");
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    std::vector<float> host(64, 1.0f);
    pc_error_t* e = w.api->all_reduce(w.comms[rank], host.data(), host.data(), host.size(),
                                      PC_DTYPE_F32, PC_REDUCE_SUM, StreamOf(w, rank));
    const std::string bad = CheckCommError(w.api, e, {PC_CODE_INVALID_ARGUMENT});
    if (!bad.empty()) return Fail("all_reduce on a host pointer: " + bad);
    e = w.api->send(w.comms[rank], host.data(), host.size(), PC_DTYPE_F32, (rank + 1) % w.n,
                    StreamOf(w, rank));
    const std::string bad_send = CheckCommError(w.api, e, {PC_CODE_INVALID_ARGUMENT});
    if (w.n > 1 && !bad_send.empty()) return Fail("send of a host pointer: " + bad_send);
    PCC_TRY((*w.devices)[rank].stream->Synchronize());  // nothing was enqueued that fails
    return Pass("INVALID_ARGUMENT");
  });
}

// group_start/group_end fuse: inside one group every rank sends to each other rank and receives
// from each, in the same order on every rank (which would deadlock on a rendezvous transport
// without the group), plus an all_reduce.
Verdict DeviceGroupFusion(World& w) {
  if (!w.on_device()) return Skip("host-memory plugin");
  if (w.api->group_start == nullptr) return Skip("no group calls");
  if (w.n < 2) return Skip("needs 2 ranks");
  return RunRanks(w, [&](int32_t rank) -> Verdict {
    const uint64_t count = 1025;
    std::vector<uint8_t> send = Encode(DType::kF32, Input(w, DType::kF32, rank, count, 11));
    PCC_ASSIGN(void* in, Put(w, rank, send));
    std::vector<std::vector<uint8_t>> recv(w.n, std::vector<uint8_t>(count * 4, 0xcd));
    std::vector<void*> out(w.n, nullptr);
    for (int32_t p = 0; p < w.n; ++p) {
      if (p == rank) continue;
      PCC_ASSIGN(out[p], Put(w, rank, recv[p]));
    }
    std::vector<uint8_t> one(4);
    const int32_t v = 1;
    std::memcpy(one.data(), &v, 4);
    PCC_ASSIGN(void* sum, Put(w, rank, one));
    void* s = StreamOf(w, rank);
    PCC_COMM(w.api->group_start(), "group_start");
    for (int32_t p = 0; p < w.n; ++p) {
      if (p == rank) continue;
      PCC_COMM(w.api->send(w.comms[rank], in, count, PC_DTYPE_F32, p, s), "send");
      PCC_COMM(w.api->recv(w.comms[rank], out[p], count, PC_DTYPE_F32, p, s), "recv");
    }
    PCC_COMM(w.api->all_reduce(w.comms[rank], sum, sum, 1, PC_DTYPE_I32, PC_REDUCE_SUM, s),
             "all_reduce");
    PCC_COMM(w.api->group_end(), "group_end");
    for (int32_t p = 0; p < w.n; ++p) {
      if (p == rank) continue;
      PCC_TRY(Get(w, rank, out[p], recv[p]));
      if (Decode(DType::kF32, recv[p]) != Input(w, DType::kF32, p, count, 11)) {
        return Fail("data from rank " + std::to_string(p) + " differs");
      }
    }
    PCC_TRY(Get(w, rank, sum, one));
    int32_t total = 0;
    std::memcpy(&total, one.data(), 4);
    if (total != w.n) return Fail("all_reduce in the group gave " + std::to_string(total));
    return Pass("all-to-all exchange and an all_reduce in one group");
  });
}

struct CommCheck {
  std::string name;
  std::function<Verdict(World&)> run;
};

std::vector<CommCheck> AllCommChecks() {
  std::vector<CommCheck> checks;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI32}) {
    std::string dt = DTypeName(t);
    for (char& ch : dt) ch = static_cast<char>(std::tolower(ch));
    for (Op op : {Op::kSum, Op::kMax, Op::kMin}) {
      checks.push_back({"collective.all_reduce." + dt + "." + OpName(op),
                        [t, op](World& w) { return AllReduce(w, t, op, false); }});
    }
    checks.push_back({"collective.all_gather." + dt, [t](World& w) { return AllGather(w, t); }});
    checks.push_back(
        {"collective.reduce_scatter." + dt + ".sum", [t](World& w) { return ReduceScatter(w, t); }});
    checks.push_back({"collective.broadcast." + dt, [t](World& w) { return Broadcast(w, t); }});
  }
  checks.push_back({"collective.all_reduce.in_place",
                    [](World& w) { return AllReduce(w, DType::kF32, Op::kSum, true); }});
  checks.push_back({"p2p.ring", SendRecvRing});
  checks.push_back({"barrier.repeated", Barriers});
  checks.push_back({"split.overlapping", Split});
  checks.push_back({"errors.invalid_arguments", BadArguments});
  checks.push_back({"memory.buffer_bytes", BufferBytes});
  checks.push_back({"init.missing_rank_times_out", MissingRank});
  checks.push_back({"device.stream_order", DeviceStreamOrder});
  checks.push_back({"device.enqueue_returns", DeviceEnqueueReturns});
  checks.push_back({"device.host_pointer_refused", DeviceHostPointer});
  checks.push_back({"device.group_fusion", DeviceGroupFusion});
  return checks;
}

// With processes: ranks 1.. publish their verdicts ("name\toutcome\tdetail" lines); rank 0
// fails each check that failed on any rank, then removes the exchange directory.
void GatherVerdicts(World& w, const Options& options, Report& report) {
  if (w.self != 0) {
    std::string text;
    for (const CheckResult& c : report.checks) {
      std::string detail = c.detail;
      for (char& ch : detail) ch = ch == '\n' || ch == '\t' ? ' ' : ch;
      text += c.name + "\t" + OutcomeName(c.outcome) + "\t" + detail + "\n";
    }
    (void)w.kv->Set("verdicts." + std::to_string(w.self), text);
    return;
  }
  for (int32_t r = 1; r < w.n; ++r) {
    StatusOr<std::string> text = w.kv->Get("verdicts." + std::to_string(r), 120000);
    if (!text.ok()) {
      report.checks.push_back({"ranks.verdicts", Outcome::kFail,
                               "rank " + std::to_string(r) + " sent no verdicts: " +
                                   text.status().message()});
      continue;
    }
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      if (a == std::string::npos || b == std::string::npos) continue;
      const std::string name = line.substr(0, a), outcome = line.substr(a + 1, b - a - 1);
      if (outcome != "FAIL") continue;
      const std::string prefix = "rank " + std::to_string(r) + ": ";
      std::string detail = line.substr(b + 1);
      if (detail.rfind(prefix, 0) != 0) detail = prefix + detail;  // RunRanks names the rank
      auto it = std::find_if(report.checks.begin(), report.checks.end(),
                             [&](const CheckResult& c) { return c.name == name; });
      if (it == report.checks.end()) {
        report.checks.push_back({name, Outcome::kFail, detail});
      } else if (it->outcome != Outcome::kFail) {
        it->outcome = Outcome::kFail;
        it->detail = detail;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(options.kv_dir, ec);
}

}  // namespace

std::string CheckCommError(const pc_comm_iface_t* api, pc_error_t* error,
                           std::initializer_list<pc_code_t> allowed) {
  if (error == nullptr) return "succeeded";
  const pc_code_t code = api->error_code(error);
  const char* msg = api->error_message(error);
  std::string problem;
  if (std::find(allowed.begin(), allowed.end(), code) == allowed.end()) {
    problem = std::string("unexpected code ") + CodeName(code);
  } else if (msg == nullptr || *msg == '\0') {
    problem = "empty error message";
  }
  api->error_destroy(error);
  return problem;
}

std::vector<std::string> CommCheckNames() {
  std::vector<std::string> names = {"load", "lifetime.initialize", "unique_id.distinct",
                                    "comm.init_rank"};
  for (const CommCheck& c : AllCommChecks()) names.push_back(c.name);
  names.push_back("comm.destroy");
  return names;
}

void RunCommChecks(const Options& options, Report& report) {
  std::regex filter(options.filter.empty() ? ".*" : options.filter, std::regex::ECMAScript);
  auto step = [&](const std::string& name, Verdict v, double seconds = 0) {
    report.checks.push_back({name, v.outcome, std::move(v.detail), seconds});
    return v.outcome == Outcome::kPass;
  };
  RawComm raw;
  LoadReport lr;
  const Status loaded = OpenRawComm(options.plugin_path, &raw, &lr);
  if (!loaded.ok()) {
    step("load", Fail(loaded.message()));
    return;
  }
  World w;
  w.api = raw.table;
  w.n = std::max<int32_t>(1, options.ranks);
  w.seed = options.seed;
  std::unique_ptr<FileKvStore> kv;
  if (options.process_rank >= 0) {
    w.self = options.process_rank;
    kv = std::make_unique<FileKvStore>(options.kv_dir);
    w.kv = kv.get();
  }
  report.plugin_name = w.api->name;
  report.plugin_version = w.api->version;
  step("load", Pass(std::string("ABI ") + std::to_string(w.api->abi_major) + "." +
                    std::to_string(w.api->abi_minor) + ", memory " +
                    (w.api->memory_kind == PC_COMM_MEMORY_HOST ? "host" : "device")));
  // A device-memory plugin is checked on devices of the plugin it names, found beside it: rank
  // r (threads) or this process's rank on device r.
  std::vector<RankDevice> devices;
  if (w.api->memory_kind == PC_COMM_MEMORY_DEVICE) {
    const std::string dir = std::filesystem::path(options.plugin_path).parent_path().string();
    const std::string path = (dir.empty() ? "." : dir) + "/libpolychip_backend_" +
                             std::string(w.api->device_plugin ? w.api->device_plugin : "") + ".so";
    auto backend = LoadBackendFromPath(path);
    auto open = [&]() -> Status {
      PC_RETURN_IF_ERROR(backend.status());
      PC_ASSIGN_OR_RETURN(int32_t count, (*backend)->DeviceCount());
      devices.resize(w.n);
      for (int32_t r = (w.self >= 0 ? w.self : 0); r < (w.self >= 0 ? w.self + 1 : w.n); ++r) {
        if (r >= count && w.self < 0) {
          return FailedPrecondition(std::to_string(w.n) + " ranks as threads need as many " +
                                    "devices; " + path + " has " + std::to_string(count));
        }
        PC_ASSIGN_OR_RETURN(devices[r].device, (*backend)->OpenDevice(r % count));
        PC_ASSIGN_OR_RETURN(devices[r].stream, devices[r].device->CreateStream());
      }
      return Status::Ok();
    };
    if (Status s = open(); !s.ok()) {
      step("device_plugin.open", Fail(s.ToString()));
      return;
    }
    step("device_plugin.open", Pass(path));
    w.backend = *backend;
    w.devices = &devices;
  }
  std::vector<pc_param_t> params;
  for (const auto& [k, v] : options.params) params.push_back({k.c_str(), v.c_str()});
  params.push_back({"conformance_unknown_key", "1"});
  const Status init =
      Take(w.api, w.api->initialize(params.data(), params.size()), "initialize");
  if (!step("lifetime.initialize", init.ok() ? Pass("unknown parameter ignored")
                                             : Fail(init.ToString()))) {
    return;
  }

  pc_comm_unique_id_t id{}, id2{};
  Status ids = Take(w.api, w.api->get_unique_id(&id), "get_unique_id");
  if (ids.ok()) ids = Take(w.api, w.api->get_unique_id(&id2), "get_unique_id");
  if (ids.ok() && std::memcmp(id.bytes, id2.bytes, sizeof(id.bytes)) == 0) {
    ids = FailedPrecondition("two calls returned the same id");
  }
  step("unique_id.distinct", ids.ok() ? Pass() : Fail(ids.ToString()));

  // Every rank joins on its own thread (or process).
  w.comms.assign(w.n, nullptr);
  if (w.self >= 0) {
    Status shared = w.self == 0 ? PublishId(w, "world", id) : ShareId(w, "world", &id);
    if (!shared.ok()) {
      step("comm.init_rank", Fail(shared.ToString()));
      w.api->shutdown();
      return;
    }
  }
  const auto start = Clock::now();
  Verdict created = RunRanks(
      w,
      [&](int32_t rank) -> Verdict {
        pc_comm_t* c = nullptr;
        PCC_COMM(w.api->comm_init_rank(&id, w.n, rank, 30000, &c), "comm_init_rank");
        int32_t r = -1, n = -1;
        w.comms[rank] = c;
        PCC_COMM(w.api->comm_rank(c, &r), "comm_rank");
        PCC_COMM(w.api->comm_size(c, &n), "comm_size");
        if (r != rank || n != w.n) return Fail("comm_rank/comm_size disagree with init");
        return Pass(std::to_string(w.n) + (w.self >= 0 ? " ranks (processes)" : " ranks (threads)"));
      },
      40);
  if (!step("comm.init_rank", created,
            std::chrono::duration<double>(Clock::now() - start).count())) {
    for (pc_comm_t* c : w.comms) {
      if (c != nullptr) (void)Take(w.api, w.api->comm_destroy(c), "comm_destroy");
    }
    w.api->shutdown();
    if (w.self >= 0) GatherVerdicts(w, options, report);
    return;
  }

  for (const CommCheck& c : AllCommChecks()) {
    if (!std::regex_search(c.name, filter)) continue;
    const auto t0 = Clock::now();
    Verdict v = c.run(w);
    step(c.name, v, std::chrono::duration<double>(Clock::now() - t0).count());
  }

  Status destroyed;
  for (pc_comm_t* c : w.comms) {
    if (c == nullptr) continue;  // another process's rank
    Status s = Take(w.api, w.api->comm_destroy(c), "comm_destroy");
    if (destroyed.ok()) destroyed = s;
  }
  step("comm.destroy", destroyed.ok() ? Pass() : Fail(destroyed.ToString()));
  w.api->shutdown();
  if (w.self >= 0) GatherVerdicts(w, options, report);
}

}  // namespace polychip::runtime::conformance
