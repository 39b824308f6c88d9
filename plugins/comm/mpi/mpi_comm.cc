// The mpi comm plugin: the comm table over MPI. The ranks are MPI_COMM_WORLD's (started by
// mpirun), so the unique id only names the communicator; comm_init_rank checks that the job's
// rank and size match mpirun's and duplicates the world communicator.
//
// MPI is initialized on the first comm_init_rank (loading the plugin for `polychip devices`
// starts nothing) and finalized at shutdown if this plugin initialized it. Creation waits at
// most timeout_ms for every rank (a non-blocking barrier polled against the deadline). A rank
// that dies is handled by mpirun, which ends the job naming it. comm_abort makes later
// operations fail (an MPI collective already in progress cannot be cancelled).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "polychip/plugin/pc_comm.h"
#include "polychip/sdk/comm_util.h"
#include "polychip/sdk/plugin_util.h"

using polychip::sdk::ElementSize;
using polychip::sdk::Guard;
using polychip::sdk::MakeError;
using polychip::sdk::NarrowFromF32;
using polychip::sdk::WidenToF32;

struct pc_comm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, n = 1;
  std::atomic<bool> aborted{false};
};

namespace {

const pc_host_services_t* g_host = nullptr;
int64_t g_timeout_ms = 30000;
bool g_we_initialized = false;
std::atomic<uint64_t> g_ids{0};

void Log(pc_log_level_t level, const std::string& msg) {
  if (g_host != nullptr && g_host->log != nullptr) {
    g_host->log(g_host->host_ctx, level, "mpi", msg.c_str());
  }
}

pc_error_t* MpiError(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return nullptr;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return MakeError(PC_CODE_UNAVAILABLE, std::string(what) + ": " + std::string(text, len));
}

void Shutdown() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_we_initialized && !finalized) MPI_Finalize();
}

pc_error_t* EnsureInit() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return nullptr;
  int provided = 0;
  if (pc_error_t* e = MpiError(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
                               "MPI_Init_thread")) {
    return e;
  }
  g_we_initialized = true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  // mpirun treats a rank that exits without MPI_Finalize as failed, and a process may exit
  // without unloading its plugins: finalize at exit too (or at dlclose, which runs it first).
  std::atexit(Shutdown);
  return nullptr;
}

