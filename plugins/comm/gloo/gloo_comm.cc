// The gloo comm plugin: the comm table over Gloo's TCP transport, for ranks on several hosts
// launched without mpirun (`--nnodes`). Host memory only.
//
// Bootstrap: the unique id only names the communicator; comm_init_rank runs Gloo's full-mesh
// rendezvous through the host's KV services (every rank publishes its listening address under
// "<id>/<rank>" and reads the others'), so it needs no store of its own: node 0's TCP store
// carries it. comm_split makes a new full mesh among the members (colors and keys exchanged by
// an all-gather on the parent), on the parent's device.
//
// The address a rank listens on: param `hostname` (an address of this host), else param
// `iface` / env GLOO_SOCKET_IFNAME (an interface), else POLYCHIP_DIST_LOCAL_ADDR (set by the
// framework to the local address of its connection to node 0's store: an address the other
// hosts can reach), else 127.0.0.1.
//
// Failure: a peer that dies closes its sockets, so the operations waiting on it fail at once
// (UNAVAILABLE, with the peer's address); a peer that hangs fails them after op_timeout_ms.
// comm_abort makes later operations fail; one already waiting runs until it fails or times out.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "polychip/plugin/pc_comm.h"
#include "polychip/sdk/comm_util.h"
#include "polychip/sdk/plugin_util.h"

using polychip::sdk::ElementSize;
using polychip::sdk::MakeError;

namespace {

constexpr char kIdPrefix[] = "pcgloo1:";
constexpr uint64_t kP2pSlot = 0x7f000000ull;  // apart from the collectives' tags

struct Settings {
  std::string hostname, iface;
  int64_t timeout_ms = 30000;      // communicator creation
  int64_t op_timeout_ms = 600000;  // one operation (a dead peer fails it at once anyway)
};
Settings g_settings;
const pc_host_services_t* g_host = nullptr;
std::atomic<uint64_t> g_ids{0};

void Log(pc_log_level_t level, const std::string& msg) {
  if (g_host != nullptr && g_host->log != nullptr) {
    g_host->log(g_host->host_ctx, level, "gloo", msg.c_str());
  }
}

// Gloo's rendezvous store over the host KV services.
class HostStore : public gloo::rendezvous::Store {
 public:
  explicit HostStore(int64_t timeout_ms) : timeout_ms_(timeout_ms) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    const pc_code_t rc = g_host->kv_set(g_host->host_ctx, key.c_str(), data.data(), data.size());
    if (rc != PC_CODE_OK) GLOO_THROW_IO_EXCEPTION("host kv_set failed for ", key);
  }
  std::vector<char> get(const std::string& key) override {
    size_t size = 0;
    pc_code_t rc = g_host->kv_get(g_host->host_ctx, key.c_str(), nullptr, 0, &size, timeout_ms_);
    std::vector<char> value;
    if (rc == PC_CODE_RESOURCE_EXHAUSTED) {
      value.resize(size);
      rc = g_host->kv_get(g_host->host_ctx, key.c_str(), value.data(), value.size(), &size,
                          timeout_ms_);
    }
    if (rc != PC_CODE_OK) {
      GLOO_THROW_IO_EXCEPTION("a rank did not publish its address ('", key, "') within ",
                              timeout_ms_, " ms");
    }
    return value;
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) get(k);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);
  }

 private:
  int64_t timeout_ms_;
};

}  // namespace

struct pc_comm {
  std::string id;  // names the rendezvous keys
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  int32_t rank = 0, n = 1;
  uint32_t tag = 1;     // the next collective's tag: every rank issues the same sequence
  uint32_t splits = 0;  // comm_split calls so far (names the children)
  std::atomic<bool> aborted{false};
};

namespace {

// Gloo reports failures by exceptions: a closed or timed-out peer (IoException) is UNAVAILABLE.
template <typename F>
pc_error_t* Run(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const gloo::IoException& e) {
    return MakeError(PC_CODE_UNAVAILABLE, std::string(what) + ": " + e.what());
  } catch (const gloo::Exception& e) {
    return MakeError(PC_CODE_INTERNAL, std::string(what) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return MakeError(PC_CODE_RESOURCE_EXHAUSTED, "out of host memory");
  } catch (const std::exception& e) {
    return MakeError(PC_CODE_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return MakeError(PC_CODE_INTERNAL, std::string(what) + ": unknown exception");
  }
}

pc_error_t* Check(const pc_comm* c, pc_dtype_t t, const char* what, size_t* esz) {
  if (c == nullptr)
    return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": comm is NULL");
  if (c->aborted.load()) return MakeError(PC_CODE_CANCELLED, "communicator aborted");
  *esz = ElementSize(t);
  if (*esz == 0) {
    return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": not an element type");
  }
  return nullptr;
}

