#include "runtime/device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "runtime/abi_internal.h"
#include "runtime/log.h"
#include "runtime/op_fallback.h"

namespace polychip::runtime {

namespace {

// The ABI's codes and the framework's, one row each: both directions read it.
constexpr std::pair<pc_code_t, StatusCode> kCodes[] = {
    {PC_CODE_OK, StatusCode::kOk},
    {PC_CODE_INVALID_ARGUMENT, StatusCode::kInvalidArgument},
    {PC_CODE_NOT_FOUND, StatusCode::kNotFound},
    {PC_CODE_RESOURCE_EXHAUSTED, StatusCode::kResourceExhausted},
    {PC_CODE_UNIMPLEMENTED, StatusCode::kUnimplemented},
    {PC_CODE_UNAVAILABLE, StatusCode::kUnavailable},
    {PC_CODE_FAILED_PRECONDITION, StatusCode::kFailedPrecondition},
    {PC_CODE_CANCELLED, StatusCode::kCancelled},
    {PC_CODE_INTERNAL, StatusCode::kInternal},
};

}  // namespace

StatusCode FromPcCode(pc_code_t code) {
  for (const auto& [pc, status] : kCodes) {
    if (pc == code) return status;
  }
  return StatusCode::kInternal;  // an unknown code from a newer or buggy plugin
}

pc_code_t ToPcCode(StatusCode code) {
  for (const auto& [pc, status] : kCodes) {
    if (status == code) return pc;
  }
  return PC_CODE_INTERNAL;
}

namespace {

template <typename Table>
Status TakeErrorImpl(const Table* table, pc_error_t* error, const char* what) {
  if (error == nullptr) return Status::Ok();
  StatusCode code = FromPcCode(table->error_code(error));
  const char* msg = table->error_message(error);
  std::string text = std::string(table->name) + " " + what + ": " + (msg != nullptr ? msg : "");
  table->error_destroy(error);
  // A plugin reporting OK through an error object is a plugin bug; do not lose the failure.
  if (code == StatusCode::kOk) code = StatusCode::kInternal;
  return Status(code, std::move(text));
}

}  // namespace

Status TakeError(const pc_backend_iface_t* table, pc_error_t* error, const char* what) {
  return TakeErrorImpl(table, error, what);
}

Status TakeCommError(const pc_comm_iface_t* table, pc_error_t* error, const char* what) {
  return TakeErrorImpl(table, error, what);
}

// ---- DeviceProps -------------------------------------------------------------------------

std::vector<std::string> DeviceProps::FlagNames() const {
  std::vector<std::string> names;
  static const std::pair<uint32_t, const char*> kFlags[] = {
      {PC_DEVICE_FLAG_HOST_ACCESSIBLE, "HOST_ACCESSIBLE"},
      {PC_DEVICE_FLAG_ASYNC_FREE, "ASYNC_FREE"},
      {PC_DEVICE_FLAG_ASYNC_COPY, "ASYNC_COPY"},
      {PC_DEVICE_FLAG_ASYNC_EXEC, "ASYNC_EXEC"},
      {PC_DEVICE_FLAG_STREAM_PRIORITY, "STREAM_PRIORITY"},
      {PC_DEVICE_FLAG_WEIGHT_REPACK, "WEIGHT_REPACK"},
      {PC_DEVICE_FLAG_TIMING, "TIMING"},
  };
  for (const auto& [bit, name] : kFlags) {
    if (flags & bit) names.push_back(name);
  }
  return names;
}

// ---- Backend -----------------------------------------------------------------------------

Backend::Backend(std::unique_ptr<BackendImpl> impl) : impl_(std::move(impl)) {}

Backend::~Backend() {
  // Every Device holds a reference to its Backend, so all plugin objects are gone by now.
  if (impl_->initialized) impl_->table->shutdown();
  Log().debug("unloaded backend '{}'", impl_->name);
}

const std::string& Backend::name() const { return impl_->name; }
const std::string& Backend::path() const { return impl_->path; }
const std::string& Backend::version() const { return impl_->version; }
uint32_t Backend::abi_major() const { return impl_->table->abi_major; }
uint32_t Backend::abi_minor() const { return impl_->table->abi_minor; }
uint64_t Backend::generation() const { return impl_->generation; }

std::string Backend::visible_devices_env() const {
  const auto* t = impl_->table;
  if (t->visible_devices_env == nullptr) return "";
  const char* env = t->visible_devices_env();
  return env != nullptr ? env : "";
}

StatusOr<int32_t> Backend::DeviceCount() const {
  int32_t count = 0;
  PC_RETURN_IF_ERROR(TakeError(impl_->table, impl_->table->device_count(&count), "device_count"));
  return count;
}

StatusOr<DeviceProps> Backend::GetProps(int32_t physical) const {
  PC_ASSIGN_OR_RETURN(int32_t count, DeviceCount());
  if (physical < 0 || physical >= count) {
    return InvalidArgument("backend '" + name() + "' has no device " + std::to_string(physical) +
                           " (" + std::to_string(count) + " visible)");
  }
  pc_device_props_t p{};
  p.struct_size = sizeof(p);
  PC_RETURN_IF_ERROR(
      TakeError(impl_->table, impl_->table->device_get_props(physical, &p), "device_get_props"));
  p.name[sizeof(p.name) - 1] = '\0';
  p.physical_id[sizeof(p.physical_id) - 1] = '\0';
  DeviceProps props;
  props.name = p.name;
  props.physical_id = p.physical_id;
  props.total_memory = p.total_memory;
  props.free_memory = p.free_memory;
  props.alignment = p.alignment == 0 ? 1 : p.alignment;
  props.max_alloc_size = p.max_alloc_size;
  props.flags = p.flags;
  props.host_accessible = p.flags & PC_DEVICE_FLAG_HOST_ACCESSIBLE;
  // Honest capabilities: a flag without the member behind it is not a capability.
  props.async_free = (p.flags & PC_DEVICE_FLAG_ASYNC_FREE) && impl_->table->mem_free_async;
  props.async_copy = p.flags & PC_DEVICE_FLAG_ASYNC_COPY;
  props.async_exec = p.flags & PC_DEVICE_FLAG_ASYNC_EXEC;
  props.stream_priority = p.flags & PC_DEVICE_FLAG_STREAM_PRIORITY;
  props.weight_repack = (p.flags & PC_DEVICE_FLAG_WEIGHT_REPACK) && impl_->table->weight_upload;
  props.timing = (p.flags & PC_DEVICE_FLAG_TIMING) && impl_->table->event_elapsed_ms;
  props.priority_low = p.priority_low;
  props.priority_high = p.priority_high;
  props.compute_units = p.compute_units;
  return props;
}

StatusOr<std::shared_ptr<Device>> Backend::OpenDevice(int32_t physical, int32_t logical) {
  PC_ASSIGN_OR_RETURN(DeviceProps props, GetProps(physical));
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& open = impl_->open_devices;
  if (static_cast<size_t>(physical) >= open.size()) open.resize(physical + 1);
  if (auto existing = open[physical].lock()) return existing;
  pc_device_t* handle = nullptr;
  PC_RETURN_IF_ERROR(TakeError(impl_->table, impl_->table->device_open(physical, &handle),
                               "device_open"));
  auto device = std::make_shared<Device>(shared_from_this(), handle, physical,
                                         logical < 0 ? physical : logical, std::move(props));
  open[physical] = device;
  return device;
}

std::vector<std::pair<std::string, double>> Backend::ReadCounters(const Device& device) const {
  std::vector<std::pair<std::string, double>> out;
  const auto* t = impl_->table;
  if (!PC_HAS_MEMBER(t, pc_backend_iface_t, counter_get) || t->counter_count == nullptr ||
      t->counter_get == nullptr) {
    return out;
  }
  auto* dev = static_cast<pc_device_t*>(device.raw());
  int32_t n = t->counter_count(dev);
  for (int32_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    double value = 0;
    Status s = TakeError(t, t->counter_get(dev, i, &name, &value), "counter_get");
    if (s.ok() && name != nullptr) out.emplace_back(name, value);
  }
  return out;
}

std::optional<std::vector<OpCounters>> Backend::ReadOpCounters(const Device& device) const {
  const auto* t = impl_->table;
  if (!PC_HAS_MEMBER(t, pc_backend_iface_t, op_counters_read) || t->op_counters_read == nullptr) {
    return std::nullopt;
  }
  auto* dev = static_cast<pc_device_t*>(device.raw());
  // Sized for every op of this host; grown once if the plugin knows more.
  std::vector<pc_op_counters_t> records(PC_OP_COUNT + 1);
  int32_t n = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    records[0].struct_size = sizeof(pc_op_counters_t);
    n = t->op_counters_read(dev, records.data(), static_cast<int32_t>(records.size()));
    if (n < 0) return std::nullopt;
    if (static_cast<size_t>(n) <= records.size()) break;
    records.assign(n, pc_op_counters_t{});
  }
  std::vector<OpCounters> out;
  for (int32_t i = 0; i < n && static_cast<size_t>(i) < records.size(); ++i) {
    const pc_op_counters_t& r = records[i];
    // A record shorter than its flags member carries nothing we can read.
    if (!PC_HAS_MEMBER(&r, pc_op_counters_t, flags)) continue;
    OpCounters c;
    c.op = r.op;
    c.launches = PC_HAS_MEMBER(&r, pc_op_counters_t, launches) ? r.launches : 0;
    c.has_time = (r.flags & PC_OP_COUNTERS_TIME) && PC_HAS_MEMBER(&r, pc_op_counters_t, device_ns);
    c.has_bytes =
        (r.flags & PC_OP_COUNTERS_BYTES) && PC_HAS_MEMBER(&r, pc_op_counters_t, bytes_written);
    c.has_flops = (r.flags & PC_OP_COUNTERS_FLOPS) && PC_HAS_MEMBER(&r, pc_op_counters_t, flops);
    if (c.has_time) c.device_ns = r.device_ns;
    if (c.has_bytes) {
      c.bytes_read = r.bytes_read;
      c.bytes_written = r.bytes_written;
    }
    if (c.has_flops) c.flops = r.flops;
    out.push_back(c);
  }
  return out;
}