// MPI's type for a reduction; F16/BF16 have none and are reduced as F32 (see Reduced).
MPI_Datatype ReduceType(pc_dtype_t t) {
  switch (t) {
    case PC_DTYPE_F32: case PC_DTYPE_F16: case PC_DTYPE_BF16: return MPI_FLOAT;
    case PC_DTYPE_F64: return MPI_DOUBLE;
    case PC_DTYPE_I8: return MPI_INT8_T;
    case PC_DTYPE_I16: return MPI_INT16_T;
    case PC_DTYPE_I32: return MPI_INT32_T;
    case PC_DTYPE_I64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op Op(pc_reduce_op_t op) {
  switch (op) {
    case PC_REDUCE_SUM: return MPI_SUM;
    case PC_REDUCE_MAX: return MPI_MAX;
    case PC_REDUCE_MIN: return MPI_MIN;
    case PC_REDUCE_PROD: return MPI_PROD;
  }
  return MPI_OP_NULL;
}

bool Half(pc_dtype_t t) { return t == PC_DTYPE_F16 || t == PC_DTYPE_BF16; }

pc_error_t* Check(const pc_comm* c, pc_dtype_t t, uint64_t count, const char* what, size_t* esz) {
  if (c == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": comm is NULL");
  if (c->aborted.load()) return MakeError(PC_CODE_CANCELLED, "communicator aborted");
  *esz = ElementSize(t);
  if (*esz == 0) return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": not an element type");
  if (count * *esz > uint64_t(INT_MAX)) {
    return MakeError(PC_CODE_INVALID_ARGUMENT, std::string(what) + ": more than 2 GiB at once");
  }
  return nullptr;
}

pc_error_t* Initialize(const pc_param_t* params, size_t n) {
  return Guard([&]() -> pc_error_t* {
    for (size_t i = 0; i < n; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      long long v = 0;
      if (key == "timeout_ms") {
        if (!polychip::sdk::ParseInt(params[i].value, &v)) {
          return MakeError(PC_CODE_INVALID_ARGUMENT, "timeout_ms is not a non-negative integer");
        }
        g_timeout_ms = v;
      } else {
        Log(PC_LOG_WARNING, "ignoring unknown parameter '" + key + "'");
      }
    }
    return nullptr;
  });
}

pc_error_t* GetUniqueId(pc_comm_unique_id_t* id) {
  if (id == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "id is NULL");
  std::memset(id->bytes, 0, sizeof(id->bytes));
  std::snprintf(id->bytes, sizeof(id->bytes), "pcmpi1:world:%llu",
                static_cast<unsigned long long>(g_ids.fetch_add(1)));
  return nullptr;
}

pc_error_t* InitRank(const pc_comm_unique_id_t* id, int32_t n, int32_t rank, int64_t timeout_ms,
                     pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (id == nullptr || out == nullptr) return MakeError(PC_CODE_INVALID_ARGUMENT, "NULL argument");
    *out = nullptr;
    if (std::strncmp(id->bytes, "pcmpi1:", 7) != 0) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "not an mpi unique id");
    }
    if (pc_error_t* e = EnsureInit()) return e;
    int world_n = 0, world_rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world_n);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_n != n || world_rank != rank) {
      return MakeError(PC_CODE_INVALID_ARGUMENT,
                       "mpirun started this process as rank " + std::to_string(world_rank) +
                           " of " + std::to_string(world_n) + "; the job asks for rank " +
                           std::to_string(rank) + " of " + std::to_string(n));
    }
    if (timeout_ms <= 0) timeout_ms = g_timeout_ms;
    MPI_Request req;
    if (pc_error_t* e = MpiError(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier")) return e;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (int done = 0; !done;) {
      if (pc_error_t* e = MpiError(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test")) return e;
      if (!done && std::chrono::steady_clock::now() > deadline) {
        return MakeError(PC_CODE_UNAVAILABLE, "not every rank arrived within " +
                                                  std::to_string(timeout_ms) + " ms");
      }
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    auto c = new pc_comm;
    c->rank = rank;
    c->n = n;
    if (pc_error_t* e = MpiError(MPI_Comm_dup(MPI_COMM_WORLD, &c->comm), "MPI_Comm_dup")) {
      delete c;
      return e;
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    *out = c;
    return nullptr;
  });
}

pc_error_t* Split(pc_comm_t* c, int32_t color, int32_t key, pc_comm_t** out) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, PC_DTYPE_I8, 0, "comm_split", &esz)) return e;
    *out = nullptr;
    MPI_Comm sub = MPI_COMM_NULL;
    if (pc_error_t* e = MpiError(MPI_Comm_split(c->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub),
                                 "MPI_Comm_split")) {
      return e;
    }
    if (sub == MPI_COMM_NULL) return nullptr;
    auto s = new pc_comm;
    s->comm = sub;
    MPI_Comm_rank(sub, &s->rank);
    MPI_Comm_size(sub, &s->n);
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    *out = s;
    return nullptr;
  });
}

pc_error_t* Destroy(pc_comm_t* c) {
  if (c == nullptr) return nullptr;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
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
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count, "all_reduce", &esz)) return e;
    if (Op(op) == MPI_OP_NULL) return MakeError(PC_CODE_INVALID_ARGUMENT, "unknown op");
    if (Half(t)) {
      std::vector<float> v = WidenToF32(t, send, count);
      if (pc_error_t* e = MpiError(MPI_Allreduce(MPI_IN_PLACE, v.data(), int(count), MPI_FLOAT,
                                                 Op(op), c->comm), "MPI_Allreduce")) {
        return e;
      }
      NarrowFromF32(t, v, recv);
      return nullptr;
    }
    return MpiError(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, int(count),
                                  ReduceType(t), Op(op), c->comm), "MPI_Allreduce");
  });
}

