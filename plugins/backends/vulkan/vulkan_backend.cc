// The Vulkan device plugin: the ABI table over vk_context (devices, memory, streams, events)
// and vk_ops (kernels). What it claims, honestly:
//   - device memory is not host memory (no HOST_ACCESSIBLE, even where the driver's device-local
//     memory happens to be host-visible, as on lavapipe); copies go through staging;
//   - copies and ops run asynchronously (ASYNC_COPY, ASYNC_EXEC); mem_free waits for the device
//     (no ASYNC_FREE);
//   - TIMING where the queue family has timestamps;
//   - stream priorities 0 (normal) and 1 (high) where the driver has the global-priority
//     extension and a second compute queue family (queue_plan.h); else none (low == high).
// Parameters: devices ("0,2": indices among the visible devices; a bare "2": a count, the first
// two, as for the emu plugin), block_mb (device memory
// block size), staging_mb (per-stream staging ring), op_counters (on|off, default on: per-op
// launches, bytes, FLOPs and device time from timestamp queries). POLYCHIP_VULKAN_DEVICE
// restricts the visible devices (indices into vkEnumeratePhysicalDevices), like
// CUDA_VISIBLE_DEVICES.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/plugin_util.h"
#include "vk_context.h"

using polychip::sdk::Guard;
using polychip::sdk::MakeError;
namespace pv = polychip::vulkan;

