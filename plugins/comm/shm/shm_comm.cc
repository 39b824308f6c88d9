// The shm comm plugin: collectives between the ranks of one host (processes, or threads of one
// process) through a POSIX shared-memory segment.
//
// Segment layout (one per communicator, named from the unique id; a sub-communicator made by
// comm_split gets its own segment named after its parent's):
//
//   Header | RankCtrl[n] | PairCell[n * n] | slot[n] (slot_bytes each)
//
// Every rank owns one slot; a collective is cut into chunks that fit a slot. Ranks meet at
// "sync points": each rank counts the sync points it passed in its RankCtrl::sync, and waits
// for the peers it depends on to reach the same count. Every rank of a communicator issues the
// same sequence of collectives, so the counts line up without any other bookkeeping. A rank
// never rewrites its slot before every reader of the previous chunk has passed the sync point
// that follows the reading.
//
// Reductions run in rank order on every rank (F16/BF16 accumulate in F32 and round once), so
// all ranks get bit-identical results: tensor-parallel ranks stay in lockstep.
//
// Point-to-point: the sender copies a chunk into its own slot and posts a sequence number in
// the (sender, receiver) PairCell; the receiver copies it out and acknowledges. send therefore
// returns once the receiver has the data (rendezvous); group_start/group_end are absent.
//
// Failure handling: while waiting for a peer, the waiter checks (every few ms) that the peer's
// process is alive (kill(pid, 0), and not a zombie), that it did not leave or abort, and the
// optional per-operation timeout. Creation waits at most timeout_ms for every rank to attach,
// then fails with UNAVAILABLE naming the missing ranks. The segment's name is unlinked as soon
// as every rank attached (or creation failed), so nothing is left in /dev/shm.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "polychip/plugin/pc_comm.h"
#include "polychip/sdk/comm_util.h"
#include "polychip/sdk/plugin_util.h"

using polychip::sdk::ElementSize;
using polychip::sdk::Guard;
using polychip::sdk::MakeError;
using polychip::sdk::Reduce;

namespace {

constexpr uint64_t kMagic = 0x31304d4853435050ull;  // "PPCSHM01"
constexpr char kIdPrefix[] = "pcshm1:";
constexpr int32_t kMaxRanks = 256;
using Clock = std::chrono::steady_clock;

struct Settings {
  std::string protocol = "scatter";  // "flat" or "scatter" (see AllReduce)
  uint64_t buffer_bytes = 4u << 20;  // per-rank slot
  int64_t timeout_ms = 30000;        // communicator creation
  int64_t op_timeout_ms = 0;         // 0: a collective waits for a live peer as long as it takes
};
Settings g_settings;
const pc_host_services_t* g_host = nullptr;
std::atomic<uint64_t> g_id_counter{0};

void Log(pc_log_level_t level, const std::string& msg) {
  if (g_host != nullptr && g_host->log != nullptr) {
    g_host->log(g_host->host_ctx, level, "shm", msg.c_str());
  }
}

// ---- shared layout ------------------------------------------------------------------------

enum RankState : uint32_t { kFree = 0, kActive = 1, kLeft = 2, kAborted = 3 };

struct alignas(64) Header {
  std::atomic<uint64_t> magic;  // written last by the creator
  uint64_t total_bytes;
  uint64_t slot_bytes;
  int32_t n_ranks;
  // Ranks attached so far; set to kClosed by a rank that gave up waiting, which makes a late
  // arrival fail instead of joining a communicator that its peers abandoned.
  std::atomic<int32_t> arrived;
  std::atomic<int32_t> aborted_by;  // rank + 1 of a rank that called comm_abort, else 0
  std::atomic<int32_t> dead_rank;   // rank + 1 of a rank found dead, else 0
};
constexpr int32_t kClosed = -(1 << 30);

struct alignas(64) RankCtrl {
  std::atomic<uint32_t> state;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> sync;  // sync points passed
  std::atomic<int32_t> split_color;
  std::atomic<int32_t> split_key;
};

struct alignas(64) PairCell {   // sender -> receiver
  std::atomic<uint64_t> posted;  // sequence number of the chunk in the sender's slot
  std::atomic<uint64_t> acked;   // last sequence number the receiver copied out
  std::atomic<uint64_t> bytes;   // size of the posted chunk
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");
static_assert(std::atomic<int32_t>::is_always_lock_free, "shared atomics must be lock-free");

struct Layout {
  uint64_t ctrl = 0, pairs = 0, slots = 0, slot_bytes = 0, total = 0;
  Layout(int32_t n, uint64_t slot) {
    slot_bytes = (slot + 63) / 64 * 64;
    ctrl = sizeof(Header);
    pairs = ctrl + sizeof(RankCtrl) * n;
    slots = (pairs + sizeof(PairCell) * n * n + 4095) / 4096 * 4096;
    total = slots + slot_bytes * n;
  }
};

}  // namespace

struct pc_comm {
  std::string name;  // shm name of this communicator's segment
  int32_t n = 0, rank = 0;
  uint8_t* base = nullptr;
  size_t mapped = 0;
  Header* hdr = nullptr;
  RankCtrl* ctrl = nullptr;
  PairCell* pairs = nullptr;
  uint64_t slot_bytes = 0;
  uint64_t sync = 0;            // this rank's count of sync points (mirrors ctrl[rank].sync)
  std::vector<uint64_t> sent;   // per peer: chunks sent
  std::vector<uint64_t> recvd;  // per peer: chunks received
  uint32_t split_seq = 0;
  std::string protocol;
  int64_t op_timeout_ms = 0;
  std::atomic<bool> aborted{false};

