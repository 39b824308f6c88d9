// emuccl: the emu device's collective library, shaped like NCCL and Kunlun's BKCL (XCCL).
//   - Buffers are emu device memory (pc_devptr_t cast to void*) and every call takes an emu
//     stream: the collective is enqueued there, after the work already on the stream (a kernel
//     before it on the same stream is seen) and before what follows; the call returns at once
//     and the host never waits. A host pointer, or memory of another device, is
//     INVALID_ARGUMENT at the call.
//   - Device memory and streams are reached through emu's private interface (emu_private.h), as
//     a vendor's CCL uses its own runtime, never through the framework; emu must already be
//     loaded in the process (the framework loads the device plugin first).
//   - Bytes move between processes through the shm comm plugin, loaded from the folder beside
//     this one as a transport (what NVLink or the XPU's links are to NCCL and BKCL): the unique
//     id (exchanged by the host's key-value store), ranks, sub-communicators and abort are its.
//     The collective itself runs on the stream's worker, outside the emu device's executor, so
//     waiting for a peer never holds the device.
//   - group_start/group_end: the operations between them are issued as one command per stream;
//     its sends and receives run on two threads, so a group that pairs them (a ring exchange)
//     cannot deadlock on the transport's rendezvous.
//   - Parameters: buffer_bytes (the transport's per-rank buffer, default 4 MiB), protocol,
//     timeout_ms, op_timeout_ms (passed to the transport).
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu_private.h"
#include "polychip/plugin/pc_comm.h"
#include "polychip/sdk/comm_util.h"
#include "polychip/sdk/plugin_util.h"

using polychip::sdk::ElementSize;
using polychip::sdk::Guard;
using polychip::sdk::MakeError;

// Our handle wraps the transport's communicator.
struct pc_comm {
  pc_comm_t* shm = nullptr;
  int32_t rank = 0;
  int32_t size = 1;
};

namespace {

const pc_host_services_t* g_host = nullptr;

void Log(pc_log_level_t level, const std::string& msg) {
  if (g_host != nullptr && g_host->log != nullptr)
    g_host->log(g_host->host_ctx, level, "emuccl", msg.c_str());
}

pc_error_t* BadArg(const std::string& msg) { return MakeError(PC_CODE_INVALID_ARGUMENT, msg); }

// The folder this library was loaded from.
std::string OwnFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OwnFolder), &info) == 0 || info.dli_fname == nullptr)
    return ".";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

// The transport (the shm plugin's table) and emu's private interface, found at initialize.
struct Links {
  void* shm_lib = nullptr;
  const pc_comm_iface_t* shm = nullptr;
  const pc_emu_private_t* emu = nullptr;
  std::string emu_path;
};
Links g_links;

// Emu is looked up among the libraries already loaded (RTLD_NOLOAD): a second copy would have
// devices of its own. Asked again at each call until found (the device plugin may be loaded
// after this one).
const pc_emu_private_t* Emu() {
  if (g_links.emu != nullptr) return g_links.emu;
  void* lib = dlopen(g_links.emu_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  auto get = reinterpret_cast<pc_emu_private_fn>(dlsym(lib, PC_EMU_PRIVATE_SYMBOL));
  g_links.emu = get != nullptr ? get() : nullptr;
  dlclose(lib);  // NOLOAD took a reference; the framework's keeps it loaded
  return g_links.emu;
}

// A transport error as our own (the transport's object destroyed by the transport).
pc_error_t* FromShm(pc_error_t* e) {
  if (e == nullptr) return nullptr;
  pc_error_t* ours = MakeError(g_links.shm->error_code(e), g_links.shm->error_message(e));
  g_links.shm->error_destroy(e);
  return ours;
}
// The same as a text, for an error met on the stream.
std::string ShmText(pc_error_t* e) {
  std::string text = std::string("emuccl: ") + g_links.shm->error_message(e);
  g_links.shm->error_destroy(e);
  return text;
}

// ---- operations ---------------------------------------------------------------------------

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kSend, kRecv, kBarrier };