namespace {

constexpr const char* kEnv = "POLYCHIP_VULKAN_DEVICE";

struct State {
  const pc_host_services_t* host = nullptr;
  pv::Vk vk;
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<pv::PhysicalInfo> devices;
  uint64_t block_bytes = 256ull << 20;
  uint64_t staging_bytes = 32ull << 20;
  bool count_ops = true;
  std::mutex mu;
  std::vector<pc_device*> open;
};
State& G() {
  static State s;
  return s;
}

void Log(pc_log_level_t level, const std::string& msg) {
  const pc_host_services_t* h = G().host;
  if (h && h->log) h->log(h->host_ctx, level, "vulkan", msg.c_str());
}

pc_error_t* BadArg(const std::string& msg) { return MakeError(PC_CODE_INVALID_ARGUMENT, msg); }
pc_error_t* VkError(const std::string& what, VkResult r) {
  const bool oom = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY;
  return MakeError(oom ? PC_CODE_RESOURCE_EXHAUSTED : PC_CODE_INTERNAL,
                   what + ": " + pv::VkResultName(r));
}

// The devices this process sees (env, then `devices`), usable ones only; *why otherwise.
bool Enumerate(const pv::Vk& vk, VkInstance instance, const std::string& param,
               std::vector<pv::PhysicalInfo>* out, std::string* why, bool* bad_list = nullptr) {
  uint32_t n = 0;
  vk.vkEnumeratePhysicalDevices(instance, &n, nullptr);
  std::vector<VkPhysicalDevice> all(n);
  if (n) vk.vkEnumeratePhysicalDevices(instance, &n, all.data());
  std::vector<VkPhysicalDevice> picked;
  if (!pv::SelectDevices(all, std::getenv(kEnv), param, &picked, why)) {
    if (bad_list) *bad_list = true;
    return false;
  }
  out->clear();
  std::string skipped;
  for (VkPhysicalDevice pd : picked) {
    pv::PhysicalInfo info = pv::Inspect(vk, pd);
    if (!info.why_unusable.empty()) {
      skipped += std::string(skipped.empty() ? "" : "; ") + info.props.deviceName + ": " +
                 info.why_unusable;
      continue;
    }
    out->push_back(std::move(info));
  }
  if (out->empty()) {
    *why = n == 0 ? "no Vulkan physical device (is a driver such as mesa-vulkan-drivers installed?)"
                  : picked.empty() ? std::string("no Vulkan device left visible by ") + kEnv
                                   : "no usable Vulkan device (" + skipped + ")";
    return false;
  }
  return true;
}

pc_error_t* Initialize(const pc_param_t* params, size_t n_params) {
  return Guard([&]() -> pc_error_t* {
    State& s = G();
    std::string devices_param;
    s.block_bytes = 256ull << 20;
    s.staging_bytes = 32ull << 20;
    s.count_ops = true;
    for (size_t i = 0; i < n_params; ++i) {
      const std::string key = params[i].key ? params[i].key : "";
      const char* value = params[i].value ? params[i].value : "";
      long long v = 0;
      if (key == "devices") {
        devices_param = value;
      } else if (key == "op_counters") {
        if (std::strcmp(value, "on") != 0 && std::strcmp(value, "off") != 0)
          return BadArg(std::string("parameter op_counters must be on or off, got '") + value +
                        "'");
        s.count_ops = std::strcmp(value, "on") == 0;
      } else if (key == "block_mb" || key == "staging_mb") {
        if (!polychip::sdk::ParseInt(value, &v) || v < 1 || v > (1 << 20))
          return BadArg("parameter " + key + " must be a positive number of MiB, got '" +
                        value + "'");
        (key == "block_mb" ? s.block_bytes : s.staging_bytes) = static_cast<uint64_t>(v) << 20;
      } else {
        Log(PC_LOG_WARNING, "unknown parameter '" + key + "' ignored");
      }
    }
    std::string why;
    if (!s.vk.library && !pv::OpenLoader(&s.vk, &why)) return MakeError(PC_CODE_UNAVAILABLE, why);
    if (s.instance == VK_NULL_HANDLE && !pv::CreateInstance(&s.vk, &s.instance, &why))
      return MakeError(PC_CODE_UNAVAILABLE, why);
    bool bad_list = false;
    if (!Enumerate(s.vk, s.instance, devices_param, &s.devices, &why, &bad_list))
      return MakeError(bad_list ? PC_CODE_INVALID_ARGUMENT : PC_CODE_UNAVAILABLE, why);
    long long asked = 0;
    if (devices_param.find(',') == std::string::npos &&
        polychip::sdk::ParseInt(devices_param.c_str(), &asked) &&
        asked > static_cast<long long>(s.devices.size())) {
      Log(PC_LOG_WARNING, "parameter devices asks for " + devices_param + " devices, " +
                              std::to_string(s.devices.size()) + " visible: using those");
    }
    std::lock_guard<std::mutex> lock(s.mu);
    s.open.assign(s.devices.size(), nullptr);
    for (size_t i = 0; i < s.devices.size(); ++i) {
      const auto& d = s.devices[i];
      Log(PC_LOG_INFO, "device " + std::to_string(i) + ": " + d.props.deviceName + ", heap " +
                           std::to_string(d.heap_size >> 20) + " MiB, maxStorageBufferRange " +
                           std::to_string(d.props.limits.maxStorageBufferRange >> 20) +
                           " MiB, stream priorities: " +
                           (d.queues.has_priorities()
                                ? "high on queue family " + std::to_string(d.queues.high_family)
                                : "none (" + d.queues.why_no_priorities + ")"));
    }
    return nullptr;
  });
}

void Shutdown() {
  State& s = G();
  s.devices.clear();
  if (s.instance) s.vk.vkDestroyInstance(s.instance, nullptr);
  s.instance = VK_NULL_HANDLE;
  pv::CloseLoader(&s.vk);
}

pc_error_t* DeviceCount(int32_t* count) {
  if (!count) return BadArg("count is null");
  *count = static_cast<int32_t>(G().devices.size());
  return nullptr;
}

uint64_t MaxAlloc(const pv::PhysicalInfo& d) { return std::min(d.max_alloc, d.heap_size); }
uint64_t Alignment(const pv::PhysicalInfo& d) {
  return std::max<uint64_t>(256, d.props.limits.minStorageBufferOffsetAlignment);
}

pc_error_t* DeviceGetProps(int32_t ordinal, pc_device_props_t* props) {
  return Guard([&]() -> pc_error_t* {
    if (!props || props->struct_size < sizeof(size_t)) return BadArg("props is null or too small");
    State& s = G();
    if (ordinal < 0 || ordinal >= static_cast<int32_t>(s.devices.size()))
      return BadArg("no such device ordinal");
    const pv::PhysicalInfo& d = s.devices[ordinal];
    pc_device_props_t p{};
    p.struct_size = sizeof(p);
    const char* type = d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU ? "discrete GPU"
                       : d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU
                           ? "integrated GPU"
                       : d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? "CPU"
                                                                           : "other";
    const std::string name = std::string(d.props.deviceName) + " (Vulkan " +
                             std::to_string(VK_API_VERSION_MAJOR(d.props.apiVersion)) + "." +
                             std::to_string(VK_API_VERSION_MINOR(d.props.apiVersion)) + ", " +
                             type + ")";
    std::snprintf(p.name, sizeof(p.name), "%s", name.c_str());
    char uuid[2 * VK_UUID_SIZE + 1] = {};
    for (uint32_t i = 0; i < VK_UUID_SIZE; ++i) std::snprintf(uuid + 2 * i, 3, "%02x", d.uuid[i]);
    std::snprintf(p.physical_id, sizeof(p.physical_id), "vulkan-%s", uuid);
    p.total_memory = d.heap_size;
    p.free_memory = d.heap_size;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.open[ordinal]) {
        pv::Device& dev = s.open[ordinal]->d;
        std::lock_guard<std::mutex> mlock(dev.mem_mu);
        p.free_memory = d.heap_size - std::min(d.heap_size, dev.used);
      }
    }
    p.alignment = Alignment(d);
    p.max_alloc_size = MaxAlloc(d);
    p.flags = PC_DEVICE_FLAG_ASYNC_COPY | PC_DEVICE_FLAG_ASYNC_EXEC;
    if (d.timestamps) p.flags |= PC_DEVICE_FLAG_TIMING;
    p.priority_low = 0;
    p.priority_high = d.queues.has_priorities() ? 1 : 0;
    if (d.queues.has_priorities()) p.flags |= PC_DEVICE_FLAG_STREAM_PRIORITY;
    p.compute_units = 1;
    // The caller's struct may be older (shorter) than ours: copy only what it declared.
    polychip::sdk::CopyToCallerStruct(p, props);
    return nullptr;
  });
}