std::shared_ptr<gloo::transport::Device> MakeDevice() {
  gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  const char* local = std::getenv("POLYCHIP_DIST_LOCAL_ADDR");
  if (!g_settings.hostname.empty()) {
    attr.hostname = g_settings.hostname;
  } else if (!g_settings.iface.empty() || (ifname != nullptr && *ifname != '\0')) {
    attr.iface = !g_settings.iface.empty() ? g_settings.iface : ifname;
  } else if (local != nullptr && *local != '\0') {
    attr.hostname = local;
  } else {
    attr.hostname = "127.0.0.1";
  }
  attr.ai_family = AF_INET;
  return gloo::transport::tcp::CreateDevice(attr);
}

// A full mesh among n ranks named `prefix`, through the host store.
std::shared_ptr<gloo::rendezvous::Context> Connect(const std::string& prefix, int32_t rank,
                                                   int32_t n, int64_t timeout_ms,
                                                   std::shared_ptr<gloo::transport::Device>& dev) {
  HostStore host(timeout_ms);
  gloo::rendezvous::PrefixStore store(prefix, host);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->setTimeout(std::chrono::milliseconds(timeout_ms));
  ctx->connectFullMesh(store, dev);
  ctx->setTimeout(std::chrono::milliseconds(g_settings.op_timeout_ms));
  return ctx;
}

pc_error_t* Initialize(const pc_param_t* params, size_t n) {
  return polychip::sdk::Guard([&]() -> pc_error_t* {
    for (size_t i = 0; i < n; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      const char* value = params[i].value ? params[i].value : "";
      long long v = 0;
      if (key == "hostname") {
        g_settings.hostname = value;
      } else if (key == "iface") {
        g_settings.iface = value;
      } else if (key == "timeout_ms" || key == "op_timeout_ms") {
        if (!polychip::sdk::ParseInt(value, &v)) {
          return MakeError(PC_CODE_INVALID_ARGUMENT, key + " is not a non-negative integer");
        }
        (key == "timeout_ms" ? g_settings.timeout_ms : g_settings.op_timeout_ms) = v;
      } else {
        Log(PC_LOG_WARNING, "ignoring unknown parameter '" + key + "'");
      }
    }
    return nullptr;
  });
}

void Shutdown() {}

pc_error_t* GetUniqueId(pc_comm_unique_id_t* id) {
  if (id == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "id is NULL");
  std::memset(id->bytes, 0, sizeof(id->bytes));
  std::random_device rd;
  std::snprintf(id->bytes, sizeof(id->bytes), "%s%d-%08x%08x-%llu", kIdPrefix, int(getpid()), rd(),
                rd(), static_cast<unsigned long long>(g_ids.fetch_add(1)));
  return nullptr;
}

pc_error_t* InitRank(const pc_comm_unique_id_t* id, int32_t n, int32_t rank, int64_t timeout_ms,
                     pc_comm_t** out) {
  return Run("comm_init_rank", [&]() -> pc_error_t* {
    if (id == nullptr || out == nullptr)
      return MakeError(PC_CODE_INVALID_ARGUMENT, "NULL argument");
    *out = nullptr;
    const std::string name(id->bytes, strnlen(id->bytes, sizeof(id->bytes)));
    if (name.rfind(kIdPrefix, 0) != 0)
      return MakeError(PC_CODE_INVALID_ARGUMENT, "not a gloo unique id");
    if (n < 1 || rank < 0 || rank >= n)
      return MakeError(PC_CODE_INVALID_ARGUMENT, "rank out of range");
    if (g_host == nullptr || g_host->kv_get == nullptr) {
      return MakeError(PC_CODE_FAILED_PRECONDITION, "the host lends no KV store");
    }
    auto c = std::make_unique<pc_comm>();
    c->id = name;
    c->rank = rank;
    c->n = n;
    c->device = MakeDevice();
    c->ctx = Connect(name + "/", rank, n, timeout_ms > 0 ? timeout_ms : g_settings.timeout_ms,
                     c->device);
    *out = c.release();
    return nullptr;
  });
}

template <size_t N>
struct Bytes {
  char b[N];
};