  uint8_t* slot(int32_t r) const {
    return base + Layout(n, slot_bytes).slots + slot_bytes * static_cast<uint64_t>(r);
  }
};

namespace {

// ---- liveness and waiting -----------------------------------------------------------------

// False when the process is gone or a zombie (a killed child of a rank that is itself blocked
// in a collective stays a zombie until reaped, and kill(pid, 0) still succeeds on it).
bool PidAlive(int32_t pid) {
  if (pid <= 0 || pid == getpid()) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;  // no /proc: trust kill()
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return true;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

std::string PeerName(const pc_comm* c, int32_t peer) {
  return "rank " + std::to_string(peer) + " (pid " + std::to_string(c->ctrl[peer].pid.load()) +
         ")";
}

// Checks everything that makes waiting for `peer` pointless. NULL: keep waiting.
pc_error_t* CheckPeer(pc_comm* c, int32_t peer, const char* what, Clock::time_point start) {
  if (c->aborted.load(std::memory_order_relaxed)) {
    return MakeError(PC_CODE_CANCELLED, "communicator aborted");
  }
  if (const int32_t a = c->hdr->aborted_by.load(); a != 0) {
    return MakeError(PC_CODE_UNAVAILABLE, "rank " +
                                              std::to_string(a - 1) + " aborted the communicator");
  }
  if (const int32_t d = c->hdr->dead_rank.load(); d != 0) {
    return MakeError(PC_CODE_UNAVAILABLE, std::string() + PeerName(c, d - 1) +
                                              " died");
  }
  const uint32_t state = c->ctrl[peer].state.load();
  if (state == kLeft) {
    return MakeError(PC_CODE_UNAVAILABLE, std::string() + PeerName(c, peer) +
                                              " left the communicator");
  }
  if (!PidAlive(c->ctrl[peer].pid.load())) {
    int32_t expected = 0;
    c->hdr->dead_rank.compare_exchange_strong(expected, peer + 1);  // tell the other ranks
    return MakeError(PC_CODE_UNAVAILABLE,
                     std::string() + PeerName(c, peer) + " died");
  }
  if (c->op_timeout_ms > 0 && Clock::now() - start > std::chrono::milliseconds(c->op_timeout_ms)) {
    return MakeError(PC_CODE_UNAVAILABLE, std::string() + PeerName(c, peer) +
                                              " did not respond within " +
                                              std::to_string(c->op_timeout_ms) + " ms");
  }
  return nullptr;
}

// Spins briefly (a peer on another core answers within microseconds), then yields, then sleeps
// (two ranks on one core must not starve each other). Checks the peer every ~5 ms.
template <typename Ready>
pc_error_t* WaitFor(pc_comm* c, int32_t peer, const char* what, Ready ready) {
  if (ready()) return nullptr;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_check = start;
  for (uint64_t i = 0;; ++i) {
    if (ready()) return nullptr;
    if (i < 64) {
      __builtin_ia32_pause();
      continue;
    }
    if (i < 2000) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if ((i & 31) == 0 && Clock::now() >= next_check) {
      if (pc_error_t* e = CheckPeer(c, peer, what, start)) {
        if (!ready()) return e;
        polychip::sdk::ErrorDestroy(e);  // the peer arrived just before it left: no error
        return nullptr;
      }
      next_check = Clock::now() + std::chrono::milliseconds(5);
    }
  }
}

uint64_t Arrive(pc_comm* c) {
  c->ctrl[c->rank].sync.store(++c->sync, std::memory_order_release);
  return c->sync;
}

pc_error_t* WaitPeer(pc_comm* c, int32_t peer, uint64_t target, const char* what) {
  return WaitFor(c, peer, what, [&] {
    return c->ctrl[peer].sync.load(std::memory_order_acquire) >= target;
  });
}

pc_error_t* WaitAll(pc_comm* c, uint64_t target, const char* what) {
  for (int32_t p = 0; p < c->n; ++p) {
    if (p == c->rank) continue;
    if (pc_error_t* e = WaitPeer(c, p, target, what)) return e;
  }
  return nullptr;
}

pc_error_t* Sync(pc_comm* c, const char* what) { return WaitAll(c, Arrive(c), what); }

// ---- argument checks ----------------------------------------------------------------------

pc_error_t* CheckCall(const pc_comm* c, pc_dtype_t dtype, const char* what, size_t* esz) {
  if (c == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": comm is NULL");
  *esz = ElementSize(dtype);
  if (*esz == 0) {
    return MakeError(PC_CODE_INVALID_ARGUMENT,
                     std::string(what) + ": dtype " + std::to_string(dtype) +
                         " is not an element type (quantized blocks cannot be reduced)");
  }
  if (c->aborted.load()) {
    return MakeError(PC_CODE_CANCELLED, "communicator aborted");
  }
  return nullptr;
}

bool ValidOp(pc_reduce_op_t op) { return op >= PC_REDUCE_SUM && op <= PC_REDUCE_PROD; }

// ---- creation -----------------------------------------------------------------------------

pc_error_t* SysError(const std::string& what) {
  return MakeError(errno == ENOMEM || errno == ENOSPC ? PC_CODE_RESOURCE_EXHAUSTED
                                                      : PC_CODE_UNAVAILABLE,
                   "" + what + ": " + std::strerror(errno));
}

void Unmap(pc_comm* c) {
  if (c->base != nullptr) munmap(c->base, c->mapped);
  c->base = nullptr;
}

// Creates the segment (the first rank to arrive) or attaches to it (every other rank), then
// waits until all n ranks attached or the deadline passes.
pc_error_t* InitRank(const std::string& name, int32_t n, int32_t rank, int64_t timeout_ms,
                     pc_comm** out) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto late = [&] { return Clock::now() >= deadline; };
  auto c = std::make_unique<pc_comm>();
  c->name = name;
  c->n = n;
  c->rank = rank;
  c->protocol = g_settings.protocol;
  c->op_timeout_ms = g_settings.op_timeout_ms;

  while (c->base == nullptr) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {  // the creator lays the segment out
      const Layout L(n, g_settings.buffer_bytes);
      if (ftruncate(fd, static_cast<off_t>(L.total)) != 0) {
        pc_error_t* e = SysError("cannot size segment " + name);
        close(fd);
        shm_unlink(name.c_str());
        return e;
      }
      void* p = mmap(nullptr, L.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        pc_error_t* e = SysError("cannot map segment " + name);
        shm_unlink(name.c_str());
        return e;
      }
      c->base = static_cast<uint8_t*>(p);
      c->mapped = L.total;
      // ftruncate zero-filled the segment, which is every atomic's initial state.
      c->hdr = reinterpret_cast<Header*>(c->base);
      c->hdr->total_bytes = L.total;
      c->hdr->slot_bytes = L.slot_bytes;
      c->hdr->n_ranks = n;
      c->hdr->magic.store(kMagic, std::memory_order_release);
      break;
    }
    if (errno != EEXIST) return SysError("cannot create segment " + name);
    fd = shm_open(name.c_str(), O_RDWR, 0600);
    struct stat st{};
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(Header)) {
      void* p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) return SysError("cannot map segment " + name);
      auto* hdr = static_cast<Header*>(p);
      while (hdr->magic.load(std::memory_order_acquire) != kMagic && !late()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (hdr->magic.load(std::memory_order_acquire) == kMagic) {
        if (hdr->n_ranks != n || hdr->total_bytes != static_cast<uint64_t>(st.st_size)) {
          const int32_t theirs = hdr->n_ranks;
          munmap(p, st.st_size);
          return MakeError(PC_CODE_INVALID_ARGUMENT,
                           "communicator " + name + " was created for " +
                               std::to_string(theirs) + " ranks, this rank asked for " +
                               std::to_string(n));
        }
        c->base = static_cast<uint8_t*>(p);
        c->mapped = st.st_size;
        c->hdr = hdr;
        break;
      }
      munmap(p, st.st_size);
    } else if (fd >= 0) {
      close(fd);  // the creator has not sized it yet
    }
    if (late()) {
      return MakeError(PC_CODE_UNAVAILABLE,
                       "communicator " + name + " could not be attached within " +
                           std::to_string(timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }

  c->slot_bytes = c->hdr->slot_bytes;
  const Layout L(n, c->slot_bytes);
  c->ctrl = reinterpret_cast<RankCtrl*>(c->base + L.ctrl);
  c->pairs = reinterpret_cast<PairCell*>(c->base + L.pairs);
  c->sent.assign(n, 0);
  c->recvd.assign(n, 0);

  uint32_t free_state = kFree;
  if (!c->ctrl[rank].state.compare_exchange_strong(free_state, kActive)) {
    Unmap(c.get());
    return MakeError(PC_CODE_INVALID_ARGUMENT, "rank " + std::to_string(rank) +
                                                   " joined communicator " + name + " twice");
  }
  c->ctrl[rank].pid.store(getpid());
  auto missing = [&] {
    std::string list;
    for (int32_t r = 0; r < n; ++r) {
      if (c->ctrl[r].state.load() == kFree) list += (list.empty() ? "" : ", ") + std::to_string(r);
    }
    return list;
  };
  if (c->hdr->arrived.fetch_add(1) < 0) {
    Unmap(c.get());
    return MakeError(PC_CODE_UNAVAILABLE, "communicator " + name +
                                              " creation was abandoned by its other ranks "
                                              "(timeout) before rank " +
                                              std::to_string(rank) + " arrived");
  }
  for (uint64_t i = 0;; ++i) {
    const int32_t a = c->hdr->arrived.load();
    if (a == n) break;
    if (a < 0) {
      const std::string list = missing();
      Unmap(c.get());
      return MakeError(PC_CODE_UNAVAILABLE,
                       "communicator creation timed out (another rank gave up after " +
                           std::to_string(timeout_ms) + " ms); missing rank(s): " + list);
    }
    if (late()) {
      int32_t seen = a;
      // Close the door atomically: either everyone made it after all, or nobody joins later.
      while (seen >= 0 && seen < n && !c->hdr->arrived.compare_exchange_weak(seen, kClosed)) {
      }
      if (seen == n) break;
      const std::string list = missing();
      shm_unlink(name.c_str());
      Unmap(c.get());
      return MakeError(PC_CODE_UNAVAILABLE,
                       "communicator creation timed out after " + std::to_string(timeout_ms) +
                           " ms: " + std::to_string(std::max(seen, 0)) + " of " +
                           std::to_string(n) + " ranks arrived; missing rank(s): " + list);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(i < 100 ? 50 : 1000));
  }
  // Everyone is attached: the name is no longer needed.
  if (rank == 0) shm_unlink(name.c_str());
  *out = c.release();
  return nullptr;
}

// ---- the table's members ------------------------------------------------------------------

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  return Guard([&]() -> pc_error_t* {
    Settings s;
    for (size_t i = 0; i < n_params; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      const char* value = params[i].value ? params[i].value : "";
      long long v = 0;
      if (key == "protocol") {
        if (std::strcmp(value, "flat") != 0 && std::strcmp(value, "scatter") != 0) {
          return MakeError(PC_CODE_INVALID_ARGUMENT, std::string("protocol '") + value +
                                                         "' unknown (flat, scatter)");
        }
        s.protocol = value;
      } else if (key == "buffer_bytes") {
        if (!polychip::sdk::ParseInt(value, &v) || v < 4096 || v > (1ll << 30)) {
          return MakeError(PC_CODE_INVALID_ARGUMENT,
                           std::string("buffer_bytes '") + value + "' not in [4096, 1 GiB]");
        }
        s.buffer_bytes = static_cast<uint64_t>(v);
      } else if (key == "timeout_ms" || key == "op_timeout_ms") {
        if (!polychip::sdk::ParseInt(value, &v)) {
          return MakeError(PC_CODE_INVALID_ARGUMENT,
                           "" + key + " '" + value + "' is not a non-negative integer");
        }
        (key == "timeout_ms" ? s.timeout_ms : s.op_timeout_ms) = v;
      } else {
        Log(PC_LOG_WARNING, "ignoring unknown parameter '" + key + "'");
      }
    }
    g_settings = s;
    Log(PC_LOG_INFO, "protocol " + s.protocol + ", buffer_bytes " +
                         std::to_string(s.buffer_bytes) + ", timeout_ms " +
                         std::to_string(s.timeout_ms) + ", op_timeout_ms " +
                         std::to_string(s.op_timeout_ms));
    return nullptr;
  });
}

void Shutdown() {}

pc_error_t* GetUniqueId(pc_comm_unique_id_t* id) {
  return Guard([&]() -> pc_error_t* {
    if (id == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "get_unique_id: id is NULL");
    std::random_device rd;
    const uint64_t t = Clock::now().time_since_epoch().count();
    std::memset(id->bytes, 0, sizeof(id->bytes));
    std::snprintf(id->bytes, sizeof(id->bytes), "%s/pcshm-%d-%llx-%08x-%llu", kIdPrefix, getpid(),
                  static_cast<unsigned long long>(t), rd(),
                  static_cast<unsigned long long>(g_id_counter.fetch_add(1)));
    return nullptr;
  });
}

pc_error_t* CommInitRank(const pc_comm_unique_id_t* id, int32_t n_ranks, int32_t rank,
                         int64_t timeout_ms, pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (id == nullptr || out == nullptr) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_init_rank: id or out is NULL");
    }
    *out = nullptr;
    const std::string text(id->bytes, strnlen(id->bytes, sizeof(id->bytes)));
    if (text.rfind(kIdPrefix, 0) != 0) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_init_rank: not an shm unique id");
    }
    if (n_ranks < 1 || n_ranks > kMaxRanks || rank < 0 || rank >= n_ranks) {
      return MakeError(PC_CODE_INVALID_ARGUMENT,
                       "comm_init_rank: rank " + std::to_string(rank) + " of " +
                           std::to_string(n_ranks) + " (1 to " + std::to_string(kMaxRanks) +
                           " ranks)");
    }
    if (timeout_ms <= 0) timeout_ms = g_settings.timeout_ms;
    return InitRank(text.substr(std::strlen(kIdPrefix)), n_ranks, rank, timeout_ms, out);
  });
}

