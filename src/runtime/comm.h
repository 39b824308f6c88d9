// The loaded comm (collective communication) plugin, as a C++ object, and Communicator, the
// RAII wrapper over one of its communicators, so that no module outside src/runtime includes
// the ABI.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/config.h"
#include "runtime/host_services.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::runtime {

struct CommImpl;  // runtime-internal (abi_internal.h)
class Stream;

// Which processes one communicator of a comm plugin can join (pc_comm_reach_t, ABI 1.3).
enum class CommReach { kUnknown, kOneHost, kCrossesHosts };
const char* CommReachName(CommReach reach);  // "unknown", "one host", "crosses hosts"

class CommPlugin : public std::enable_shared_from_this<CommPlugin> {
 public:
  ~CommPlugin();  // shutdown, then unload
  CommPlugin(const CommPlugin&) = delete;
  CommPlugin& operator=(const CommPlugin&) = delete;

  const std::string& name() const;
  const std::string& path() const;
  const std::string& version() const;
  uint32_t abi_major() const;
  uint32_t abi_minor() const;
  // True if collectives take device addresses of backend `device_plugin()`; else host memory.
  bool reads_device_memory() const;
  std::string device_plugin() const;
  // The bytes of buffers one communicator of n_ranks takes in this process (in device memory
  // when reads_device_memory(), else host memory); nullopt when the plugin does not say (an
  // ABI 1.0 plugin, or one without comm_buffer_bytes).
  std::optional<uint64_t> BufferBytes(int32_t n_ranks) const;
  // What the plugin declares (1.3); kUnknown for an older plugin or one that does not say.
  CommReach reach() const;
  // A fresh unique id (get_unique_id), as bytes. For a plugin whose ids need no exchange (mpi:
  // the ranks are mpirun's, an id only names the communicator), every rank may make its own.
  StatusOr<std::string> UniqueId() const;

  CommImpl& impl() const { return *impl_; }
  explicit CommPlugin(std::unique_ptr<CommImpl> impl);  // runtime-internal

 private:
  std::unique_ptr<CommImpl> impl_;
};

enum class ReduceOp : int32_t { kSum = 0, kMax = 1, kMin = 2, kProd = 3 };

// One rank's handle on a communicator. Collectives take host pointers: with a comm plugin that
// reads device memory (reads_device_memory()) the caller passes device addresses cast to void*
// instead. Not thread-safe: one thread issues a communicator's operations, in the same order
// on every rank. Abort() alone may be called from any thread.
class Communicator {
 public:
  // Collective over n_ranks processes (or threads): rank 0 makes the unique id and publishes it
  // in `kv` under `key`; the others read it there. Fails with UNAVAILABLE after timeout_ms when
  // a rank never arrives.
  static StatusOr<std::unique_ptr<Communicator>> Create(std::shared_ptr<CommPlugin> plugin,
                                                        KvStore& kv, const std::string& key,
                                                        int32_t n_ranks, int32_t rank,
                                                        int64_t timeout_ms);
  ~Communicator();  // comm_destroy
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  const CommPlugin& plugin() const { return *plugin_; }

  // Collective over this communicator: ranks with the same color form a new communicator,
  // ordered by key. color < 0: this rank joins none and gets nullptr.
  StatusOr<std::unique_ptr<Communicator>> Split(int32_t color, int32_t key);

  Status AllReduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op);
  // recv: [size(), count] rank-major.
  Status AllGather(const void* send, void* recv, uint64_t count, DType dtype);
  // send: [size(), recv_count]; rank r receives the reduced r-th row.
  Status ReduceScatter(const void* send, void* recv, uint64_t recv_count, DType dtype,
                       ReduceOp op);
  Status Broadcast(const void* send, void* recv, uint64_t count, DType dtype, int32_t root);
  Status Send(const void* buf, uint64_t count, DType dtype, int32_t peer);
  Status Recv(void* buf, uint64_t count, DType dtype, int32_t peer);
  Status Barrier();
  // For a plugin that reads device memory (reads_device_memory()): the same on device
  // addresses of its device_plugin()'s devices, enqueued on `stream` (a stream of that backend,
  // holding the buffers): they return once enqueued, later work on the stream sees their
  // result, and nothing passes through host memory.
  Status AllReduceOn(const Stream& stream, uint64_t send, uint64_t recv, uint64_t count,
                     DType dtype, ReduceOp op);
  Status SendOn(const Stream& stream, uint64_t buf, uint64_t count, DType dtype, int32_t peer);
  Status RecvOn(const Stream& stream, uint64_t buf, uint64_t count, DType dtype, int32_t peer);
  // Makes pending and later operations fail (here and, through the plugin, on the peers).
  void Abort();

  // Wall time spent inside this communicator's operations, and their number (for metrics).
  double seconds_in_ops() const { return seconds_; }
  uint64_t n_ops() const { return n_ops_; }

  Communicator(std::shared_ptr<CommPlugin> plugin, void* comm, int32_t rank, int32_t size);  // runtime-internal

 private:
  Status Timed(const char* what, const std::function<Status()>& op);
  std::shared_ptr<CommPlugin> plugin_;
  void* comm_;  // pc_comm_t*
  int32_t rank_, size_;
  double seconds_ = 0;
  uint64_t n_ops_ = 0;
};

}  // namespace polychip::runtime