// all_reduce of count elements of dtype t, recv in place (send copied in first). F16 and BF16
// travel as F32 and round once at the end, as one reduction in F32 would (pairwise rounding in
// the ring would lose a bit per hop).
pc_error_t* AllReduceImpl(pc_comm* c, void* recv, uint64_t count, pc_dtype_t t, pc_reduce_op_t op,
                          size_t esz) {
  if (t == PC_DTYPE_F16 || t == PC_DTYPE_BF16) {
    std::vector<float> wide = polychip::sdk::WidenToF32(t, recv, count);
    if (pc_error_t* e = AllReduceImpl(c, wide.data(), count, PC_DTYPE_F32, op, 4)) return e;
    polychip::sdk::NarrowFromF32(t, wide, recv);
    return nullptr;
  }
  gloo::AllreduceOptions opts(c->ctx);
  opts.setTag(c->tag++);
  opts.setReduceFunction([t, op](void* out, const void* a, const void* b, size_t n) {
    const uint8_t* srcs[2] = {static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b)};
    polychip::sdk::Reduce(t, op, srcs, 2, out, n);
  });
  switch (esz) {
    case 1:
      opts.setOutput(static_cast<Bytes<1>*>(recv), count);
      break;
    case 2:
      opts.setOutput(static_cast<Bytes<2>*>(recv), count);
      break;
    case 4:
      opts.setOutput(static_cast<Bytes<4>*>(recv), count);
      break;
    case 8:
      opts.setOutput(static_cast<Bytes<8>*>(recv), count);
      break;
    default:
      return MakeError(PC_CODE_INVALID_ARGUMENT, "all_reduce: unsupported element size");
  }
  gloo::allreduce(opts);
  return nullptr;
}

pc_error_t* AllGatherImpl(pc_comm* c, const void* send, void* recv, uint64_t bytes) {
  gloo::AllgatherOptions opts(c->ctx);
  opts.setTag(c->tag++);
  // Gloo reads the input from this rank's slot of the output when they alias.
  std::memmove(static_cast<char*>(recv) + bytes * c->rank, send, bytes);
  opts.setInput(static_cast<char*>(recv) + bytes * c->rank, bytes);
  opts.setOutput(static_cast<char*>(recv), bytes * c->n);
  gloo::allgather(opts);
  return nullptr;
}

pc_error_t* Split(pc_comm_t* c, int32_t color, int32_t key, pc_comm_t** out) {
  return Run("comm_split", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, PC_DTYPE_I32, "comm_split", &esz)) return e;
    if (out == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(2 * c->n);
    if (c->n == 1) {
      all = {color, key};
    } else {
      AllGatherImpl(c, mine, all.data(), sizeof(mine));
    }
    const uint32_t seq = c->splits++;
    if (color < 0) return nullptr;
    std::vector<std::pair<int32_t, int32_t>> members;  // (key, parent rank)
    for (int32_t r = 0; r < c->n; ++r) {
      if (all[2 * r] == color) members.push_back({all[2 * r + 1], r});
    }
    std::sort(members.begin(), members.end());
    int32_t sub_rank = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == c->rank) sub_rank = int32_t(i);
    }
    auto s = std::make_unique<pc_comm>();
    s->id = c->id + "/split" + std::to_string(seq) + "." + std::to_string(color);
    s->rank = sub_rank;
    s->n = int32_t(members.size());
    s->device = c->device;
    s->ctx = Connect(s->id + "/", s->rank, s->n, g_settings.timeout_ms, s->device);
    *out = s.release();
    return nullptr;
  });
}

pc_error_t* Destroy(pc_comm_t* c) {
  delete c;
  return nullptr;
}

void Abort(pc_comm_t* c) {
  if (c != nullptr) c->aborted.store(true);
}

pc_error_t* Rank(const pc_comm_t* c, int32_t* r) {
  if (c == nullptr || r == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "NULL argument");
  *r = c->rank;
  return nullptr;
}

pc_error_t* Size(const pc_comm_t* c, int32_t* n) {
  if (c == nullptr || n == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "NULL argument");
  *n = c->n;
  return nullptr;
}

pc_error_t* AllReduce(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                      pc_reduce_op_t op, void*) {
  return Run("all_reduce", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "all_reduce", &esz)) return e;
    if (send != recv) std::memmove(recv, send, count * esz);
    if (c->n == 1 || count == 0) return nullptr;
    return AllReduceImpl(c, recv, count, t, op, esz);
  });
}

pc_error_t* AllGather(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                      void*) {
  return Run("all_gather", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "all_gather", &esz)) return e;
    if (c->n == 1 || count == 0) {
      if (send != recv) std::memmove(recv, send, count * esz);
      return nullptr;
    }
    return AllGatherImpl(c, send, recv, count * esz);
  });
}