// One collective as enqueued: device addresses, translated again when it runs.
struct Op {
  Kind kind;
  pc_comm* comm;
  pc_stream_t* stream;
  pc_devptr_t send = 0, recv = 0;
  uint64_t send_bytes = 0, recv_bytes = 0;
  uint64_t count = 0;
  pc_dtype_t dtype = PC_DTYPE_F32;
  pc_reduce_op_t op = PC_REDUCE_SUM;
  int32_t peer = 0;  // root of a broadcast
};

// Runs `op` on the calling thread (a stream's worker): nullptr or what failed.
std::string Run(const Op& op) {
  const pc_emu_private_t* emu = Emu();
  void* send = op.send_bytes ? emu->translate(op.stream, op.send, op.send_bytes) : nullptr;
  void* recv = op.recv_bytes ? emu->translate(op.stream, op.recv, op.recv_bytes) : nullptr;
  if ((op.send_bytes && send == nullptr) || (op.recv_bytes && recv == nullptr)) {
    return "emuccl: a buffer was freed before its collective ran";
  }
  const pc_comm_iface_t* t = g_links.shm;
  pc_comm_t* c = op.comm->shm;
  pc_error_t* e = nullptr;
  switch (op.kind) {
    case Kind::kAllReduce:
      e = t->all_reduce(c, send, recv, op.count, op.dtype, op.op, nullptr);
      break;
    case Kind::kAllGather:
      e = t->all_gather(c, send, recv, op.count, op.dtype, nullptr);
      break;
    case Kind::kReduceScatter:
      e = t->reduce_scatter(c, send, recv, op.count, op.dtype, op.op, nullptr);
      break;
    case Kind::kBroadcast:
      e = t->broadcast(c, send, recv, op.count, op.dtype, op.peer, nullptr);
      break;
    case Kind::kSend:
      e = t->send(c, send, op.count, op.dtype, op.peer, nullptr);
      break;
    case Kind::kRecv:
      e = t->recv(c, recv, op.count, op.dtype, op.peer, nullptr);
      break;
    case Kind::kBarrier:
      e = t->barrier(c, nullptr);
      break;
  }
  return e != nullptr ? ShmText(e) : std::string();
}

// A list of operations run as one stream command: collectives in order; sends and receives
// between two collectives on two threads (sends in order on one, receives on the other).
struct Batch {
  std::vector<Op> ops;
  std::string error;
};

void RunPointToPoint(std::vector<const Op*>& sends, std::vector<const Op*>& recvs,
                     std::string* why) {
  std::string send_error;
  std::thread sender([&] {
    for (const Op* op : sends) {
      send_error = Run(*op);
      if (!send_error.empty()) return;
    }
  });
  for (const Op* op : recvs) {
    *why = Run(*op);
    if (!why->empty()) break;
  }
  sender.join();
  if (why->empty()) *why = send_error;
  sends.clear();
  recvs.clear();
}

const char* RunBatch(void* ctx) {
  Batch& b = *static_cast<Batch*>(ctx);
  std::vector<const Op*> sends, recvs;
  for (const Op& op : b.ops) {
    if (op.kind == Kind::kSend || op.kind == Kind::kRecv) {
      (op.kind == Kind::kSend ? sends : recvs).push_back(&op);
      continue;
    }
    RunPointToPoint(sends, recvs, &b.error);
    if (b.error.empty()) b.error = Run(op);
    if (!b.error.empty()) return b.error.c_str();
  }
  RunPointToPoint(sends, recvs, &b.error);
  return b.error.empty() ? nullptr : b.error.c_str();
}

void ReleaseBatch(void* ctx) { delete static_cast<Batch*>(ctx); }

// group_start depth and the operations of the open group, per thread (as NCCL's groups).
thread_local int g_group_depth = 0;
thread_local std::vector<Op> g_group;