pc_error_t* CommSplit(pc_comm_t* c, int32_t color, int32_t key, pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, PC_DTYPE_I8, "comm_split", &esz)) return e;
    if (out == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_split: out is NULL");
    *out = nullptr;
    c->ctrl[c->rank].split_color.store(color);
    c->ctrl[c->rank].split_key.store(key);
    if (pc_error_t* e = Sync(c, "comm_split")) return e;
    std::vector<std::pair<int32_t, int32_t>> members;  // (key, parent rank)
    for (int32_t r = 0; r < c->n; ++r) {
      if (c->ctrl[r].split_color.load() == color) members.push_back({c->ctrl[r].split_key.load(), r});
    }
    // Nobody rewrites split_color before every rank has read them all.
    if (pc_error_t* e = Sync(c, "comm_split")) return e;
    const uint32_t seq = c->split_seq++;
    if (color < 0) return nullptr;
    std::sort(members.begin(), members.end());
    int32_t sub_rank = 0;
    while (members[sub_rank].second != c->rank) ++sub_rank;
    const std::string name = c->name + "." + std::to_string(seq) + "." + std::to_string(color);
    if (name.size() > 250) {
      return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "comm_split: sub-communicators nested too deep");
    }
    return InitRank(name, static_cast<int32_t>(members.size()), sub_rank, g_settings.timeout_ms,
                    out);
  });
}