// Gloo's reduce-scatter is not in its options API: an all-reduce of the whole, keeping this
// rank's slice (the same bytes every rank would compute).
pc_error_t* ReduceScatter(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                          pc_reduce_op_t op, void*) {
  return Run("reduce_scatter", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "reduce_scatter", &esz)) return e;
    std::vector<char> all(count * esz * c->n);
    std::memcpy(all.data(), send, all.size());
    if (c->n > 1 && count > 0) {
      if (pc_error_t* e = AllReduceImpl(c, all.data(), count * c->n, t, op, esz)) return e;
    }
    std::memcpy(recv, all.data() + count * esz * c->rank, count * esz);
    return nullptr;
  });
}

pc_error_t* Broadcast(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                      int32_t root, void*) {
  return Run("broadcast", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "broadcast", &esz)) return e;
    if (root < 0 || root >= c->n) return MakeError(PC_CODE_INVALID_ARGUMENT, "root out of range");
    if (c->rank == root && send != recv) std::memmove(recv, send, count * esz);
    if (c->n == 1 || count == 0) return nullptr;
    gloo::BroadcastOptions opts(c->ctx);
    opts.setTag(c->tag++);
    opts.setRoot(root);
    opts.setOutput(static_cast<char*>(recv), count * esz);
    gloo::broadcast(opts);
    return nullptr;
  });
}

pc_error_t* PeerCheck(const pc_comm* c, int32_t peer, const char* what) {
  if (peer < 0 || peer >= c->n || peer == c->rank) {
    return MakeError(PC_CODE_INVALID_ARGUMENT,
                     std::string(what) + ": peer " + std::to_string(peer) + " invalid");
  }
  return nullptr;
}

pc_error_t* Send(pc_comm_t* c, const void* buf, uint64_t count, pc_dtype_t t, int32_t peer, void*) {
  return Run("send", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "send", &esz)) return e;
    if (pc_error_t* e = PeerCheck(c, peer, "send")) return e;
    auto ub = c->ctx->createUnboundBuffer(const_cast<void*>(buf), count * esz);
    ub->send(peer, kP2pSlot);
    ub->waitSend(std::chrono::milliseconds(g_settings.op_timeout_ms));
    return nullptr;
  });
}

pc_error_t* Recv(pc_comm_t* c, void* buf, uint64_t count, pc_dtype_t t, int32_t peer, void*) {
  return Run("recv", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, "recv", &esz)) return e;
    if (pc_error_t* e = PeerCheck(c, peer, "recv")) return e;
    auto ub = c->ctx->createUnboundBuffer(buf, count * esz);
    ub->recv(peer, kP2pSlot);
    ub->waitRecv(std::chrono::milliseconds(g_settings.op_timeout_ms));
    return nullptr;
  });
}

pc_error_t* Barrier(pc_comm_t* c, void*) {
  return Run("barrier", [&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, PC_DTYPE_I8, "barrier", &esz)) return e;
    if (c->n == 1) return nullptr;
    gloo::BarrierOptions opts(c->ctx);
    opts.setTag(c->tag++);
    gloo::barrier(opts);
    return nullptr;
  });
}

const pc_comm_iface_t kApi = [] {
  pc_comm_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "gloo";
  t.version = "0.1.0";
  t.memory_kind = PC_COMM_MEMORY_HOST;
  t.error_code = polychip::sdk::ErrorCode;
  t.error_message = polychip::sdk::ErrorMessage;
  t.error_destroy = polychip::sdk::ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.get_unique_id = GetUniqueId;
  t.comm_init_rank = InitRank;
  t.comm_split = Split;
  t.comm_destroy = Destroy;
  t.comm_abort = Abort;
  t.comm_rank = Rank;
  t.comm_size = Size;
  t.all_reduce = AllReduce;
  t.all_gather = AllGather;
  t.reduce_scatter = ReduceScatter;
  t.broadcast = Broadcast;
  t.send = Send;
  t.recv = Recv;
  t.barrier = Barrier;
  t.reach = PC_COMM_REACH_CROSSES_HOSTS;  // gloo's TCP pairs connect hosts
  return t;
}();

}  // namespace

extern "C" {

PC_EXPORT void pc_comm_probe(pc_probe_result_t* result) {
  if (result == nullptr) return;
  result->score = 10;
  std::snprintf(result->reason, sizeof(result->reason), "%s",
                "TCP between ranks on any hosts (Gloo)");
}

PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t major, uint32_t,
                                                 const pc_host_services_t* host) {
  if (major != PC_ABI_MAJOR) return nullptr;
  g_host = host;
  return &kApi;
}

}  // extern "C"
