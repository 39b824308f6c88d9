// The Vulkan plugin's runtime: the loader, device inspection, memory blocks and streams.
#include "vk_context.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "polychip/sdk/plugin_util.h"

namespace polychip::vulkan {

using sdk::MakeError;

bool OpenLoader(Vk* vk, std::string* why) {
  for (const char* name : {"libvulkan.so.1", "libvulkan.so"}) {
    vk->library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (vk->library) break;
  }
  if (!vk->library) {
    *why = "Vulkan loader libvulkan.so.1 not found (Debian: apt-get install libvulkan1 "
           "mesa-vulkan-drivers)";
    return false;
  }
  vk->vkGetInstanceProcAddr =
      reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(vk->library, "vkGetInstanceProcAddr"));
  if (!vk->vkGetInstanceProcAddr) {
    *why = "libvulkan.so.1 has no vkGetInstanceProcAddr";
    CloseLoader(vk);
    return false;
  }
  vk->vkCreateInstance = reinterpret_cast<PFN_vkCreateInstance>(
      vk->vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkCreateInstance"));
  return vk->vkCreateInstance != nullptr;
}

bool CreateInstance(Vk* vk, VkInstance* instance, std::string* why) {
  auto enumerate_version = reinterpret_cast<PFN_vkEnumerateInstanceVersion>(
      vk->vkGetInstanceProcAddr(VK_NULL_HANDLE, "vkEnumerateInstanceVersion"));
  uint32_t version = VK_API_VERSION_1_0;
  if (enumerate_version) enumerate_version(&version);
  if (version < VK_API_VERSION_1_2) {
    *why = "the Vulkan loader is older than 1.2 (timeline semaphores are needed)";
    return false;
  }
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "polychip";
  app.pEngineName = "polychip";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ci.pApplicationInfo = &app;
  VkResult r = vk->vkCreateInstance(&ci, nullptr, instance);
  if (r != VK_SUCCESS) {
    *why = "vkCreateInstance failed: " + VkResultName(r);
    return false;
  }
  bool ok = true;
#define PC_VK_LOAD(name)                                                                   \
  vk->name = reinterpret_cast<PFN_##name>(vk->vkGetInstanceProcAddr(*instance, #name));   \
  if (!vk->name) {                                                                         \
    *why = "the Vulkan loader lacks " #name;                                               \
    ok = false;                                                                            \
  }
  PC_VK_FUNCTIONS(PC_VK_LOAD)
#undef PC_VK_LOAD
  if (!ok) {
    if (vk->vkDestroyInstance) vk->vkDestroyInstance(*instance, nullptr);
    *instance = VK_NULL_HANDLE;
  }
  return ok;
}

void CloseLoader(Vk* vk) {
  if (vk->library) dlclose(vk->library);
  *vk = Vk{};
}

std::string VkResultName(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_TOO_MANY_OBJECTS: return "VK_ERROR_TOO_MANY_OBJECTS";
    case VK_ERROR_OUT_OF_POOL_MEMORY: return "VK_ERROR_OUT_OF_POOL_MEMORY";
    default: return "VkResult " + std::to_string(static_cast<int>(r));
  }
}

namespace {
bool ParseList(const std::string& text, std::vector<size_t>* out) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    long long v = 0;
    if (!sdk::ParseInt(item.c_str(), &v)) return false;
    out->push_back(static_cast<size_t>(v));
  }
  return true;
}
bool Pick(const std::vector<VkPhysicalDevice>& in, const std::string& list, const char* what,
          std::vector<VkPhysicalDevice>* out, std::string* why) {
  std::vector<size_t> idx;
  if (!ParseList(list, &idx)) {
    *why = std::string(what) + " must be a list of device indices such as 0,1, got '" + list + "'";
    return false;
  }
  out->clear();
  for (size_t i : idx) {
    if (i >= in.size()) {
      *why = std::string(what) + " names device " + std::to_string(i) + " but only " +
             std::to_string(in.size()) + " are visible";
      return false;
    }
    out->push_back(in[i]);
  }
  return true;
}
}  // namespace