pc_error_t* CommDestroy(pc_comm_t* c) {
  return Guard([&]() -> pc_error_t* {
    if (c == nullptr) return nullptr;
    uint32_t active = kActive;
    c->ctrl[c->rank].state.compare_exchange_strong(active, kLeft);
    Unmap(c);
    delete c;
    return nullptr;
  });
}

void CommAbort(pc_comm_t* c) {
  if (c == nullptr) return;
  c->aborted.store(true);
  int32_t none = 0;
  c->hdr->aborted_by.compare_exchange_strong(none, c->rank + 1);
  c->ctrl[c->rank].state.store(kAborted);
}

pc_error_t* CommRank(const pc_comm_t* c, int32_t* rank) {
  if (c == nullptr || rank == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_rank: NULL");
  *rank = c->rank;
  return nullptr;
}

pc_error_t* CommSize(const pc_comm_t* c, int32_t* n) {
  if (c == nullptr || n == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_size: NULL");
  *n = c->n;
  return nullptr;
}

// ---- collectives --------------------------------------------------------------------------

// "flat": after every rank copied its chunk in, each rank reduces the whole chunk from all
// slots. "scatter": rank r reduces only the r-th part of the chunk (in place, in its own slot),
// then every rank gathers the parts: n times less arithmetic per rank, one more sync point.
pc_error_t* AllReduce(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      pc_reduce_op_t op, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "all_reduce", &esz)) return e;
    if (!ValidOp(op)) return MakeError(PC_CODE_INVALID_ARGUMENT, "all_reduce: unknown op");
    if (count > 0 && (send == nullptr || recv == nullptr)) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "all_reduce: NULL buffer");
    }
    if (c->n == 1) {
      if (send != recv && count > 0) std::memmove(recv, send, count * esz);
      return nullptr;
    }
    const auto* in = static_cast<const uint8_t*>(send);
    auto* outp = static_cast<uint8_t*>(recv);
    const uint64_t per_chunk = c->slot_bytes / esz;
    const bool scatter = c->protocol == "scatter";
    std::vector<const uint8_t*> srcs(c->n);
    for (uint64_t off = 0; off < count; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, count - off);
      std::memcpy(c->slot(c->rank), in + off * esz, len * esz);
      if (pc_error_t* e = Sync(c, "all_reduce")) return e;
      if (!scatter) {
        for (int32_t r = 0; r < c->n; ++r) srcs[r] = c->slot(r);
        Reduce(dtype, op, srcs.data(), c->n, outp + off * esz, len);
      } else {
        const uint64_t part = (len + c->n - 1) / c->n;
        const uint64_t lo = std::min(len, part * c->rank);
        const uint64_t hi = std::min(len, lo + part);
        for (int32_t r = 0; r < c->n; ++r) srcs[r] = c->slot(r) + lo * esz;
        Reduce(dtype, op, srcs.data(), c->n, c->slot(c->rank) + lo * esz, hi - lo);
        if (pc_error_t* e = Sync(c, "all_reduce")) return e;
        for (int32_t r = 0; r < c->n; ++r) {
          const uint64_t rlo = std::min(len, part * r), rhi = std::min(len, rlo + part);
          std::memcpy(outp + (off + rlo) * esz, c->slot(r) + rlo * esz, (rhi - rlo) * esz);
        }
      }
      if (pc_error_t* e = Sync(c, "all_reduce")) return e;
    }
    return nullptr;
  });
}

