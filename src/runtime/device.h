// C++ RAII objects over a device plugin's table: Backend (the loaded plugin), Device, Stream,
// Event, DeviceBuffer. Every fallible call returns Status; plugin error objects are converted
// to the canonical StatusCode (and released with the plugin's error_destroy).
//
// Lifetimes: a Device keeps its Backend alive; Streams, Events and DeviceBuffers keep their
// Device alive, so destruction order never matters to the caller.
// No ABI types here: device addresses are DevPtr (== pc_devptr_t), opaque to the host.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config.h"
#include "util/status.h"

namespace polychip::runtime {

// A device address: opaque, never dereferenced by the host; byte offsets within one
// allocation may be added.
using DevPtr = uint64_t;

struct DeviceProps {
  std::string name;
  std::string physical_id;  // stable id, e.g. PCI bus id
  uint64_t total_memory = 0;
  uint64_t free_memory = 0;
  uint64_t alignment = 1;
  uint64_t max_alloc_size = 0;
  uint32_t flags = 0;  // raw PC_DEVICE_FLAG_* bits, for display
  bool host_accessible = false;
  bool async_free = false;
  bool async_copy = false;
  bool async_exec = false;
  bool stream_priority = false;
  bool weight_repack = false;
  bool timing = false;
  int32_t priority_low = 0;
  int32_t priority_high = 0;
  int32_t compute_units = 0;
  std::vector<std::string> FlagNames() const;  // {"ASYNC_EXEC", "TIMING", ...}
};

// What a device did for one op (pc_op_counters_t, see pc_backend.h). A quantity the plugin
// does not measure is 0 with its `has_` flag false.
struct OpCounters {
  int32_t op = 0;  // runtime::Op value (ops.h); OpName() names it
  uint64_t launches = 0;
  uint64_t device_ns = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t flops = 0;
  bool has_time = false;
  bool has_bytes = false;
  bool has_flops = false;
};

class Device;
class Stream;
class Event;
class DeviceBuffer;
class OpFallback;
struct BackendImpl;  // runtime-internal (abi_internal.h)

// A loaded and initialized device plugin. Obtained from plugin_loader.h.
class Backend : public std::enable_shared_from_this<Backend> {
 public:
  ~Backend();  // calls the plugin's shutdown, then unloads the library
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const std::string& name() const;
  const std::string& path() const;     // file path, or the source given at registration
  const std::string& version() const;  // the plugin's own version string
  uint32_t abi_major() const;
  uint32_t abi_minor() const;
  // The number of this load in the process: every backend load (a reload too, and a restore of
  // the old plugin after a failed one) gets the next number, starting at 1. A metrics label and
  // /get_server_info field that tells which library served a sample.
  uint64_t generation() const;
  // Environment variable the plugin honours to restrict visible devices; empty if none.
  std::string visible_devices_env() const;

  StatusOr<int32_t> DeviceCount() const;
  StatusOr<DeviceProps> GetProps(int32_t physical) const;
  // Opens physical device `physical`, known to the framework as logical id `logical`.
  // The plugin allows one open handle per ordinal: opening it twice returns the same Device.
  StatusOr<std::shared_ptr<Device>> OpenDevice(int32_t physical, int32_t logical = -1);

  // Performance counters of an open device (optional in the ABI; empty if absent): the
  // plugin's own extras, by name.
  std::vector<std::pair<std::string, double>> ReadCounters(const Device& device) const;
  // Per-op counters of an open device (ABI 1.3 op_counters_read), cumulative since the device
  // was opened, one record per op it has run; nullopt when the plugin has none (a 1.2 plugin,
  // or counting switched off).
  std::optional<std::vector<OpCounters>> ReadOpCounters(const Device& device) const;

  BackendImpl& impl() const { return *impl_; }
  explicit Backend(std::unique_ptr<BackendImpl> impl);  // runtime-internal

 private:
  std::unique_ptr<BackendImpl> impl_;
};

// Opens the devices of `selection` on `backend` (logical i -> selection[i]); an empty
// selection opens every visible device in order. Out-of-range ids are INVALID_ARGUMENT.
StatusOr<std::vector<std::shared_ptr<Device>>> OpenDevices(
    const std::shared_ptr<Backend>& backend, const std::vector<int32_t>& physical_ids);

class Device : public std::enable_shared_from_this<Device> {
 public:
  ~Device();  // device_close: waits for the device's work
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::shared_ptr<Backend>& backend() const { return backend_; }
  int32_t physical_id() const { return physical_; }
  int32_t logical_id() const { return logical_; }
  const DeviceProps& props() const { return props_; }  // as of open time (free_memory stale)
  // Free and total bytes: the plugin's mem_get_info, or, for a plugin without one (optional
  // since ABI 1.5: XRE has no memory query), the declared total_memory less what this process
  // holds on the device through this object (allocations and uploaded weights).
  Status MemoryInfo(uint64_t* free_bytes, uint64_t* total_bytes) const;
  // Whether MemoryInfo asks the plugin (false: the declared size less our own allocations).
  bool has_memory_query() const;
  // Bytes this process holds on the device through this object.
  uint64_t held_bytes() const;
  // Device memory the plugin allocated on our behalf (weight_upload): counted in held_bytes.
  void AccountPluginOwned(int64_t delta_bytes);