pc_error_t* Enqueue(std::vector<Op> ops) {
  // One command per stream, in the order the streams first appear.
  while (!ops.empty()) {
    pc_stream_t* stream = ops.front().stream;
    auto batch = std::make_unique<Batch>();
    std::vector<Op> rest;
    for (Op& op : ops) (op.stream == stream ? batch->ops : rest).push_back(op);
    if (Emu()->enqueue_host(stream, RunBatch, batch.get(), ReleaseBatch) != 0) {
      return MakeError(PC_CODE_INTERNAL, "emuccl: emu refused the collective");
    }
    batch.release();  // emu releases it after running it
    ops = std::move(rest);
  }
  return nullptr;
}

pc_error_t* Issue(const Op& op) {
  if (g_group_depth > 0) {
    g_group.push_back(op);
    return nullptr;
  }
  return Enqueue({op});
}

// Checks a call and translates its buffers now, so that a host pointer or a range past an
// allocation is reported at once.
pc_error_t* Prepare(pc_comm* c, void* stream, pc_dtype_t dtype, const char* what, Op* op) {
  if (c == nullptr) return BadArg(std::string(what) + ": comm is NULL");
  if (stream == nullptr) {
    return BadArg(std::string(what) +
                  ": emuccl collectives are stream-ordered; pass the emu "
                  "stream they follow");
  }
  if (Emu() == nullptr) {
    return MakeError(PC_CODE_FAILED_PRECONDITION,
                     std::string(what) + ": the emu device plugin is not loaded in this process (" +
                         g_links.emu_path + ")");
  }
  if (op->op < PC_REDUCE_SUM || op->op > PC_REDUCE_PROD) {
    return BadArg(std::string(what) + ": unknown reduction " + std::to_string(op->op));
  }
  if (op->kind != Kind::kBarrier && ElementSize(dtype) == 0) {
    return BadArg(std::string(what) + ": dtype " + std::to_string(dtype) + " has no element size");
  }
  op->comm = c;
  op->stream = static_cast<pc_stream_t*>(stream);
  op->dtype = dtype;
  auto check = [&](pc_devptr_t p, uint64_t bytes, const char* name) -> pc_error_t* {
    if (bytes == 0 || Emu()->translate(op->stream, p, bytes) != nullptr) return nullptr;
    return BadArg(std::string(what) + ": " + name + " (address " + std::to_string(p) + ", " +
                  std::to_string(bytes) + " bytes) is not memory of the stream's emu device " +
                  std::to_string(Emu()->device_ordinal(op->stream)));
  };
  if (pc_error_t* e = check(op->send, op->send_bytes, "send buffer")) return e;
  return check(op->recv, op->recv_bytes, "recv buffer");
}

pc_devptr_t Dev(const void* p) { return reinterpret_cast<pc_devptr_t>(p); }

// ---- the table's members ------------------------------------------------------------------

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  return Guard([&]() -> pc_error_t* {
    const std::string dir = OwnFolder();
    g_links.emu_path = dir + "/libpolychip_backend_emu.so";
    if (g_links.shm == nullptr) {
      const std::string path = dir + "/libpolychip_comm_shm.so";
      g_links.shm_lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (g_links.shm_lib == nullptr) {
        return MakeError(PC_CODE_UNAVAILABLE,
                         "emuccl: cannot load its transport " + path + ": " + dlerror());
      }
      auto get =
          reinterpret_cast<pc_comm_get_api_fn>(dlsym(g_links.shm_lib, PC_COMM_GET_API_SYMBOL));
      g_links.shm = get != nullptr ? get(PC_ABI_MAJOR, PC_ABI_MINOR, g_host) : nullptr;
      if (g_links.shm == nullptr)
        return MakeError(PC_CODE_UNAVAILABLE, "emuccl: " + path + " has no table");
    }
    std::vector<pc_param_t> transport;
    for (size_t i = 0; i < n_params; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      if (key == "buffer_bytes" || key == "protocol" || key == "timeout_ms" ||
          key == "op_timeout_ms") {
        transport.push_back(params[i]);
      } else {
        Log(PC_LOG_WARNING, "ignoring unknown parameter '" + key + "'");
      }
    }
    return FromShm(g_links.shm->initialize(transport.data(), transport.size()));
  });
}