pc_error_t* AllGather(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "all_gather", &esz)) return e;
    if (count > 0 && (send == nullptr || recv == nullptr)) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "all_gather: NULL buffer");
    }
    const auto* in = static_cast<const uint8_t*>(send);
    auto* outp = static_cast<uint8_t*>(recv);
    const uint64_t per_chunk = c->slot_bytes / esz;
    for (uint64_t off = 0; off < count; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, count - off);
      std::memcpy(c->slot(c->rank), in + off * esz, len * esz);
      if (pc_error_t* e = Sync(c, "all_gather")) return e;
      for (int32_t r = 0; r < c->n; ++r) {
        std::memmove(outp + (r * count + off) * esz, c->slot(r), len * esz);
      }
      if (pc_error_t* e = Sync(c, "all_gather")) return e;
    }
    return nullptr;
  });
}

pc_error_t* ReduceScatter(pc_comm_t* c, const void* send, void* recv, uint64_t recv_count,
                          pc_dtype_t dtype, pc_reduce_op_t op, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "reduce_scatter", &esz)) return e;
    if (!ValidOp(op)) return MakeError(PC_CODE_INVALID_ARGUMENT, "reduce_scatter: unknown op");
    if (recv_count > 0 && (send == nullptr || recv == nullptr)) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "reduce_scatter: NULL buffer");
    }
    const auto* in = static_cast<const uint8_t*>(send);
    auto* outp = static_cast<uint8_t*>(recv);
    // A slot holds one piece of the chunk for every destination rank.
    const uint64_t per_chunk = std::max<uint64_t>(1, c->slot_bytes / (esz * c->n));
    std::vector<const uint8_t*> srcs(c->n);
    for (uint64_t off = 0; off < recv_count; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, recv_count - off);
      for (int32_t p = 0; p < c->n; ++p) {
        std::memcpy(c->slot(c->rank) + p * len * esz, in + (p * recv_count + off) * esz,
                    len * esz);
      }
      if (pc_error_t* e = Sync(c, "reduce_scatter")) return e;
      for (int32_t r = 0; r < c->n; ++r) srcs[r] = c->slot(r) + c->rank * len * esz;
      Reduce(dtype, op, srcs.data(), c->n, outp + off * esz, len);
      if (pc_error_t* e = Sync(c, "reduce_scatter")) return e;
    }
    return nullptr;
  });
}