// Creates d->device with the queues of the device's plan: the normal family's, and the
// high-priority family's at its global priority. A driver that refuses the priority
// (VK_ERROR_NOT_PERMITTED: HIGH needs privileges on some) gets a device without it, and the
// device reports no priorities from then on.
VkResult CreateDevice(State& s, int32_t ordinal, pv::Device* d) {
  for (;;) {
    const pv::QueuePlan& plan = s.devices[ordinal].queues;
    const std::vector<float> weights(pv::kMaxQueuesPerFamily, 1.0f);
    VkDeviceQueueGlobalPriorityCreateInfoKHR high_priority{
        VK_STRUCTURE_TYPE_DEVICE_QUEUE_GLOBAL_PRIORITY_CREATE_INFO_KHR};
    high_priority.globalPriority = plan.high_priority;
    VkDeviceQueueCreateInfo qi[2] = {{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO},
                                     {VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO}};
    qi[0].queueFamilyIndex = plan.normal_family;
    qi[0].queueCount = plan.normal_count;
    qi[0].pQueuePriorities = weights.data();
    qi[1].pNext = &high_priority;
    qi[1].queueFamilyIndex = plan.high_family;
    qi[1].queueCount = plan.high_count;
    qi[1].pQueuePriorities = weights.data();
    VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    f12.timelineSemaphore = VK_TRUE;
    f12.bufferDeviceAddress = d->info.buffer_device_address ? VK_TRUE : VK_FALSE;
    VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    f2.pNext = &f12;
    f2.features.shaderInt64 = d->info.int64 ? VK_TRUE : VK_FALSE;
    VkDeviceCreateInfo ci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    ci.pNext = &f2;
    ci.queueCreateInfoCount = plan.has_priorities() ? 2 : 1;
    ci.pQueueCreateInfos = qi;
    ci.enabledExtensionCount = plan.has_priorities() ? 1 : 0;
    ci.ppEnabledExtensionNames = &plan.extension;
    const VkResult r = s.vk.vkCreateDevice(d->info.handle, &ci, nullptr, &d->device);
    if (r == VK_ERROR_NOT_PERMITTED_KHR && plan.has_priorities()) {
      Log(PC_LOG_WARNING, "device " + std::to_string(ordinal) +
                              ": the driver refused HIGH global priority (not permitted); "
                              "streams have no priorities");
      s.devices[ordinal].queues = plan.WithoutPriorities("HIGH global priority not permitted");
      d->info.queues = s.devices[ordinal].queues;
      continue;
    }
    if (r != VK_SUCCESS) return r;
    d->high_first = plan.normal_count;
    d->queues.resize(plan.normal_count + plan.high_count);
    d->queue_mu = std::make_unique<std::mutex[]>(d->queues.size());
    for (uint32_t i = 0; i < plan.normal_count; ++i)
      s.vk.vkGetDeviceQueue(d->device, plan.normal_family, i, &d->queues[i]);
    for (uint32_t i = 0; i < plan.high_count; ++i)
      s.vk.vkGetDeviceQueue(d->device, plan.high_family, i, &d->queues[plan.normal_count + i]);
    return VK_SUCCESS;
  }
}