void Shutdown() {
  if (g_links.shm != nullptr) g_links.shm->shutdown();
}

pc_error_t* GetUniqueId(pc_comm_unique_id_t* id) {
  if (g_links.shm == nullptr) return MakeError(PC_CODE_FAILED_PRECONDITION, "not initialized");
  return FromShm(g_links.shm->get_unique_id(id));
}

pc_error_t* Wrap(pc_comm_t* shm, pc_comm_t** out) {
  auto* c = new pc_comm;
  c->shm = shm;
  g_links.shm->comm_rank(shm, &c->rank);
  g_links.shm->comm_size(shm, &c->size);
  *out = c;
  return nullptr;
}

pc_error_t* CommInitRank(const pc_comm_unique_id_t* id, int32_t n_ranks, int32_t rank,
                         int64_t timeout_ms, pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (out == nullptr) return BadArg("comm_init_rank: out is NULL");
    *out = nullptr;
    pc_comm_t* shm = nullptr;
    if (pc_error_t* e = FromShm(g_links.shm->comm_init_rank(id, n_ranks, rank, timeout_ms, &shm)))
      return e;
    return Wrap(shm, out);
  });
}

pc_error_t* CommSplit(pc_comm_t* c, int32_t color, int32_t key, pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (c == nullptr || out == nullptr) return BadArg("comm_split: NULL argument");
    *out = nullptr;
    pc_comm_t* shm = nullptr;
    if (pc_error_t* e = FromShm(g_links.shm->comm_split(c->shm, color, key, &shm))) return e;
    return shm == nullptr ? nullptr : Wrap(shm, out);
  });
}

pc_error_t* CommDestroy(pc_comm_t* c) {
  if (c == nullptr) return nullptr;
  pc_error_t* e = FromShm(g_links.shm->comm_destroy(c->shm));
  delete c;
  return e;
}

void CommAbort(pc_comm_t* c) {
  if (c != nullptr) g_links.shm->comm_abort(c->shm);
}

pc_error_t* CommRank(const pc_comm_t* c, int32_t* rank) {
  if (c == nullptr || rank == nullptr) return BadArg("comm_rank: NULL");
  *rank = c->rank;
  return nullptr;
}

pc_error_t* CommSize(const pc_comm_t* c, int32_t* n) {
  if (c == nullptr || n == nullptr) return BadArg("comm_size: NULL");
  *n = c->size;
  return nullptr;
}

pc_error_t* AllReduce(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      pc_reduce_op_t op, void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kAllReduce};
    o.send = Dev(send), o.recv = Dev(recv), o.count = count, o.op = op;
    o.send_bytes = o.recv_bytes = count * ElementSize(dtype);
    if (pc_error_t* e = Prepare(c, stream, dtype, "all_reduce", &o)) return e;
    return Issue(o);
  });
}

pc_error_t* AllGather(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kAllGather};
    o.send = Dev(send), o.recv = Dev(recv), o.count = count;
    o.send_bytes = count * ElementSize(dtype);
    o.recv_bytes = c != nullptr ? o.send_bytes * c->size : 0;
    if (pc_error_t* e = Prepare(c, stream, dtype, "all_gather", &o)) return e;
    return Issue(o);
  });
}

pc_error_t* ReduceScatter(pc_comm_t* c, const void* send, void* recv, uint64_t recv_count,
                          pc_dtype_t dtype, pc_reduce_op_t op, void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kReduceScatter};
    o.send = Dev(send), o.recv = Dev(recv), o.count = recv_count, o.op = op;
    o.recv_bytes = recv_count * ElementSize(dtype);
    o.send_bytes = c != nullptr ? o.recv_bytes * c->size : 0;
    if (pc_error_t* e = Prepare(c, stream, dtype, "reduce_scatter", &o)) return e;
    return Issue(o);
  });
}