StatusOr<std::vector<std::shared_ptr<Device>>> OpenDevices(
    const std::shared_ptr<Backend>& backend, const std::vector<int32_t>& physical_ids) {
  std::vector<int32_t> ids = physical_ids;
  if (ids.empty()) {
    PC_ASSIGN_OR_RETURN(int32_t count, backend->DeviceCount());
    for (int32_t i = 0; i < count; ++i) ids.push_back(i);
  }
  std::vector<std::shared_ptr<Device>> devices;
  for (size_t logical = 0; logical < ids.size(); ++logical) {
    PC_ASSIGN_OR_RETURN(auto d, backend->OpenDevice(ids[logical], static_cast<int32_t>(logical)));
    devices.push_back(std::move(d));
  }
  return devices;
}

// ---- Device ------------------------------------------------------------------------------

namespace {
const pc_backend_iface_t* T(const Device& d) { return d.backend()->impl().table; }
pc_device_t* H(const Device& d) { return static_cast<pc_device_t*>(d.raw()); }
}  // namespace

Device::Device(std::shared_ptr<Backend> backend, void* handle, int32_t physical, int32_t logical,
               DeviceProps props)
    : backend_(std::move(backend)),
      handle_(handle),
      physical_(physical),
      logical_(logical),
      props_(std::move(props)) {}