pc_error_t* DeviceOpen(int32_t ordinal, pc_device_t** device) {
  return Guard([&]() -> pc_error_t* {
    if (!device) return BadArg("device is null");
    State& s = G();
    std::lock_guard<std::mutex> lock(s.mu);
    if (ordinal < 0 || ordinal >= static_cast<int32_t>(s.devices.size()))
      return BadArg("no such device ordinal");
    if (s.open[ordinal]) return MakeError(PC_CODE_FAILED_PRECONDITION, "device already open");
    auto h = std::make_unique<pc_device>();
    pv::Device& d = h->d;
    d.vk = &s.vk;
    d.ordinal = ordinal;
    d.info = s.devices[ordinal];
    d.alignment = Alignment(d.info);
    d.info.max_alloc = MaxAlloc(d.info);
    d.block_bytes = std::min(s.block_bytes, d.info.max_alloc);
    d.count_ops = s.count_ops;
    d.op_counters.set_flags(PC_OP_COUNTERS_BYTES | PC_OP_COUNTERS_FLOPS |
                            (d.info.timestamps ? PC_OP_COUNTERS_TIME : 0u));

    VkResult r = CreateDevice(s, ordinal, &d);
    if (r != VK_SUCCESS) return VkError("vkCreateDevice", r);
    if (pc_error_t* e = d.Alloc(256, &d.dummy)) {
      s.vk.vkDestroyDevice(d.device, nullptr);
      return e;
    }
    *device = h.release();
    s.open[ordinal] = *device;
    return nullptr;
  });
}

void DeviceClose(pc_device_t* device) {
  if (!device) return;
  pv::Device& d = device->d;
  d.WaitIdle();
  State& s = G();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (d.ordinal < static_cast<int32_t>(s.open.size())) s.open[d.ordinal] = nullptr;
  }
  s.vk.vkDeviceWaitIdle(d.device);
  pv::DestroyKernels(d);
  for (auto& [id, b] : d.blocks) {
    if (b->texels) s.vk.vkDestroyBufferView(d.device, b->texels, nullptr);
    s.vk.vkDestroyBuffer(d.device, b->buffer, nullptr);
    s.vk.vkFreeMemory(d.device, b->memory, nullptr);
  }
  d.blocks.clear();
  s.vk.vkDestroyDevice(d.device, nullptr);
  delete device;
}

const char* VisibleDevicesEnv() { return kEnv; }

// ---- memory -----------------------------------------------------------------------------------

pc_error_t* MemAlloc(pc_device_t* device, uint64_t size, pc_devptr_t* out) {
  if (!device || !out) return BadArg("null argument");
  return Guard([&] { return device->d.Alloc(size, out); });
}

pc_error_t* MemFree(pc_device_t* device, pc_devptr_t ptr) {
  if (!device) return BadArg("device is null");
  return Guard([&] { return device->d.Free(ptr); });
}

pc_error_t* MemGetInfo(pc_device_t* device, uint64_t* free_bytes, uint64_t* total_bytes) {
  if (!device || !free_bytes || !total_bytes) return BadArg("null argument");
  pv::Device& d = device->d;
  std::lock_guard<std::mutex> lock(d.mem_mu);
  *total_bytes = d.info.heap_size;
  *free_bytes = d.info.heap_size - std::min(d.info.heap_size, d.used);
  return nullptr;
}

pc_error_t* Resolve(pv::Device& d, pc_devptr_t p, uint64_t n, const char* what, pv::Block** b,
                    uint64_t* off) {
  *b = d.Resolve(p, std::max<uint64_t>(n, 1), off);
  if (!*b) {
    return BadArg(std::string(what) + " is not valid memory of vulkan device " +
                  std::to_string(d.ordinal));
  }
  return nullptr;
}

// Copies in pieces of at most half the staging ring.
template <typename F>
pc_error_t* Pieces(pv::StreamState& s, uint64_t n, F&& piece) {
  const uint64_t step = std::max<uint64_t>(s.staging.size / 2, 1);
  for (uint64_t done = 0; done < n; done += step) {
    const uint64_t len = std::min(step, n - done);
    VkResult r = s.Begin();
    uint64_t staging = 0;
    if (r == VK_SUCCESS) r = s.Staging(len, &staging);
    if (r != VK_SUCCESS) return VkError("staging", r);
    s.Barrier();
    piece(done, len, staging);
  }
  return nullptr;
}