  // Stream priority is clamped into [priority_low, priority_high] by the plugin.
  StatusOr<std::unique_ptr<Stream>> CreateStream(int32_t priority = 0);
  StatusOr<std::unique_ptr<Event>> CreateEvent();
  // A direct plugin allocation (bypassing the pool); bytes <= max_alloc_size.
  StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(uint64_t bytes);
  // Synchronous free of a raw allocation (used by the pool and DeviceBuffer).
  Status FreeRaw(DevPtr ptr);
  // Stream-ordered free; FAILED_PRECONDITION unless props().async_free.
  Status FreeRawAsync(const Stream& stream, DevPtr ptr);
  StatusOr<DevPtr> AllocateRaw(uint64_t bytes);

  // Page-locked host memory when the plugin offers it; otherwise ordinary aligned memory
  // (pinned() tells which).
  struct HostBuffer {
    void* data = nullptr;
    uint64_t bytes = 0;
    bool pinned = false;
  };
  StatusOr<HostBuffer> HostAlloc(uint64_t bytes);
  void HostFree(const HostBuffer& buffer);

  // Host fallback (--op-fallback, op_fallback.h): ops this device lacks run on `fallback`, with
  // operands staged through host memory. Set before anything is uploaded or launched.
  void SetOpFallback(std::shared_ptr<Device> fallback);
  OpFallback* op_fallback() const { return op_fallback_.get(); }
  // [ptr, ptr + bytes) holds data that never changes (weights): with a fallback, operands in
  // it are staged to the fallback device once. No-op without a fallback.
  void MarkImmutable(DevPtr ptr, uint64_t bytes) const;

  void* raw() const { return handle_; }  // pc_device_t*, for runtime-internal code
  Device(std::shared_ptr<Backend> backend, void* handle, int32_t physical, int32_t logical,
         DeviceProps props);  // runtime-internal

 private:
  std::shared_ptr<Backend> backend_;
  void* handle_;  // pc_device_t*
  int32_t physical_;
  int32_t logical_;
  DeviceProps props_;
  std::shared_ptr<OpFallback> op_fallback_;
  mutable std::mutex held_mu_;
  std::map<DevPtr, uint64_t> raw_sizes_;  // live AllocateRaw allocations
  uint64_t held_ = 0;
};

class Stream {
 public:
  ~Stream();  // waits for the stream's work, then releases it
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device& device() const { return *device_; }
  int32_t priority() const { return priority_; }

  // All stream-ordered. Host buffers must stay valid until the stream reaches the copy.
  Status CopyH2D(DevPtr dst, const void* src, uint64_t bytes);
  Status CopyD2H(void* dst, DevPtr src, uint64_t bytes);
  Status CopyD2D(DevPtr dst, DevPtr src, uint64_t bytes);
  // The plugin's memset, or, for a plugin without one (optional since ABI 1.5: XRE has none),
  // host-to-device copies from a static host buffer holding `value`, issued on this stream so
  // that the fill keeps its place in stream order (as InfiniCore's Kunlun runtime does).
  Status Memset(DevPtr dst, uint8_t value, uint64_t bytes);
  // Later work on this stream waits for `event` (which may belong to another stream).
  Status WaitEvent(const Event& event);
  // Blocks until all enqueued work completed; returns the first asynchronous error since the
  // last synchronize.
  Status Synchronize();

  void* raw() const { return handle_; }  // pc_stream_t*
  Stream(std::shared_ptr<Device> device, void* handle, int32_t priority);  // runtime-internal

 private:
  std::shared_ptr<Device> device_;
  void* handle_;
  int32_t priority_;
};

class Event {
 public:
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Status Record(const Stream& stream);
  // true if completed or never recorded. A plugin without event_query (optional since ABI 1.5:
  // XRE has none) cannot tell without blocking: false ("not known to be complete") from Record
  // until a Synchronize of this event returned; callers then wait with Synchronize when they
  // must.
  StatusOr<bool> Query() const;
  bool has_query() const;
  Status Synchronize() const;
  // Milliseconds from `start` to `end` (both completed); UNIMPLEMENTED without timing support.
  static StatusOr<float> ElapsedMs(const Event& start, const Event& end);

  Device& device() const { return *device_; }
  void* raw() const { return handle_; }  // pc_event_t*
  Event(std::shared_ptr<Device> device, void* handle);  // runtime-internal

 private:
  std::shared_ptr<Device> device_;
  void* handle_;
  // Recorded and not yet seen complete by Synchronize (what Query answers without event_query).
  mutable bool pending_ = false;
};

// One direct plugin allocation, freed (synchronously) on destruction.
class DeviceBuffer {
 public:
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DevPtr ptr() const { return ptr_; }
  uint64_t size() const { return size_; }
  Device& device() const { return *device_; }
  DeviceBuffer(std::shared_ptr<Device> device, DevPtr ptr, uint64_t size);  // runtime-internal

 private:
  std::shared_ptr<Device> device_;
  DevPtr ptr_;
  uint64_t size_;
};

}  // namespace polychip::runtime