// Two sync points per chunk: the root's "written" and everyone's "read". Only the root waits for
// the second one (it alone rewrites its slot); the others leave as soon as they have the data.
pc_error_t* Broadcast(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      int32_t root, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "broadcast", &esz)) return e;
    if (root < 0 || root >= c->n) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "broadcast: root " + std::to_string(root) +
                                                     " out of range");
    }
    const bool is_root = c->rank == root;
    if (count > 0 && (recv == nullptr || (is_root && send == nullptr))) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "broadcast: NULL buffer");
    }
    const auto* in = static_cast<const uint8_t*>(send);
    auto* outp = static_cast<uint8_t*>(recv);
    const uint64_t per_chunk = c->slot_bytes / esz;
    for (uint64_t off = 0; off < count; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, count - off);
      if (is_root) {
        std::memcpy(c->slot(root), in + off * esz, len * esz);
        Arrive(c);
        if (in != outp) std::memmove(outp + off * esz, in + off * esz, len * esz);
        if (pc_error_t* e = WaitAll(c, Arrive(c), "broadcast")) return e;
      } else {
        if (pc_error_t* e = WaitPeer(c, root, Arrive(c), "broadcast")) return e;
        std::memcpy(outp + off * esz, c->slot(root), len * esz);
        Arrive(c);
      }
    }
    return nullptr;
  });
}