pc_error_t* AllGather(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                      void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count * 1, "all_gather", &esz)) return e;
    return MpiError(MPI_Allgather(send, int(count * esz), MPI_BYTE, recv, int(count * esz),
                                  MPI_BYTE, c->comm), "MPI_Allgather");
  });
}

pc_error_t* ReduceScatter(pc_comm_t* c, const void* send, void* recv, uint64_t count,
                          pc_dtype_t t, pc_reduce_op_t op, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count * c->n, "reduce_scatter", &esz)) return e;
    if (Op(op) == MPI_OP_NULL) return MakeError(PC_CODE_INVALID_ARGUMENT, "unknown op");
    if (Half(t)) {
      std::vector<float> in = WidenToF32(t, send, count * c->n), out(count);
      if (pc_error_t* e = MpiError(MPI_Reduce_scatter_block(in.data(), out.data(), int(count),
                                                            MPI_FLOAT, Op(op), c->comm),
                                   "MPI_Reduce_scatter_block")) {
        return e;
      }
      NarrowFromF32(t, out, recv);
      return nullptr;
    }
    return MpiError(MPI_Reduce_scatter_block(send, recv, int(count), ReduceType(t), Op(op),
                                             c->comm), "MPI_Reduce_scatter_block");
  });
}

pc_error_t* Broadcast(pc_comm_t* c, const void* send, void* recv, uint64_t count, pc_dtype_t t,
                      int32_t root, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count, "broadcast", &esz)) return e;
    if (root < 0 || root >= c->n) return MakeError(PC_CODE_INVALID_ARGUMENT, "root out of range");
    if (c->rank == root && send != recv) std::memmove(recv, send, count * esz);
    return MpiError(MPI_Bcast(recv, int(count * esz), MPI_BYTE, root, c->comm), "MPI_Bcast");
  });
}

pc_error_t* Send(pc_comm_t* c, const void* buf, uint64_t count, pc_dtype_t t, int32_t peer, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count, "send", &esz)) return e;
    if (peer < 0 || peer >= c->n || peer == c->rank) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "send: peer " + std::to_string(peer) + " invalid");
    }
    return MpiError(MPI_Send(buf, int(count * esz), MPI_BYTE, peer, 0, c->comm), "MPI_Send");
  });
}

pc_error_t* Recv(pc_comm_t* c, void* buf, uint64_t count, pc_dtype_t t, int32_t peer, void*) {
  return Guard([&]() -> pc_error_t* {
    size_t esz;
    if (pc_error_t* e = Check(c, t, count, "recv", &esz)) return e;
    if (peer < 0 || peer >= c->n || peer == c->rank) {
      return MakeError(PC_CODE_INVALID_ARGUMENT, "recv: peer " + std::to_string(peer) + " invalid");
    }
    return MpiError(MPI_Recv(buf, int(count * esz), MPI_BYTE, peer, 0, c->comm, MPI_STATUS_IGNORE),
                    "MPI_Recv");
  });
}

pc_error_t* Barrier(pc_comm_t* c, void*) {
  size_t esz;
  if (pc_error_t* e = Check(c, PC_DTYPE_I8, 0, "barrier", &esz)) return e;
  return MpiError(MPI_Barrier(c->comm), "MPI_Barrier");
}

const pc_comm_iface_t kApi = [] {
  pc_comm_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "mpi";
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
  t.reach = PC_COMM_REACH_CROSSES_HOSTS;  // MPI's transports (btl tcp) connect hosts
  return t;
}();

}  // namespace

extern "C" {

PC_EXPORT void pc_comm_probe(pc_probe_result_t* result) {
  if (result == nullptr) return;
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                        std::getenv("PMI_SIZE") != nullptr;
  result->score = launched ? 20 : 1;
  std::snprintf(result->reason, sizeof(result->reason), "%s",
                launched ? "launched by mpirun" : "not launched by mpirun (a world of 1 rank)");
}

PC_EXPORT const pc_comm_iface_t* pc_comm_get_api(uint32_t major, uint32_t,
                                                 const pc_host_services_t* host) {
  if (major != PC_ABI_MAJOR) return nullptr;
  g_host = host;
  return &kApi;
}

}  // extern "C"