pc_error_t* MemcpyH2D(pc_stream_t* stream, pc_devptr_t dst, const void* src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || (n && !src)) return BadArg("null argument");
    if (n == 0) return nullptr;
    pv::StreamState& s = *stream->s;
    pv::Block* b = nullptr;
    uint64_t off = 0;
    if (pc_error_t* e = Resolve(*s.device, dst, n, "memcpy_h2d destination", &b, &off)) return e;
    std::lock_guard<std::mutex> lock(s.mu);
    return Pieces(s, n, [&](uint64_t done, uint64_t len, uint64_t staging) {
      std::memcpy(s.staging.mapped + staging, static_cast<const uint8_t*>(src) + done, len);
      VkBufferCopy c{staging, off + done, len};
      s.device->vk->vkCmdCopyBuffer(s.open->cb, s.staging.buffer, b->buffer, 1, &c);
    });
  });
}

pc_error_t* MemcpyD2H(pc_stream_t* stream, void* dst, pc_devptr_t src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || (n && !dst)) return BadArg("null argument");
    if (n == 0) return nullptr;
    pv::StreamState& s = *stream->s;
    pv::Block* b = nullptr;
    uint64_t off = 0;
    if (pc_error_t* e = Resolve(*s.device, src, n, "memcpy_d2h source", &b, &off)) return e;
    std::lock_guard<std::mutex> lock(s.mu);
    return Pieces(s, n, [&](uint64_t done, uint64_t len, uint64_t staging) {
      VkBufferCopy c{off + done, staging, len};
      s.device->vk->vkCmdCopyBuffer(s.open->cb, b->buffer, s.staging.buffer, 1, &c);
      // Copied out to the caller's memory when the batch retires (synchronize, event).
      s.open->host_copies.push_back({static_cast<uint8_t*>(dst) + done, staging, len});
    });
  });
}

pc_error_t* MemcpyD2D(pc_stream_t* stream, pc_devptr_t dst, pc_devptr_t src, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("null argument");
    if (n == 0) return nullptr;
    pv::StreamState& s = *stream->s;
    pv::Block *bs = nullptr, *bd = nullptr;
    uint64_t os = 0, od = 0;
    if (pc_error_t* e = Resolve(*s.device, src, n, "memcpy_d2d source", &bs, &os)) return e;
    if (pc_error_t* e = Resolve(*s.device, dst, n, "memcpy_d2d destination", &bd, &od)) return e;
    std::lock_guard<std::mutex> lock(s.mu);
    VkResult r = s.Begin();
    if (r != VK_SUCCESS) return VkError("memcpy_d2d", r);
    s.Barrier();
    VkBufferCopy c{os, od, n};
    s.device->vk->vkCmdCopyBuffer(s.open->cb, bs->buffer, bd->buffer, 1, &c);
    return nullptr;
  });
}

pc_error_t* Memset(pc_stream_t* stream, pc_devptr_t dst, uint8_t value, uint64_t n) {
  return Guard([&]() -> pc_error_t* {
    if (!stream) return BadArg("null argument");
    if (n == 0) return nullptr;
    pv::StreamState& s = *stream->s;
    pv::Block* b = nullptr;
    uint64_t off = 0;
    if (pc_error_t* e = Resolve(*s.device, dst, n, "memset destination", &b, &off)) return e;
    std::lock_guard<std::mutex> lock(s.mu);
    const pv::Vk& vk = *s.device->vk;
    // vkCmdFillBuffer fills whole words; the unaligned head and tail bytes come from staging.
    const uint64_t begin = (off + 3) / 4 * 4, end = std::max(begin, (off + n) / 4 * 4);
    VkResult r = s.Begin();
    if (r != VK_SUCCESS) return VkError("memset", r);
    s.Barrier();
    if (end > begin) {
      const uint32_t word = 0x01010101u * value;
      vk.vkCmdFillBuffer(s.open->cb, b->buffer, begin, end - begin, word);
    }
    for (auto [from, to] : {std::pair{off, std::min(begin, off + n)}, std::pair{std::max(end, off), off + n}}) {
      if (to <= from) continue;
      uint64_t staging = 0;
      r = s.Staging(to - from, &staging);
      if (r != VK_SUCCESS) return VkError("memset", r);
      std::memset(s.staging.mapped + staging, value, to - from);
      s.Barrier();
      VkBufferCopy c{staging, from, to - from};
      vk.vkCmdCopyBuffer(s.open->cb, s.staging.buffer, b->buffer, 1, &c);
    }
    return nullptr;
  });
}