pc_error_t* CheckPeerArg(const pc_comm_t* c, int32_t peer, const char* what) {
  if (peer < 0 || peer >= c->n || peer == c->rank) {
    return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": peer " +
                                                   std::to_string(peer) + " invalid for rank " +
                                                   std::to_string(c->rank) + " of " +
                                                   std::to_string(c->n));
  }
  return nullptr;
}

pc_error_t* Send(pc_comm_t* c, const void* buf, uint64_t count, pc_dtype_t dtype, int32_t peer,
                 void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "send", &esz)) return e;
    if (pc_error_t* e = CheckPeerArg(c, peer, "send")) return e;
    const auto* in = static_cast<const uint8_t*>(buf);
    PairCell& cell = c->pairs[c->rank * c->n + peer];
    const uint64_t per_chunk = c->slot_bytes / esz;
    for (uint64_t off = 0; off < count || off == 0; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, count - off);
      if (len > 0) std::memcpy(c->slot(c->rank), in + off * esz, len * esz);
      const uint64_t seq = ++c->sent[peer];
      cell.bytes.store(len * esz, std::memory_order_relaxed);
      cell.posted.store(seq, std::memory_order_release);
      if (pc_error_t* e = WaitFor(c, peer, "send", [&] {
            return cell.acked.load(std::memory_order_acquire) >= seq;
          })) {
        return e;
      }
      if (count == 0) break;
    }
    return nullptr;
  });
}