bool SelectDevices(const std::vector<VkPhysicalDevice>& all, const char* env_value,
                   const std::string& param, std::vector<VkPhysicalDevice>* out,
                   std::string* why) {
  std::vector<VkPhysicalDevice> visible = all;
  if (env_value && *env_value) {
    if (!Pick(all, env_value, "POLYCHIP_VULKAN_DEVICE", &visible, why)) return false;
  }
  if (param.find(',') == std::string::npos && !param.empty()) {
    // A bare number is a count, as for the emu plugin: the first N visible devices (all of them
    // when fewer are visible; the caller logs it).
    long long n = 0;
    if (!sdk::ParseInt(param.c_str(), &n) || n < 1) {
      *why = "parameter devices must be a count such as 2 or a list of indices such as 0,2, got '" +
             param + "'";
      return false;
    }
    visible.resize(std::min<size_t>(visible.size(), static_cast<size_t>(n)));
    *out = visible;
    return true;
  }
  if (!param.empty()) return Pick(visible, param, "parameter devices", out, why);
  *out = visible;
  return true;
}

PhysicalInfo Inspect(const Vk& vk, VkPhysicalDevice pd) {
  PhysicalInfo info;
  info.handle = pd;
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties sg{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  m3.pNext = &sg;
  VkPhysicalDeviceIDProperties id{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES};
  id.pNext = &m3;
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  p2.pNext = &id;
  vk.vkGetPhysicalDeviceProperties2(pd, &p2);
  info.props = p2.properties;
  std::memcpy(info.uuid, id.deviceUUID, VK_UUID_SIZE);
  info.max_alloc = m3.maxMemoryAllocationSize ? m3.maxMemoryAllocationSize : (1ull << 30);
  info.subgroup_size = sg.subgroupSize;
  info.subgroup_shuffle = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                          (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) &&
                          sg.subgroupSize >= 8;
  info.subgroup_broadcast = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                            (sg.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT);
  const bool subgroup_ops = (sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                            (sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);

  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f12;
  if (info.props.apiVersion >= VK_API_VERSION_1_2) vk.vkGetPhysicalDeviceFeatures2(pd, &f2);
  info.timeline = f12.timelineSemaphore;
  info.buffer_device_address = f12.bufferDeviceAddress;
  info.int64 = f2.features.shaderInt64;
  // Texel views for the CPU device's decode matmul: a CPU driver (lavapipe) turns a storage
  // buffer load whose address differs between lanes into a branchy per-lane loop (bounds check,
  // exec-mask test, a store into a stack vector and a reload of the whole vector), while a
  // texel fetch is one branchless gather of 16 bytes a lane. POLYCHIP_VULKAN_TEXELS=0 turns
  // them off (the storage-buffer kernels then run, for comparison).
  VkFormatProperties fp{};
  vk.vkGetPhysicalDeviceFormatProperties(pd, VK_FORMAT_R32G32B32A32_UINT, &fp);
  const char* texels_env = std::getenv("POLYCHIP_VULKAN_TEXELS");
  info.texel_blocks = info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU &&
                      (fp.bufferFeatures & VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT) &&
                      !(texels_env && std::string(texels_env) == "0");

  VkPhysicalDeviceMemoryProperties mp{};
  vk.vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  // Device memory: device-local (on lavapipe it is host-visible too, which we never use).
  // Staging: host-visible and coherent, cached when there is such a type (faster readback).
  int best_staging = -1;
  for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    const VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && info.device_memory_type == UINT32_MAX) {
      info.device_memory_type = i;
      info.heap_size = mp.memoryHeaps[mp.memoryTypes[i].heapIndex].size;
    }
    const VkMemoryPropertyFlags host =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    if ((f & host) == host) {
      const int score = (f & VK_MEMORY_PROPERTY_HOST_CACHED_BIT ? 2 : 0) +
                        (f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT ? 0 : 1);
      if (score > best_staging) best_staging = score, info.staging_memory_type = i;
    }
  }

  GlobalPriorityExt ext = GlobalPriorityExt::kNone;
  uint32_t n_ext = 0;
  vk.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  vk.vkEnumerateDeviceExtensionProperties(pd, nullptr, &n_ext, exts.data());
  for (const VkExtensionProperties& e : exts) {
    if (std::strcmp(e.extensionName, VK_KHR_GLOBAL_PRIORITY_EXTENSION_NAME) == 0) {
      ext = GlobalPriorityExt::kKhr;
    } else if (std::strcmp(e.extensionName, VK_EXT_GLOBAL_PRIORITY_EXTENSION_NAME) == 0 &&
               ext == GlobalPriorityExt::kNone) {
      ext = GlobalPriorityExt::kExt;
    }
  }
  const bool can_query = ext == GlobalPriorityExt::kKhr ||
                         std::any_of(exts.begin(), exts.end(), [](const VkExtensionProperties& e) {
                           return std::strcmp(e.extensionName,
                                              VK_EXT_GLOBAL_PRIORITY_QUERY_EXTENSION_NAME) == 0;
                         });

  uint32_t n_families = 0;
  vk.vkGetPhysicalDeviceQueueFamilyProperties2(pd, &n_families, nullptr);
  std::vector<VkQueueFamilyProperties2> families(n_families,
                                                 {VK_STRUCTURE_TYPE_QUEUE_FAMILY_PROPERTIES_2});
  std::vector<VkQueueFamilyGlobalPriorityPropertiesKHR> priorities(
      n_families, {VK_STRUCTURE_TYPE_QUEUE_FAMILY_GLOBAL_PRIORITY_PROPERTIES_KHR});
  if (can_query) {
    for (uint32_t i = 0; i < n_families; ++i) families[i].pNext = &priorities[i];
  }
  vk.vkGetPhysicalDeviceQueueFamilyProperties2(pd, &n_families, families.data());
  std::vector<QueueFamily> plan_input(n_families);
  for (uint32_t i = 0; i < n_families; ++i) {
    const VkQueueFamilyProperties& f = families[i].queueFamilyProperties;
    QueueFamily& q = plan_input[i];
    q.compute = f.queueFlags & VK_QUEUE_COMPUTE_BIT;
    q.graphics = f.queueFlags & VK_QUEUE_GRAPHICS_BIT;
    q.queue_count = f.queueCount;
    q.timestamps = f.timestampValidBits > 0 && info.props.limits.timestampComputeAndGraphics;
    if (can_query) {
      const uint32_t n = std::min<uint32_t>(priorities[i].priorityCount,
                                            VK_MAX_GLOBAL_PRIORITY_SIZE_KHR);
      q.global_priorities.assign(priorities[i].priorities, priorities[i].priorities + n);
    }
  }
  info.queues = PlanQueues(plan_input, ext, kMaxQueuesPerFamily);
  if (info.queues.normal_family != UINT32_MAX)
    info.timestamps = plan_input[info.queues.normal_family].timestamps;

  if (info.props.apiVersion < VK_API_VERSION_1_2) {
    info.why_unusable = "device supports Vulkan < 1.2";
  } else if (!info.timeline) {
    info.why_unusable = "device has no timeline semaphores";
  } else if (!subgroup_ops) {
    info.why_unusable = "device has no subgroup arithmetic in compute shaders";
  } else if (info.queues.normal_family == UINT32_MAX) {
    info.why_unusable = "device has no compute queue";
  } else if (info.device_memory_type == UINT32_MAX || info.staging_memory_type == UINT32_MAX) {
    info.why_unusable = "device lacks a device-local or a host-visible coherent memory type";
  }
  return info;
}