pc_error_t* HostAlloc(pc_device_t* device, uint64_t size, void** out) {
  // Plain host memory: the staging ring is the pinned memory the copies go through.
  if (!device || !out) return BadArg("null argument");
  *out = std::malloc(std::max<uint64_t>(size, 1));
  return *out ? nullptr : MakeError(PC_CODE_RESOURCE_EXHAUSTED, "host_alloc: out of host memory");
}
void HostFree(pc_device_t*, void* ptr) { std::free(ptr); }

// ---- streams and events -----------------------------------------------------------------------

pc_error_t* StreamCreate(pc_device_t* device, int32_t priority, pc_stream_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    pv::Device& d = device->d;
    const pv::Vk& vk = *d.vk;
    auto st = std::make_shared<pv::StreamState>();
    st->device = &d;
    // Priority 1 (and above: out-of-range values clamp) takes a high-priority queue where the
    // device has them; everything else a normal one.
    const uint32_t n_high = static_cast<uint32_t>(d.queues.size()) - d.high_first;
    const bool high = priority >= 1 && n_high > 0;
    {
      std::lock_guard<std::mutex> lock(d.streams_mu);
      st->queue_index = high ? d.high_first + d.next_high_queue++ % n_high
                             : d.next_queue++ % d.high_first;
    }
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
    pi.queueFamilyIndex = high ? d.info.queues.high_family : d.info.queues.normal_family;
    VkResult r = vk.vkCreateCommandPool(d.device, &pi, nullptr, &st->command_pool);
    VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO};
    ti.semaphoreType = VK_SEMAPHORE_TYPE_TIMELINE;
    VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO};
    si.pNext = &ti;
    if (r == VK_SUCCESS) r = vk.vkCreateSemaphore(d.device, &si, nullptr, &st->timeline);
    if (r == VK_SUCCESS) r = d.CreateHostBuffer(G().staging_bytes, &st->staging);
    if (r != VK_SUCCESS) return VkError("stream_create", r);
    {
      std::lock_guard<std::mutex> lock(d.streams_mu);
      std::erase_if(d.streams, [](const auto& w) { return w.expired(); });
      d.streams.push_back(st);
    }
    *out = new pc_stream{std::move(st)};
    return nullptr;
  });
}

void StreamDestroy(pc_stream_t* stream) {
  if (!stream) return;
  {
    std::lock_guard<std::mutex> lock(stream->s->mu);
    if (stream->s->Flush() == VK_SUCCESS) stream->s->WaitFor(stream->s->submitted);
  }
  delete stream;  // the Vulkan objects go when the last event recorded on it does
}

pc_error_t* StreamSynchronize(pc_stream_t* stream) {
  if (!stream) return BadArg("stream is null");
  return Guard([&]() -> pc_error_t* {
    pv::StreamState& s = *stream->s;
    std::lock_guard<std::mutex> lock(s.mu);
    VkResult r = s.Flush();
    if (r == VK_SUCCESS) r = s.WaitFor(s.submitted);
    if (r != VK_SUCCESS) return VkError("stream_synchronize", r);
    if (!s.error.empty()) {
      std::string e = std::move(s.error);
      s.error.clear();
      return MakeError(PC_CODE_INTERNAL, e);
    }
    return nullptr;
  });
}

pc_error_t* EventCreate(pc_device_t* device, pc_event_t** out) {
  return Guard([&]() -> pc_error_t* {
    if (!device || !out) return BadArg("null argument");
    auto e = std::make_unique<pc_event>();
    e->device = &device->d;
    if (device->d.info.timestamps) {
      VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = 1;
      VkResult r = device->d.vk->vkCreateQueryPool(device->d.device, &qi, nullptr, &e->timestamps);
      if (r != VK_SUCCESS) return VkError("event_create", r);
    }
    *out = e.release();
    return nullptr;
  });
}

void EventDestroy(pc_event_t* event) {
  if (!event) return;
  if (event->timestamps) {
    // A pending record still writes its timestamp: wait for it first.
    if (event->stream && event->value) {
      std::lock_guard<std::mutex> lock(event->stream->mu);
      event->stream->WaitFor(event->value);
    }
    event->device->vk->vkDestroyQueryPool(event->device->device, event->timestamps, nullptr);
  }
  delete event;
}