pc_error_t* Recv(pc_comm_t* c, void* buf, uint64_t count, pc_dtype_t dtype, int32_t peer, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, dtype, "recv", &esz)) return e;
    if (pc_error_t* e = CheckPeerArg(c, peer, "recv")) return e;
    auto* outp = static_cast<uint8_t*>(buf);
    PairCell& cell = c->pairs[peer * c->n + c->rank];
    const uint64_t per_chunk = c->slot_bytes / esz;
    for (uint64_t off = 0; off < count || off == 0; off += per_chunk) {
      const uint64_t len = std::min(per_chunk, count - off);
      const uint64_t seq = ++c->recvd[peer];
      if (pc_error_t* e = WaitFor(c, peer, "recv", [&] {
            return cell.posted.load(std::memory_order_acquire) >= seq;
          })) {
        return e;
      }
      const uint64_t got = cell.bytes.load(std::memory_order_relaxed);
      if (got == len * esz && len > 0) std::memcpy(outp + off * esz, c->slot(peer), got);
      cell.acked.store(seq, std::memory_order_release);  // release the sender even on mismatch
      if (got != len * esz) {
        return MakeError(PC_CODE_INVALID_ARGUMENT,
                         "recv: rank " + std::to_string(peer) + " sent a chunk of " +
                             std::to_string(got) + " bytes, " + std::to_string(len * esz) +
                             " expected (send and recv counts differ)");
      }
      if (count == 0) break;
    }
    return nullptr;
  });
}

// One communicator is one segment of Layout(n, buffer_bytes), mapped by every rank of the host.
pc_error_t* BufferBytes(int32_t n_ranks, uint64_t* bytes) {
  if (n_ranks < 1 || bytes == nullptr) {
    return MakeError(PC_CODE_INVALID_ARGUMENT, "comm_buffer_bytes: n_ranks < 1 or bytes NULL");
  }
  *bytes = Layout(n_ranks, g_settings.buffer_bytes).total;
  return nullptr;
}

pc_error_t* Barrier(pc_comm_t* c, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = CheckCall(c, PC_DTYPE_I8, "barrier", &esz)) return e;
    return Sync(c, "barrier");
  });
}

const pc_comm_iface_t kApi = [] {
  pc_comm_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "shm";
  t.version = "0.1.0";
  t.memory_kind = PC_COMM_MEMORY_HOST;
  t.device_plugin = nullptr;
  t.error_code = polychip::sdk::ErrorCode;
  t.error_message = polychip::sdk::ErrorMessage;
  t.error_destroy = polychip::sdk::ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.get_unique_id = GetUniqueId;
  t.comm_init_rank = CommInitRank;
  t.comm_split = CommSplit;
  t.comm_destroy = CommDestroy;
  t.comm_abort = CommAbort;
  t.comm_rank = CommRank;
  t.comm_size = CommSize;
  t.all_reduce = AllReduce;
  t.all_gather = AllGather;
  t.reduce_scatter = ReduceScatter;
  t.broadcast = Broadcast;
  t.send = Send;
  t.recv = Recv;
  t.barrier = Barrier;
  t.group_start = nullptr;  // sends are rendezvous; fusing them is not offered
  t.group_end = nullptr;
  t.comm_buffer_bytes = BufferBytes;
  t.reach = PC_COMM_REACH_ONE_HOST;  // a shared-memory segment of one host
  return t;
}();

}  // namespace

extern "C" {

PC_EXPORT void pc_comm_probe(pc_probe_result_t* result) {
  if (result == nullptr) return;
  const bool ok = access("/dev/shm", W_OK) == 0;
  result->score = ok ? 10 : 0;
  std::snprintf(result->reason, sizeof(result->reason), "%s",
                ok ? "POSIX shared memory, ranks on this host" : "/dev/shm is not writable");
}

PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t host_abi_major, uint32_t,
                                                 const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;
  g_host = host;
  return &kApi;
}

}  // extern "C"