pc_error_t* Broadcast(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t dtype,
                      int32_t root, void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kBroadcast};
    o.count = count, o.peer = root;
    o.recv = Dev(recv), o.recv_bytes = count * ElementSize(dtype);
    // Only the root reads `send`; the others may pass anything there.
    if (c != nullptr && c->rank == root) o.send = Dev(send), o.send_bytes = o.recv_bytes;
    if (pc_error_t* e = Prepare(c, stream, dtype, "broadcast", &o)) return e;
    if (root < 0 || root >= c->size) {
      return BadArg("broadcast: root " + std::to_string(root) + " invalid for " +
                    std::to_string(c->size) + " ranks");
    }
    return Issue(o);
  });
}

pc_error_t* Send(pc_comm_t* c, const void* buf, uint64_t count, pc_dtype_t dtype, int32_t peer,
                 void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kSend};
    o.send = Dev(buf), o.send_bytes = count * ElementSize(dtype), o.count = count, o.peer = peer;
    if (pc_error_t* e = Prepare(c, stream, dtype, "send", &o)) return e;
    if (peer < 0 || peer >= c->size || peer == c->rank) {
      return BadArg("send: peer " + std::to_string(peer) + " invalid");
    }
    return Issue(o);
  });
}

pc_error_t* Recv(pc_comm_t* c, void* buf, uint64_t count, pc_dtype_t dtype, int32_t peer,
                 void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kRecv};
    o.recv = Dev(buf), o.recv_bytes = count * ElementSize(dtype), o.count = count, o.peer = peer;
    if (pc_error_t* e = Prepare(c, stream, dtype, "recv", &o)) return e;
    if (peer < 0 || peer >= c->size || peer == c->rank) {
      return BadArg("recv: peer " + std::to_string(peer) + " invalid");
    }
    return Issue(o);
  });
}

pc_error_t* Barrier(pc_comm_t* c, void* stream) {
  return Guard([&]() -> pc_error_t* {
    Op o{Kind::kBarrier};
    if (pc_error_t* e = Prepare(c, stream, PC_DTYPE_F32, "barrier", &o)) return e;
    return Issue(o);
  });
}

pc_error_t* GroupStart() {
  ++g_group_depth;
  return nullptr;
}

pc_error_t* GroupEnd() {
  return Guard([&]() -> pc_error_t* {
    if (g_group_depth == 0)
      return MakeError(PC_CODE_FAILED_PRECONDITION, "group_end without group_start");
    if (--g_group_depth > 0) return nullptr;
    std::vector<Op> ops = std::move(g_group);
    g_group.clear();
    return Enqueue(std::move(ops));
  });
}

pc_error_t* BufferBytes(int32_t n_ranks, uint64_t* bytes) {
  if (bytes == nullptr || n_ranks < 1)
    return BadArg("comm_buffer_bytes: n_ranks < 1 or bytes NULL");
  // The transport's buffers live in host shared memory: none of emu's device memory.
  *bytes = 0;
  return nullptr;
}

const pc_comm_iface_t kIface = [] {
  pc_comm_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "emuccl";
  t.version = "0.1.0";
  t.memory_kind = PC_COMM_MEMORY_DEVICE;
  t.device_plugin = "emu";
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
  t.group_start = GroupStart;
  t.group_end = GroupEnd;
  t.comm_buffer_bytes = BufferBytes;
  t.reach = PC_COMM_REACH_ONE_HOST;
  return t;
}();

}  // namespace

extern "C" {

PC_EXPORT void pc_comm_probe(pc_probe_result_t* result) {
  if (result == nullptr) return;
  result->score = 1;
  std::snprintf(result->reason, sizeof(result->reason),
                "collectives on emu device memory (testing only)");
}

PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t host_abi_major, uint32_t,
                                                 const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;
  g_host = host;
  return &kIface;
}

}  // extern "C"