pc_error_t* EventRecord(pc_event_t* event, pc_stream_t* stream) {
  return Guard([&]() -> pc_error_t* {
    if (!event || !stream) return BadArg("null argument");
    pv::StreamState& s = *stream->s;
    if (event->device != s.device) return BadArg("event and stream on different devices");
    std::lock_guard<std::mutex> elock(event->mu);
    std::lock_guard<std::mutex> lock(s.mu);
    VkResult r = VK_SUCCESS;
    if (event->timestamps) {
      r = s.Begin();
      if (r != VK_SUCCESS) return VkError("event_record", r);
      s.Barrier();
      s.device->vk->vkCmdResetQueryPool(s.open->cb, event->timestamps, 0, 1);
      s.device->vk->vkCmdWriteTimestamp(s.open->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT,
                                        event->timestamps, 0);
    }
    // Submitting now: a waiter on another stream (or the host) must not wait for a batch that
    // this stream would otherwise keep open.
    r = s.Flush();
    if (r != VK_SUCCESS) return VkError("event_record", r);
    event->stream = stream->s;
    event->value = s.submitted;
    event->stamped = event->timestamps != VK_NULL_HANDLE;
    return nullptr;
  });
}

pc_error_t* StreamWaitEvent(pc_stream_t* stream, pc_event_t* event) {
  return Guard([&]() -> pc_error_t* {
    if (!stream || !event) return BadArg("null argument");
    pv::StreamState& s = *stream->s;
    if (event->device != s.device) return BadArg("event and stream on different devices");
    std::shared_ptr<pv::StreamState> from;
    uint64_t value = 0;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      from = event->stream;
      value = event->value;
    }
    if (!from || value == 0 || from.get() == &s) return nullptr;  // nothing to wait for
    std::lock_guard<std::mutex> lock(s.mu);
    // Work already recorded must not wait: submit it, then the wait applies to what follows.
    VkResult r = s.Flush();
    if (r != VK_SUCCESS) return VkError("stream_wait_event", r);
    s.waits.push_back({from->timeline, value});
    s.wait_owners.push_back(std::move(from));
    return nullptr;
  });
}

// The stream and value of the event's latest record (null stream: never recorded).
std::pair<std::shared_ptr<pv::StreamState>, uint64_t> Mark(pc_event_t* e) {
  std::lock_guard<std::mutex> lock(e->mu);
  return {e->stream, e->value};
}