Device::~Device() {
  op_fallback_.reset();  // its staged weights live on the fallback device, not here
  T(*this)->device_close(H(*this));
}

void Device::SetOpFallback(std::shared_ptr<Device> fallback) {
  op_fallback_ = fallback ? std::make_shared<OpFallback>(std::move(fallback)) : nullptr;
}

void Device::MarkImmutable(DevPtr ptr, uint64_t bytes) const {
  if (op_fallback_) op_fallback_->MarkImmutable(ptr, bytes);
}

Status Device::MemoryInfo(uint64_t* free_bytes, uint64_t* total_bytes) const {
  uint64_t f = 0, t = 0;
  if (has_memory_query()) {
    PC_RETURN_IF_ERROR(
        TakeError(T(*this), T(*this)->mem_get_info(H(*this), &f, &t), "mem_get_info"));
  } else {
    // Only this process's share is known: another process on the same device is not seen.
    t = props_.total_memory;
    const uint64_t held = held_bytes();
    f = held < t ? t - held : 0;
  }
  if (free_bytes != nullptr) *free_bytes = f;
  if (total_bytes != nullptr) *total_bytes = t;
  return Status::Ok();
}

bool Device::has_memory_query() const {
  return PC_HAS_MEMBER(T(*this), pc_backend_iface_t, mem_get_info) &&
         T(*this)->mem_get_info != nullptr;
}

uint64_t Device::held_bytes() const {
  std::lock_guard<std::mutex> lock(held_mu_);
  return held_;
}

