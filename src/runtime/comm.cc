#include "runtime/comm.h"

#include <chrono>
#include <cstring>

#include "runtime/abi_internal.h"
#include "runtime/device.h"
#include "runtime/log.h"

namespace polychip::runtime {

CommPlugin::CommPlugin(std::unique_ptr<CommImpl> impl) : impl_(std::move(impl)) {}

CommPlugin::~CommPlugin() {
  if (impl_->initialized) impl_->table->shutdown();
}

const std::string& CommPlugin::name() const { return impl_->name; }
const std::string& CommPlugin::path() const { return impl_->path; }
const std::string& CommPlugin::version() const { return impl_->version; }
uint32_t CommPlugin::abi_major() const { return impl_->table->abi_major; }
uint32_t CommPlugin::abi_minor() const { return impl_->table->abi_minor; }
bool CommPlugin::reads_device_memory() const {
  return impl_->table->memory_kind == PC_COMM_MEMORY_DEVICE;
}
std::string CommPlugin::device_plugin() const {
  const char* p = impl_->table->device_plugin;
  return reads_device_memory() && p != nullptr ? p : "";
}

std::optional<uint64_t> CommPlugin::BufferBytes(int32_t n_ranks) const {
  const pc_comm_iface_t* t = impl_->table;
  if (!PC_HAS_MEMBER(t, pc_comm_iface_t, comm_buffer_bytes) || t->comm_buffer_bytes == nullptr) {
    return std::nullopt;
  }
  uint64_t bytes = 0;
  Status s = TakeCommError(t, t->comm_buffer_bytes(n_ranks, &bytes), "comm_buffer_bytes");
  if (!s.ok()) {
    Log().warn("{}", s.ToString());
    return std::nullopt;
  }
  return bytes;
}

CommReach CommPlugin::reach() const { return ReachOfTable(impl_->table); }

CommReach ReachOfTable(const pc_comm_iface_t* t) {
  if (!PC_HAS_MEMBER(t, pc_comm_iface_t, reach)) return CommReach::kUnknown;
  switch (t->reach) {
    case PC_COMM_REACH_ONE_HOST:
      return CommReach::kOneHost;
    case PC_COMM_REACH_CROSSES_HOSTS:
      return CommReach::kCrossesHosts;
    default:  // PC_COMM_REACH_UNKNOWN, or a value from a later minor
      return CommReach::kUnknown;
  }
}

const char* CommReachName(CommReach reach) {
  switch (reach) {
    case CommReach::kOneHost:
      return "one host";
    case CommReach::kCrossesHosts:
      return "crosses hosts";
    default:
      return "unknown";
  }
}

StatusOr<std::string> CommPlugin::UniqueId() const {
  pc_comm_unique_id_t id{};
  PC_RETURN_IF_ERROR(TakeCommError(impl_->table, impl_->table->get_unique_id(&id), "get_unique_id"));
  return std::string(id.bytes, sizeof(id.bytes));
}

}  // namespace polychip::runtime

// ---- Communicator -------------------------------------------------------------------------

namespace polychip::runtime {
namespace {

pc_comm_t* Handle(void* comm) { return static_cast<pc_comm_t*>(comm); }
pc_dtype_t PcType(DType t) { return static_cast<pc_dtype_t>(t); }
pc_reduce_op_t PcOp(ReduceOp op) { return static_cast<pc_reduce_op_t>(op); }

}  // namespace

StatusOr<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<CommPlugin> plugin,
                                                             KvStore& kv, const std::string& key,
                                                             int32_t n_ranks, int32_t rank,
                                                             int64_t timeout_ms) {
  if (!plugin) return InvalidArgument("Communicator::Create: no comm plugin");
  const pc_comm_iface_t* t = TableOf(*plugin);
  pc_comm_unique_id_t id{};
  if (rank == 0) {
    PC_RETURN_IF_ERROR(TakeCommError(t, t->get_unique_id(&id), "get_unique_id"));
    PC_RETURN_IF_ERROR(kv.Set(key, std::string(id.bytes, sizeof(id.bytes))));
  } else {
    StatusOr<std::string> bytes = kv.Get(key, timeout_ms);
    if (!bytes.ok()) {
      return Unavailable("rank " + std::to_string(rank) + " of " + std::to_string(n_ranks) +
                         ": rank 0 did not publish the communicator id within " +
                         std::to_string(timeout_ms) + " ms (" + bytes.status().message() + ")");
    }
    if (bytes->size() != sizeof(id.bytes)) {
      return InvalidArgument("communicator id under '" + key + "' has " +
                             std::to_string(bytes->size()) + " bytes");
    }
    std::memcpy(id.bytes, bytes->data(), sizeof(id.bytes));
  }
  pc_comm_t* comm = nullptr;
  PC_RETURN_IF_ERROR(TakeCommError(t, t->comm_init_rank(&id, n_ranks, rank, timeout_ms, &comm),
                                   "comm_init_rank"));
  return std::make_unique<Communicator>(std::move(plugin), comm, rank, n_ranks);
}