pc_error_t* EventQuery(pc_event_t* event, int32_t* done) {
  if (!event || !done) return BadArg("null argument");
  return Guard([&]() -> pc_error_t* {
    auto [s, value] = Mark(event);
    *done = 1;
    if (!s || value == 0) return nullptr;
    uint64_t reached = 0;
    VkResult r = s->device->vk->vkGetSemaphoreCounterValue(s->device->device, s->timeline, &reached);
    if (r != VK_SUCCESS) return VkError("event_query", r);
    if (reached < value) {
      *done = 0;
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(s->mu);
    r = s->Retire(false);  // the host copies before the event land now
    return r == VK_SUCCESS ? nullptr : VkError("event_query", r);
  });
}

pc_error_t* EventSynchronize(pc_event_t* event) {
  if (!event) return BadArg("event is null");
  return Guard([&]() -> pc_error_t* {
    auto [s, value] = Mark(event);
    if (!s || value == 0) return nullptr;
    std::lock_guard<std::mutex> lock(s->mu);
    VkResult r = s->WaitFor(value);
    return r == VK_SUCCESS ? nullptr : VkError("event_synchronize", r);
  });
}

pc_error_t* EventElapsedMs(pc_event_t* start, pc_event_t* end, float* ms) {
  if (!start || !end || !ms) return BadArg("null argument");
  return Guard([&]() -> pc_error_t* {
    if (!start->timestamps || !end->timestamps || !start->stamped || !end->stamped)
      return MakeError(PC_CODE_FAILED_PRECONDITION, "both events must be recorded");
    int32_t done_a = 0, done_b = 0;
    if (pc_error_t* e = EventQuery(start, &done_a)) return e;
    if (pc_error_t* e = EventQuery(end, &done_b)) return e;
    if (!done_a || !done_b)
      return MakeError(PC_CODE_FAILED_PRECONDITION, "both events must be complete");
    const pv::Device& d = *start->device;
    uint64_t t[2] = {};
    for (int i = 0; i < 2; ++i) {
      VkResult r = d.vk->vkGetQueryPoolResults(d.device, i ? end->timestamps : start->timestamps,
                                               0, 1, sizeof(uint64_t), &t[i], sizeof(uint64_t),
                                               VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
      if (r != VK_SUCCESS) return VkError("event_elapsed_ms", r);
    }
    const double ticks = t[1] >= t[0] ? double(t[1] - t[0]) : -double(t[0] - t[1]);
    *ms = static_cast<float>(ticks * d.info.props.limits.timestampPeriod / 1e6);
    return nullptr;
  });
}

// ---- compute ----------------------------------------------------------------------------------

int32_t OpSupports(pc_device_t* device, const pc_op_query_t* query) {
  if (!device || !PC_HAS_MEMBER(query, pc_op_query_t, shape_class)) return 0;
  return pv::OpSupports(device->d, *query);
}

pc_error_t* OpLaunch(pc_stream_t* stream, pc_op_t op, const void* args) {
  if (!stream) return BadArg("stream is null");
  if (!args) return BadArg("args is null");
  return Guard([&] { return pv::OpLaunch(*stream->s, op, args); });
}

int32_t OpCountersRead(pc_device_t* device, pc_op_counters_t* out, int32_t capacity) {
  if (!device || !device->d.count_ops) return -1;
  return device->d.op_counters.Read(out, capacity);
}

const pc_backend_iface_t kIface = [] {
  pc_backend_iface_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = PC_ABI_MAJOR;
  t.abi_minor = PC_ABI_MINOR;
  t.name = "vulkan";
  t.version = "0.1.0";
  t.error_code = polychip::sdk::ErrorCode;
  t.error_message = polychip::sdk::ErrorMessage;
  t.error_destroy = polychip::sdk::ErrorDestroy;
  t.initialize = Initialize;
  t.shutdown = Shutdown;
  t.device_count = DeviceCount;
  t.device_get_props = DeviceGetProps;
  t.device_open = DeviceOpen;
  t.device_close = DeviceClose;
  t.visible_devices_env = VisibleDevicesEnv;
  t.mem_alloc = MemAlloc;
  t.mem_free = MemFree;
  t.mem_free_async = nullptr;  // mem_free waits for the device
  t.mem_get_info = MemGetInfo;
  t.memcpy_h2d = MemcpyH2D;
  t.memcpy_d2h = MemcpyD2H;
  t.memcpy_d2d = MemcpyD2D;
  t.memset = Memset;
  t.host_alloc = HostAlloc;
  t.host_free = HostFree;
  t.weight_upload = nullptr;  // GGUF layout; the kernels decode the blocks themselves
  t.weight_free = nullptr;
  t.stream_create = StreamCreate;
  t.stream_destroy = StreamDestroy;
  t.stream_synchronize = StreamSynchronize;
  t.event_create = EventCreate;
  t.event_destroy = EventDestroy;
  t.event_record = EventRecord;
  t.stream_wait_event = StreamWaitEvent;
  t.event_query = EventQuery;
  t.event_synchronize = EventSynchronize;
  t.event_elapsed_ms = EventElapsedMs;
  t.op_supports = OpSupports;
  t.op_launch = OpLaunch;
  t.op_counters_read = OpCountersRead;
  return t;
}();

}  // namespace

extern "C" {

// Cheap: the loader, an instance and the physical devices' properties; no VkDevice.
PC_EXPORT void pc_backend_probe(pc_probe_result_t* result) {
  if (!result) return;
  result->score = 0;
  std::string why;
  pv::Vk vk;
  VkInstance instance = VK_NULL_HANDLE;
  std::vector<pv::PhysicalInfo> devices;
  if (pv::OpenLoader(&vk, &why) && pv::CreateInstance(&vk, &instance, &why) &&
      Enumerate(vk, instance, "", &devices, &why)) {
    // A real GPU beats the cpu plugin (10); a CPU implementation such as lavapipe never does.
    int best = 0;
    for (const auto& d : devices) {
      const int s = d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU     ? 100
                    : d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? 50
                    : d.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU            ? 1
                                                                                   : 20;
      best = std::max(best, s);
    }
    result->score = best;
    why = std::to_string(devices.size()) + " Vulkan device(s), first: " +
          devices[0].props.deviceName;
  }
  if (instance) vk.vkDestroyInstance(instance, nullptr);
  pv::CloseLoader(&vk);
  why.resize(std::min(why.size(), sizeof(result->reason) - 1));
  std::memcpy(result->reason, why.c_str(), why.size() + 1);
}

PC_EXPORT const pc_backend_iface_t* pc_backend_get_api(uint32_t host_abi_major,
                                                       uint32_t host_abi_minor,
                                                       const pc_host_services_t* host) {
  if (host_abi_major != PC_ABI_MAJOR) return nullptr;
  G().host = host;
  return &kIface;
}

}  // extern "C"