void Device::AccountPluginOwned(int64_t delta_bytes) {
  std::lock_guard<std::mutex> lock(held_mu_);
  held_ = static_cast<uint64_t>(static_cast<int64_t>(held_) + delta_bytes);
}

StatusOr<std::unique_ptr<Stream>> Device::CreateStream(int32_t priority) {
  pc_stream_t* s = nullptr;
  PC_RETURN_IF_ERROR(TakeError(T(*this), T(*this)->stream_create(H(*this), priority, &s),
                               "stream_create"));
  return std::make_unique<Stream>(shared_from_this(), s, priority);
}

StatusOr<std::unique_ptr<Event>> Device::CreateEvent() {
  pc_event_t* e = nullptr;
  PC_RETURN_IF_ERROR(TakeError(T(*this), T(*this)->event_create(H(*this), &e), "event_create"));
  return std::make_unique<Event>(shared_from_this(), e);
}

StatusOr<DevPtr> Device::AllocateRaw(uint64_t bytes) {
  if (props_.max_alloc_size != 0 && bytes > props_.max_alloc_size) {
    return ResourceExhausted("allocation of " + std::to_string(bytes) +
                             " bytes exceeds the max single allocation of " +
                             std::to_string(props_.max_alloc_size) + " bytes of " + props_.name);
  }
  pc_devptr_t p = 0;
  PC_RETURN_IF_ERROR(TakeError(T(*this), T(*this)->mem_alloc(H(*this), bytes, &p), "mem_alloc"));
  std::lock_guard<std::mutex> lock(held_mu_);
  raw_sizes_[p] = bytes;
  held_ += bytes;
  return p;
}

Status Device::FreeRaw(DevPtr ptr) {
  PC_RETURN_IF_ERROR(TakeError(T(*this), T(*this)->mem_free(H(*this), ptr), "mem_free"));
  std::lock_guard<std::mutex> lock(held_mu_);
  if (auto it = raw_sizes_.find(ptr); it != raw_sizes_.end()) {
    held_ -= it->second;
    raw_sizes_.erase(it);
  }
  return Status::Ok();
}