// ---- memory ---------------------------------------------------------------------------------

namespace {
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

pc_error_t* Device::Alloc(uint64_t size, pc_devptr_t* out) {
  const uint64_t rounded = RoundUp(std::max<uint64_t>(size, 1), alignment);
  if (rounded > info.max_alloc) {
    return MakeError(PC_CODE_INVALID_ARGUMENT,
                     "allocation of " + std::to_string(size) + " bytes exceeds max_alloc_size " +
                         std::to_string(info.max_alloc));
  }
  std::lock_guard<std::mutex> lock(mem_mu);
  auto take = [&](Block& b) -> bool {
    for (auto it = b.free.begin(); it != b.free.end(); ++it) {  // first fit
      if (it->second < rounded) continue;
      const uint64_t off = it->first, rest = it->second - rounded;
      b.free.erase(it);
      if (rest) b.free[off + rounded] = rest;
      b.live[off] = rounded;
      used += rounded;
      *out = (static_cast<uint64_t>(b.id) << kBlockShift) | off;
      return true;
    }
    return false;
  };
  for (auto& [id, b] : blocks) {
    if (take(*b)) return nullptr;
  }
  // A new block: the default size, or a dedicated one for a larger allocation.
  const uint64_t bytes = std::max(block_bytes, rounded);
  if (reserved + bytes > info.heap_size) {
    return MakeError(PC_CODE_RESOURCE_EXHAUSTED,
                     "vulkan device " + std::to_string(ordinal) + " out of memory (" +
                         std::to_string(info.heap_size - std::min(info.heap_size, used)) +
                         " bytes free in the heap, " + std::to_string(size) + " asked)");
  }
  auto b = std::make_unique<Block>();
  b->id = next_block++;
  b->size = bytes;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
             VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  if (info.buffer_device_address) bi.usage |= VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;
  const uint64_t texels = bytes / 16;
  const bool texel_view =
      info.texel_blocks && texels <= info.props.limits.maxTexelBufferElements && texels > 0;
  if (texel_view) bi.usage |= VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = vk->vkCreateBuffer(device, &bi, nullptr, &b->buffer);
  VkMemoryRequirements req{};
  if (r == VK_SUCCESS) {
    vk->vkGetBufferMemoryRequirements(device, b->buffer, &req);
    VkMemoryAllocateFlagsInfo flags{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO};
    flags.flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT;
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.pNext = info.buffer_device_address ? &flags : nullptr;
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = info.device_memory_type;
    r = vk->vkAllocateMemory(device, &ai, nullptr, &b->memory);
  }
  if (r == VK_SUCCESS) r = vk->vkBindBufferMemory(device, b->buffer, b->memory, 0);
  if (r != VK_SUCCESS) {
    if (b->buffer) vk->vkDestroyBuffer(device, b->buffer, nullptr);
    if (b->memory) vk->vkFreeMemory(device, b->memory, nullptr);
    const bool oom = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY;
    return MakeError(oom ? PC_CODE_RESOURCE_EXHAUSTED : PC_CODE_INTERNAL,
                     "allocating a " + std::to_string(bytes) + "-byte block: " + VkResultName(r));
  }
  if (info.buffer_device_address) {
    VkBufferDeviceAddressInfo ai{VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO};
    ai.buffer = b->buffer;
    b->address = vk->vkGetBufferDeviceAddress(device, &ai);
  }
  if (texel_view) {  // without one (an error here) the block's matmuls take the other kernels
    VkBufferViewCreateInfo vi{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    vi.buffer = b->buffer;
    vi.format = VK_FORMAT_R32G32B32A32_UINT;
    vi.offset = 0;
    vi.range = texels * 16;
    if (vk->vkCreateBufferView(device, &vi, nullptr, &b->texels) != VK_SUCCESS)
      b->texels = VK_NULL_HANDLE;
  }
  b->free[0] = bytes;
  reserved += bytes;
  Block& ref = *b;
  blocks[b->id] = std::move(b);
  take(ref);
  return nullptr;
}

pc_error_t* Device::Free(pc_devptr_t ptr) {
  if (ptr == 0) return nullptr;
  WaitIdle();  // work still queued may use the memory (no stream-ordered free)
  std::lock_guard<std::mutex> lock(mem_mu);
  auto bit = blocks.find(static_cast<uint32_t>(ptr >> kBlockShift));
  if (bit == blocks.end()) return MakeError(PC_CODE_INVALID_ARGUMENT, "not a vulkan device address");
  Block& b = *bit->second;
  uint64_t off = ptr & kOffsetMask;
  auto it = b.live.find(off);
  if (it == b.live.end())
    return MakeError(PC_CODE_INVALID_ARGUMENT, "pointer is not the start of an allocation");
  uint64_t size = it->second;
  b.live.erase(it);
  used -= size;
  auto next = b.free.lower_bound(off);
  if (next != b.free.end() && off + size == next->first) {
    size += next->second;
    next = b.free.erase(next);
  }
  bool merged = false;
  if (next != b.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      merged = true;
    }
  }
  if (!merged) b.free[off] = size;
  if (b.live.empty()) {  // an empty block goes back to the heap
    if (b.texels) vk->vkDestroyBufferView(device, b.texels, nullptr);
    vk->vkDestroyBuffer(device, b.buffer, nullptr);
    vk->vkFreeMemory(device, b.memory, nullptr);
    reserved -= b.size;
    blocks.erase(bit);
  }
  return nullptr;
}

Block* Device::Resolve(pc_devptr_t ptr, uint64_t bytes, uint64_t* offset) {
  std::lock_guard<std::mutex> lock(mem_mu);
  auto bit = blocks.find(static_cast<uint32_t>(ptr >> kBlockShift));
  if (bit == blocks.end()) return nullptr;
  Block& b = *bit->second;
  const uint64_t off = ptr & kOffsetMask;
  auto it = b.live.upper_bound(off);
  if (it == b.live.begin()) return nullptr;
  --it;
  if (off + bytes < off || off + bytes > it->first + it->second) return nullptr;
  *offset = off;
  return &b;
}

void Device::WaitIdle() {
  std::vector<std::shared_ptr<StreamState>> live;
  {
    std::lock_guard<std::mutex> lock(streams_mu);
    for (auto& w : streams) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) {
    std::lock_guard<std::mutex> lock(s->mu);
    VkResult r = s->Flush();
    if (r == VK_SUCCESS) r = s->WaitFor(s->submitted);
    if (r != VK_SUCCESS && s->error.empty()) s->error = "vulkan: " + VkResultName(r);
  }
}

VkResult Device::CreateHostBuffer(uint64_t size, HostBuffer* out) {
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = vk->vkCreateBuffer(device, &bi, nullptr, &out->buffer);
  if (r != VK_SUCCESS) return r;
  VkMemoryRequirements req{};
  vk->vkGetBufferMemoryRequirements(device, out->buffer, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = info.staging_memory_type;
  r = vk->vkAllocateMemory(device, &ai, nullptr, &out->memory);
  if (r == VK_SUCCESS) r = vk->vkBindBufferMemory(device, out->buffer, out->memory, 0);
  void* p = nullptr;
  if (r == VK_SUCCESS) r = vk->vkMapMemory(device, out->memory, 0, VK_WHOLE_SIZE, 0, &p);
  if (r != VK_SUCCESS) {
    DestroyHostBuffer(out);
    return r;
  }
  out->mapped = static_cast<uint8_t*>(p);
  out->size = size;
  return VK_SUCCESS;
}

void Device::DestroyHostBuffer(HostBuffer* b) {
  if (b->buffer) vk->vkDestroyBuffer(device, b->buffer, nullptr);
  if (b->memory) vk->vkFreeMemory(device, b->memory, nullptr);  // unmaps
  *b = HostBuffer{};
}

// ---- streams --------------------------------------------------------------------------------

namespace {
constexpr uint32_t kSetsPerBatch = 256;
constexpr uint32_t kDescriptorsPerSet = 8;
constexpr uint32_t kCommandsPerBatch = 128;  // then submit, so the device starts early
// Timestamps of a batch's ops: a pair per op, ops beyond this count untimed (every op records
// at least one command, so this only binds for ops that record none).
constexpr uint32_t kStampsPerBatch = 2 * kCommandsPerBatch + 2;
}  // namespace

VkResult StreamState::Begin() {
  if (open) {
    if (open->commands < kCommandsPerBatch) return VK_SUCCESS;
    VkResult r = Flush();
    if (r != VK_SUCCESS) return r;
  }
  const Vk& vk = *device->vk;
  VkResult r = Retire(false);
  if (r != VK_SUCCESS) return r;
  Batch* b = nullptr;
  if (!spare.empty()) {
    b = spare.back();
    spare.pop_back();
    vk.vkResetCommandBuffer(b->cb, 0);
    vk.vkResetDescriptorPool(device->device, b->pool, 0);
  } else {
    b = new Batch;
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = command_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    r = vk.vkAllocateCommandBuffers(device->device, &ai, &b->cb);
    VkDescriptorPoolSize ps[2] = {
        {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, kSetsPerBatch * kDescriptorsPerSet},
        {VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, kSetsPerBatch * 2}};  // matrowtex_*: x, W
    VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    pi.maxSets = kSetsPerBatch;
    pi.poolSizeCount = device->info.texel_blocks ? 2 : 1;
    pi.pPoolSizes = ps;
    if (r == VK_SUCCESS) r = vk.vkCreateDescriptorPool(device->device, &pi, nullptr, &b->pool);
    if (r == VK_SUCCESS && device->info.timestamps && device->count_ops) {
      VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = kStampsPerBatch;
      r = vk.vkCreateQueryPool(device->device, &qi, nullptr, &b->timer);
    }
    if (r != VK_SUCCESS) {
      DestroyBatch(b);
      return r;
    }
  }
  b->sets_left = kSetsPerBatch;
  b->commands = 0;
  b->value = 0;
  b->host_copies.clear();
  b->stamps = 0;
  b->timed_ops.clear();
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  r = vk.vkBeginCommandBuffer(b->cb, &bi);
  if (r != VK_SUCCESS) {
    spare.push_back(b);
    return r;
  }
  if (b->timer) vk.vkCmdResetQueryPool(b->cb, b->timer, 0, kStampsPerBatch);
  open = b;
  timed_batch = nullptr;  // a running op's start stamp, if any, is in an earlier batch
  return VK_SUCCESS;
}

void StreamState::Barrier() {
  // Pipeline barriers order against everything submitted earlier to the queue too, so the
  // first one of a batch also orders it after the previous batches.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
  device->vk->vkCmdPipelineBarrier(open->cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                                   VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0, nullptr, 0,
                                   nullptr);
  ++open->commands;
}

VkResult StreamState::Flush() {
  if (!open && waits.empty()) return VK_SUCCESS;
  const Vk& vk = *device->vk;
  VkResult r = VK_SUCCESS;
  if (!open) {
    r = Begin();
    if (r != VK_SUCCESS) return r;
  }
  // Device writes visible to the host reading staging after the semaphore wait.
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vk.vkCmdPipelineBarrier(open->cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                          VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  r = vk.vkEndCommandBuffer(open->cb);
  if (r != VK_SUCCESS) return r;
  const uint64_t value = submitted + 1;
  std::vector<VkSemaphore> wait_sems;
  std::vector<uint64_t> wait_values;
  std::vector<VkPipelineStageFlags> wait_stages;
  for (auto& [sem, v] : waits) {
    wait_sems.push_back(sem);
    wait_values.push_back(v);
    wait_stages.push_back(VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  }
  VkTimelineSemaphoreSubmitInfo ti{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO};
  ti.waitSemaphoreValueCount = static_cast<uint32_t>(wait_values.size());
  ti.pWaitSemaphoreValues = wait_values.data();
  ti.signalSemaphoreValueCount = 1;
  ti.pSignalSemaphoreValues = &value;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.pNext = &ti;
  si.waitSemaphoreCount = static_cast<uint32_t>(wait_sems.size());
  si.pWaitSemaphores = wait_sems.data();
  si.pWaitDstStageMask = wait_stages.data();
  si.commandBufferCount = 1;
  si.pCommandBuffers = &open->cb;
  si.signalSemaphoreCount = 1;
  si.pSignalSemaphores = &timeline;
  {
    std::lock_guard<std::mutex> lock(device->queue_mu[queue_index]);
    r = vk.vkQueueSubmit(device->queues[queue_index], 1, &si, VK_NULL_HANDLE);
  }
  if (r != VK_SUCCESS) return r;
  submitted = value;
  open->value = value;
  open->waited = std::move(wait_owners);
  in_flight.push_back(open);
  open = nullptr;
  waits.clear();
  wait_owners.clear();
  return VK_SUCCESS;
}

VkResult StreamState::Retire(bool wait_all) {
  if (in_flight.empty()) return VK_SUCCESS;
  const Vk& vk = *device->vk;
  uint64_t done = 0;
  VkResult r = vk.vkGetSemaphoreCounterValue(device->device, timeline, &done);
  if (r != VK_SUCCESS) return r;
  if (wait_all && done < in_flight.back()->value) {
    r = WaitFor(in_flight.back()->value);
    return r;
  }
  while (!in_flight.empty() && in_flight.front()->value <= done) {
    Batch* b = in_flight.front();
    in_flight.pop_front();
    for (const Batch::HostCopy& c : b->host_copies) {
      std::memcpy(c.dst, staging.mapped + c.staging_offset, c.n);
    }
    b->host_copies.clear();
    AddOpTimes(*b);
    b->waited.clear();
    spare.push_back(b);
  }
  return VK_SUCCESS;
}

bool StreamState::StartOpTimer() {
  if (!open || !open->timer || open->stamps + 2 > kStampsPerBatch) return false;
  timed_first = open->stamps;
  open->stamps += 2;  // each query is written once per reset, so a pair is never reused
  device->vk->vkCmdWriteTimestamp(open->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, open->timer,
                                  timed_first);
  timed_batch = open;
  return true;
}

void StreamState::StopOpTimer(pc_op_t op, bool record) {
  // An op whose commands spilled into a second batch (the first one filled up, or the staging
  // ring drained) stays untimed: Begin cleared timed_batch, and its start stamp is never read.
  if (open && open == timed_batch) {
    device->vk->vkCmdWriteTimestamp(open->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, open->timer,
                                    timed_first + 1);
    if (record) open->timed_ops.push_back({op, timed_first});
  }
  timed_batch = nullptr;
}

// Both stamps of a pair are written at BOTTOM_OF_PIPE: the first when every earlier command has
// finished, the second when the op's own commands have, so the difference is the op's time on
// a stream whose ops are ordered by barriers.
void StreamState::AddOpTimes(Batch& b) {
  if (b.timed_ops.empty()) return;
  const double ns_per_tick = device->info.props.limits.timestampPeriod;
  for (const Batch::TimedOp& t : b.timed_ops) {
    // Pair by pair: a pair left half-written by an op that spilled is never read.
    uint64_t ticks[2] = {};
    const VkResult r = device->vk->vkGetQueryPoolResults(device->device, b.timer, t.first, 2,
                                                         sizeof(ticks), ticks, sizeof(uint64_t),
                                                         VK_QUERY_RESULT_64_BIT);
    if (r == VK_SUCCESS && ticks[1] > ticks[0]) {
      device->op_counters.AddDeviceTime(
          t.op, static_cast<uint64_t>(static_cast<double>(ticks[1] - ticks[0]) * ns_per_tick));
    }
  }
  b.timed_ops.clear();
}

void StreamState::DestroyBatch(Batch* b) {
  const Vk& vk = *device->vk;
  if (b->pool) vk.vkDestroyDescriptorPool(device->device, b->pool, nullptr);
  if (b->timer) vk.vkDestroyQueryPool(device->device, b->timer, nullptr);
  delete b;
}

VkResult StreamState::WaitFor(uint64_t value) {
  if (value > 0) {
    VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO};
    wi.semaphoreCount = 1;
    wi.pSemaphores = &timeline;
    wi.pValues = &value;
    VkResult r = device->vk->vkWaitSemaphores(device->device, &wi, UINT64_MAX);
    if (r != VK_SUCCESS) return r;
  }
  return Retire(false);
}

VkResult StreamState::Staging(uint64_t n, uint64_t* offset) {
  n = RoundUp(n, 16);
  if (staging_head + n > staging.size) {
    // The ring is full: drain it (every batch using it completes, host copies included).
    VkResult r = Flush();
    if (r == VK_SUCCESS) r = WaitFor(submitted);
    if (r != VK_SUCCESS) return r;
    staging_head = 0;
    r = Begin();
    if (r != VK_SUCCESS) return r;
  }
  *offset = staging_head;
  staging_head += n;
  return VK_SUCCESS;
}

VkResult StreamState::AllocateSet(VkDescriptorSetLayout layout, VkDescriptorSet* set) {
  if (open->sets_left == 0) {
    VkResult r = Flush();
    if (r == VK_SUCCESS) r = Begin();
    if (r != VK_SUCCESS) return r;
  }
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = open->pool;
  ai.descriptorSetCount = 1;
  ai.pSetLayouts = &layout;
  VkResult r = device->vk->vkAllocateDescriptorSets(device->device, &ai, set);
  if (r == VK_SUCCESS) --open->sets_left;
  return r;
}

void StreamState::Destroy() {
  const Vk& vk = *device->vk;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (Flush() == VK_SUCCESS) WaitFor(submitted);
    if (open) {
      vk.vkEndCommandBuffer(open->cb);
      spare.push_back(open);
      open = nullptr;
    }
  }
  for (Batch* b : spare) DestroyBatch(b);
  spare.clear();
  for (Batch* b : in_flight) DestroyBatch(b);
  in_flight.clear();
  vk.vkDestroyCommandPool(device->device, command_pool, nullptr);
  vk.vkDestroySemaphore(device->device, timeline, nullptr);
  device->DestroyHostBuffer(&staging);
}

}  // namespace polychip::vulkan