Communicator::Communicator(std::shared_ptr<CommPlugin> plugin, void* comm, int32_t rank,
                           int32_t size)
    : plugin_(std::move(plugin)), comm_(comm), rank_(rank), size_(size) {}

Communicator::~Communicator() {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  Status s = TakeCommError(t, t->comm_destroy(Handle(comm_)), "comm_destroy");
  if (!s.ok()) Log().warn("{}", s.ToString());
}

StatusOr<std::unique_ptr<Communicator>> Communicator::Split(int32_t color, int32_t key) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  pc_comm_t* sub = nullptr;
  PC_RETURN_IF_ERROR(TakeCommError(t, t->comm_split(Handle(comm_), color, key, &sub),
                                   "comm_split"));
  if (sub == nullptr) return std::unique_ptr<Communicator>();
  int32_t r = 0, n = 0;
  Status s = TakeCommError(t, t->comm_rank(sub, &r), "comm_rank");
  if (s.ok()) s = TakeCommError(t, t->comm_size(sub, &n), "comm_size");
  auto out = std::make_unique<Communicator>(plugin_, sub, r, n);
  if (!s.ok()) return s;
  return out;
}

Status Communicator::Timed(const char* what, const std::function<Status()>& op) {
  const auto start = std::chrono::steady_clock::now();
  Status s = op();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++n_ops_;
  return s;
}

Status Communicator::AllReduce(const void* send, void* recv, uint64_t count, DType dtype,
                               ReduceOp op) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("all_reduce", [&] {
    return TakeCommError(t, t->all_reduce(Handle(comm_), send, recv, count, PcType(dtype),
                                          PcOp(op), nullptr),
                         "all_reduce");
  });
}

Status Communicator::AllGather(const void* send, void* recv, uint64_t count, DType dtype) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("all_gather", [&] {
    return TakeCommError(
        t, t->all_gather(Handle(comm_), send, recv, count, PcType(dtype), nullptr), "all_gather");
  });
}

Status Communicator::ReduceScatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                                   ReduceOp op) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("reduce_scatter", [&] {
    return TakeCommError(t, t->reduce_scatter(Handle(comm_), send, recv, recv_count,
                                              PcType(dtype), PcOp(op), nullptr),
                         "reduce_scatter");
  });
}

Status Communicator::Broadcast(const void* send, void* recv, uint64_t count, DType dtype,
                               int32_t root) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("broadcast", [&] {
    return TakeCommError(
        t, t->broadcast(Handle(comm_), send, recv, count, PcType(dtype), root, nullptr),
        "broadcast");
  });
}

Status Communicator::Send(const void* buf, uint64_t count, DType dtype, int32_t peer) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("send", [&] {
    return TakeCommError(t, t->send(Handle(comm_), buf, count, PcType(dtype), peer, nullptr),
                         "send");
  });
}

Status Communicator::Recv(void* buf, uint64_t count, DType dtype, int32_t peer) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("recv", [&] {
    return TakeCommError(t, t->recv(Handle(comm_), buf, count, PcType(dtype), peer, nullptr),
                         "recv");
  });
}

Status Communicator::Barrier() {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("barrier",
               [&] { return TakeCommError(t, t->barrier(Handle(comm_), nullptr), "barrier"); });
}

namespace {
void* Addr(uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
}  // namespace

Status Communicator::AllReduceOn(const Stream& stream, uint64_t send, uint64_t recv, uint64_t count,
                                 DType dtype, ReduceOp op) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("all_reduce", [&] {
    return TakeCommError(t,
                         t->all_reduce(Handle(comm_), Addr(send), Addr(recv), count, PcType(dtype),
                                       PcOp(op), stream.raw()),
                         "all_reduce");
  });
}

Status Communicator::SendOn(const Stream& stream, uint64_t buf, uint64_t count, DType dtype,
                            int32_t peer) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("send", [&] {
    return TakeCommError(
        t, t->send(Handle(comm_), Addr(buf), count, PcType(dtype), peer, stream.raw()), "send");
  });
}

Status Communicator::RecvOn(const Stream& stream, uint64_t buf, uint64_t count, DType dtype,
                            int32_t peer) {
  const pc_comm_iface_t* t = TableOf(*plugin_);
  return Timed("recv", [&] {
    return TakeCommError(
        t, t->recv(Handle(comm_), Addr(buf), count, PcType(dtype), peer, stream.raw()), "recv");
  });
}

void Communicator::Abort() { TableOf(*plugin_)->comm_abort(Handle(comm_)); }

}  // namespace polychip::runtime