Status Device::FreeRawAsync(const Stream& stream, DevPtr ptr) {
  if (!props_.async_free) {
    return FailedPrecondition(props_.name + " has no stream-ordered free (ASYNC_FREE)");
  }
  PC_RETURN_IF_ERROR(
      TakeError(T(*this), T(*this)->mem_free_async(static_cast<pc_stream_t*>(stream.raw()), ptr),
                "mem_free_async"));
  std::lock_guard<std::mutex> lock(held_mu_);
  if (auto it = raw_sizes_.find(ptr); it != raw_sizes_.end()) {
    held_ -= it->second;
    raw_sizes_.erase(it);
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<DeviceBuffer>> Device::Allocate(uint64_t bytes) {
  PC_ASSIGN_OR_RETURN(DevPtr p, AllocateRaw(bytes));
  return std::make_unique<DeviceBuffer>(shared_from_this(), p, bytes);
}

StatusOr<Device::HostBuffer> Device::HostAlloc(uint64_t bytes) {
  HostBuffer buf;
  buf.bytes = bytes;
  if (T(*this)->host_alloc != nullptr) {
    PC_RETURN_IF_ERROR(TakeError(T(*this), T(*this)->host_alloc(H(*this), bytes, &buf.data),
                                 "host_alloc"));
    buf.pinned = true;
    return buf;
  }
  const uint64_t align = 4096;
  buf.data = std::aligned_alloc(align, (bytes + align - 1) / align * align);
  if (buf.data == nullptr) {
    return ResourceExhausted("host allocation of " + std::to_string(bytes) + " bytes failed");
  }
  return buf;
}

void Device::HostFree(const HostBuffer& buffer) {
  if (buffer.data == nullptr) return;
  if (buffer.pinned) {
    T(*this)->host_free(H(*this), buffer.data);
  } else {
    std::free(buffer.data);
  }
}

// ---- Stream ------------------------------------------------------------------------------

namespace {
pc_stream_t* S(const Stream& s) { return static_cast<pc_stream_t*>(s.raw()); }
}  // namespace

Stream::Stream(std::shared_ptr<Device> device, void* handle, int32_t priority)
    : device_(std::move(device)), handle_(handle), priority_(priority) {}

Stream::~Stream() { T(*device_)->stream_destroy(S(*this)); }

Status Stream::CopyH2D(DevPtr dst, const void* src, uint64_t bytes) {
  return TakeError(T(*device_), T(*device_)->memcpy_h2d(S(*this), dst, src, bytes), "memcpy_h2d");
}

Status Stream::CopyD2H(void* dst, DevPtr src, uint64_t bytes) {
  return TakeError(T(*device_), T(*device_)->memcpy_d2h(S(*this), dst, src, bytes), "memcpy_d2h");
}

Status Stream::CopyD2D(DevPtr dst, DevPtr src, uint64_t bytes) {
  return TakeError(T(*device_), T(*device_)->memcpy_d2d(S(*this), dst, src, bytes), "memcpy_d2d");
}

namespace {

// 1 MiB of one byte value, for fills by copy. Static and never written after it is made, so a
// copy still queued on a stream may read it at any later time.
const uint8_t* FillPattern(uint8_t value, uint64_t* bytes) {
  constexpr uint64_t kBytes = 1 << 20;
  static std::mutex mu;
  static std::map<uint8_t, std::unique_ptr<uint8_t[]>> patterns;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = patterns[value];
  if (p == nullptr) {
    p = std::make_unique<uint8_t[]>(kBytes);
    std::memset(p.get(), value, kBytes);
  }
  *bytes = kBytes;
  return p.get();
}

}  // namespace

Status Stream::Memset(DevPtr dst, uint8_t value, uint64_t bytes) {
  const pc_backend_iface_t* t = T(*device_);
  if (PC_HAS_MEMBER(t, pc_backend_iface_t, memset) && t->memset != nullptr) {
    return TakeError(t, t->memset(S(*this), dst, value, bytes), "memset");
  }
  uint64_t chunk = 0;
  const uint8_t* pattern = FillPattern(value, &chunk);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(chunk, bytes - done);
    PC_RETURN_IF_ERROR(CopyH2D(dst + done, pattern, n));
    done += n;
  }
  return Status::Ok();
}

Status Stream::WaitEvent(const Event& event) {
  return TakeError(T(*device_),
                   T(*device_)->stream_wait_event(S(*this), static_cast<pc_event_t*>(event.raw())),
                   "stream_wait_event");
}

Status Stream::Synchronize() {
  return TakeError(T(*device_), T(*device_)->stream_synchronize(S(*this)), "stream_synchronize");
}

// ---- Event -------------------------------------------------------------------------------

namespace {
pc_event_t* E(const Event& e) { return static_cast<pc_event_t*>(e.raw()); }
}  // namespace

Event::Event(std::shared_ptr<Device> device, void* handle)
    : device_(std::move(device)), handle_(handle) {}

Event::~Event() { T(*device_)->event_destroy(E(*this)); }

Status Event::Record(const Stream& stream) {
  PC_RETURN_IF_ERROR(
      TakeError(T(*device_), T(*device_)->event_record(E(*this), S(stream)), "event_record"));
  pending_ = true;
  return Status::Ok();
}

bool Event::has_query() const {
  return PC_HAS_MEMBER(T(*device_), pc_backend_iface_t, event_query) &&
         T(*device_)->event_query != nullptr;
}

StatusOr<bool> Event::Query() const {
  if (!has_query()) return !pending_;
  int32_t done = 0;
  PC_RETURN_IF_ERROR(TakeError(T(*device_), T(*device_)->event_query(E(*this), &done),
                               "event_query"));
  return done != 0;
}

Status Event::Synchronize() const {
  PC_RETURN_IF_ERROR(
      TakeError(T(*device_), T(*device_)->event_synchronize(E(*this)), "event_synchronize"));
  pending_ = false;
  return Status::Ok();
}

StatusOr<float> Event::ElapsedMs(const Event& start, const Event& end) {
  const auto* t = T(*start.device_);
  if (t->event_elapsed_ms == nullptr) {
    return Unimplemented(std::string(t->name) + " does not time events (no event_elapsed_ms)");
  }
  float ms = 0;
  PC_RETURN_IF_ERROR(TakeError(t, t->event_elapsed_ms(E(start), E(end), &ms), "event_elapsed_ms"));
  return ms;
}

// ---- DeviceBuffer ------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(std::shared_ptr<Device> device, DevPtr ptr, uint64_t size)
    : device_(std::move(device)), ptr_(ptr), size_(size) {}

DeviceBuffer::~DeviceBuffer() {
  Status s = device_->FreeRaw(ptr_);
  if (!s.ok()) Log().error("DeviceBuffer: {}", s.ToString());
}

}  // namespace polychip::runtime
