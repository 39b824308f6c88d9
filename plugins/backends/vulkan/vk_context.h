// The Vulkan plugin's objects behind the ABI's opaque handles: the loader (opened at run time),
// a device with its memory blocks and queues, streams (command buffers on a queue, ordered by a
// timeline semaphore) and events (a point on a stream's timeline, plus a timestamp query).
//
// Memory, the discrete-device way: device memory comes from the device-local heap in large
// blocks (never above maxMemoryAllocationSize), each bound to one VkBuffer, and is cut into
// allocations. A pc_devptr_t is (block id << 40 | offset): opaque, never a host pointer. Host
// data reaches the device only through a per-stream staging ring of host-visible memory.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "polychip/plugin/pc_backend.h"
#include "polychip/sdk/op_counters.h"
#include "queue_plan.h"

namespace polychip::vulkan {

// Every Vulkan entry point the plugin calls, loaded from libvulkan.so.1.
#define PC_VK_FUNCTIONS(X)                                                                    \
  X(vkDestroyInstance) X(vkEnumeratePhysicalDevices) X(vkGetPhysicalDeviceProperties)         \
  X(vkGetPhysicalDeviceProperties2) X(vkGetPhysicalDeviceFeatures2)                           \
  X(vkGetPhysicalDeviceMemoryProperties) X(vkGetPhysicalDeviceQueueFamilyProperties)          \
  X(vkGetPhysicalDeviceQueueFamilyProperties2) X(vkEnumerateDeviceExtensionProperties)        \
  X(vkCreateDevice) X(vkDestroyDevice) X(vkGetDeviceQueue) X(vkAllocateMemory) X(vkFreeMemory) \
  X(vkMapMemory) X(vkUnmapMemory) X(vkCreateBuffer) X(vkDestroyBuffer)                         \
  X(vkGetBufferMemoryRequirements) X(vkBindBufferMemory) X(vkGetBufferDeviceAddress)          \
  X(vkCreateCommandPool) X(vkDestroyCommandPool) X(vkAllocateCommandBuffers)                  \
  X(vkBeginCommandBuffer) X(vkEndCommandBuffer) X(vkResetCommandBuffer) X(vkCmdCopyBuffer)    \
  X(vkCmdFillBuffer) X(vkCmdPipelineBarrier) X(vkCmdBindPipeline) X(vkCmdBindDescriptorSets)  \
  X(vkCmdPushConstants) X(vkCmdDispatch) X(vkCmdWriteTimestamp) X(vkCmdResetQueryPool)        \
  X(vkQueueSubmit) X(vkDeviceWaitIdle) X(vkCreateSemaphore) X(vkDestroySemaphore)             \
  X(vkWaitSemaphores) X(vkGetSemaphoreCounterValue) X(vkCreateShaderModule)                   \
  X(vkDestroyShaderModule) X(vkCreateComputePipelines) X(vkDestroyPipeline)                   \
  X(vkCreatePipelineLayout) X(vkDestroyPipelineLayout) X(vkCreateDescriptorSetLayout)         \
  X(vkDestroyDescriptorSetLayout) X(vkCreateDescriptorPool) X(vkDestroyDescriptorPool)        \
  X(vkResetDescriptorPool) X(vkAllocateDescriptorSets) X(vkUpdateDescriptorSets)              \
  X(vkCreateQueryPool) X(vkDestroyQueryPool) X(vkGetQueryPoolResults)                       \
  X(vkGetPhysicalDeviceFormatProperties) X(vkCreateBufferView) X(vkDestroyBufferView)

struct Vk {
  void* library = nullptr;
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  PFN_vkCreateInstance vkCreateInstance = nullptr;
#define PC_VK_MEMBER(name) PFN_##name name = nullptr;
  PC_VK_FUNCTIONS(PC_VK_MEMBER)
#undef PC_VK_MEMBER
};

// Opens the loader and makes an instance (Vulkan >= 1.2); *why on failure. Used by probe (then
// closed again) and by initialize.
bool OpenLoader(Vk* vk, std::string* why);
bool CreateInstance(Vk* vk, VkInstance* instance, std::string* why);
void CloseLoader(Vk* vk);

std::string VkResultName(VkResult r);

// Visible devices: POLYCHIP_VULKAN_DEVICE (indices into vkEnumeratePhysicalDevices, "0,2"),
// then the `devices` parameter: a list of indices into what that left ("0,2", "1,"), or a bare
// number N, a count as for the emu plugin (the first N, at most all of them). Returns false with
// *why for a malformed list or an index past the end.
bool SelectDevices(const std::vector<VkPhysicalDevice>& all, const char* env_value,
                   const std::string& param, std::vector<VkPhysicalDevice>* out, std::string* why);

constexpr uint32_t kMaxQueuesPerFamily = 4;

// What the plugin reads of a physical device (the props, the limits its kernels honour).
struct PhysicalInfo {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  VkPhysicalDeviceProperties props{};
  uint8_t uuid[VK_UUID_SIZE] = {};
  uint32_t device_memory_type = UINT32_MAX, staging_memory_type = UINT32_MAX;
  uint64_t heap_size = 0;
  uint64_t max_alloc = 0;  // maxMemoryAllocationSize, capped by maxBufferSize
  QueuePlan queues;  // the normal streams' queue family, and the high-priority one if any
  uint32_t subgroup_size = 0;
  bool subgroup_shuffle = false;  // matvec.comp's xor shuffles (with subgroup_size >= 8)
  bool timestamps = false;
  bool buffer_device_address = false, timeline = false;
  bool int64 = false;  // shaderInt64, enabled when present (the matrow64_* kernels)
  // A CPU device whose uniform texel buffers take R32G32B32A32_UINT over a whole block: every
  // block then gets a texel view (Block::texels), which the matrowtex_* decode kernels read.
  bool texel_blocks = false;
  bool subgroup_broadcast = false;  // subgroupBroadcast in compute (the ballot feature)
  std::string why_unusable;  // empty when usable
};
PhysicalInfo Inspect(const Vk& vk, VkPhysicalDevice pd);

// A block of device memory bound to one buffer; allocations are cut from it (first fit).
struct Block {
  uint32_t id = 0;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t size = 0;
  uint64_t address = 0;  // buffer device address, when enabled
  VkBufferView texels = VK_NULL_HANDLE;  // the whole block, 16 bytes a texel (texel_blocks)
  std::map<uint64_t, uint64_t> live;  // offset -> size
  std::map<uint64_t, uint64_t> free;  // offset -> size, coalesced
};

constexpr int kBlockShift = 40;
constexpr uint64_t kOffsetMask = (1ull << kBlockShift) - 1;

struct Device;

// A host-visible buffer, mapped: the staging ring of a stream, or a pinned host allocation.
struct HostBuffer {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  uint8_t* mapped = nullptr;
  uint64_t size = 0;
};

// One command buffer's worth of work: recorded, submitted with a timeline value, recycled when
// the semaphore reaches it. Device-to-host copies land in staging and are copied out to the
// caller's memory when the batch is retired.
struct StreamState;
struct Batch {
  VkCommandBuffer cb = VK_NULL_HANDLE;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  uint32_t sets_left = 0;
  uint64_t value = 0;
  uint32_t commands = 0;
  struct HostCopy {
    void* dst;
    uint64_t staging_offset, n;
  };
  std::vector<HostCopy> host_copies;
  // Per-op device time: a pair of timestamps around each op recorded in this batch, read back
  // when the batch retires (null pool where the queue has no timestamps or counting is off).
  VkQueryPool timer = VK_NULL_HANDLE;
  uint32_t stamps = 0;  // queries written so far
  struct TimedOp {
    pc_op_t op;
    uint32_t first;  // its start stamp; the end stamp is first + 1
  };
  std::vector<TimedOp> timed_ops;
  // Streams whose timelines this batch waits on: alive until it has run.
  std::vector<std::shared_ptr<StreamState>> waited;
};

struct StreamState {
  Device* device = nullptr;
  uint32_t queue_index = 0;  // into device->queues
  std::mutex mu;
  VkCommandPool command_pool = VK_NULL_HANDLE;
  VkSemaphore timeline = VK_NULL_HANDLE;
  uint64_t submitted = 0;  // the last value a submission signals
  Batch* open = nullptr;   // recording
  std::deque<Batch*> in_flight;
  std::vector<Batch*> spare;
  std::vector<std::pair<VkSemaphore, uint64_t>> waits;  // for the next submission
  std::vector<std::shared_ptr<StreamState>> wait_owners;  // keep waited-on semaphores alive
  HostBuffer staging;
  uint64_t staging_head = 0;
  std::string error;  // first asynchronous error since the last synchronize

  // All of these expect mu held.
  VkResult Begin();  // makes `open` a recording batch
  void Barrier();    // every earlier command's writes before every later command
  VkResult Flush();  // submits `open` (and pending waits)
  VkResult Retire(bool wait_all);  // recycles finished batches, running their host copies
  VkResult WaitFor(uint64_t value);
  // n bytes of staging for the open batch (flushing and draining the ring when it is full).
  VkResult Staging(uint64_t n, uint64_t* offset);
  VkResult AllocateSet(VkDescriptorSetLayout layout, VkDescriptorSet* set);
  // Per-op device time: a start stamp in the open batch before the op's commands, an end stamp
  // after them; StartOpTimer is false where the batch has no timer (untimed op).
  bool StartOpTimer();
  void StopOpTimer(pc_op_t op, bool record);  // record: the op succeeded
  void AddOpTimes(Batch& b);  // at retire: the batch's stamp pairs into the op counters
  void DestroyBatch(Batch* b);
  Batch* timed_batch = nullptr;  // the batch holding the running op's start stamp
  uint32_t timed_first = 0;      // its query index
  // Drains the stream and releases its Vulkan objects; run by the destructor, i.e. when the
  // stream and every event recorded on it are gone (an event keeps its timeline alive).
  void Destroy();
  ~StreamState() { Destroy(); }
};

// One compute pipeline (a kernel variant) and its layouts; built on first use (vk_ops.cc).
struct Kernel {
  std::string name;
  uint32_t n_bindings = 0;
  uint32_t n_texel_bindings = 0;  // the first ones are uniform texel buffers, the rest storage
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
};

struct Device {
  const Vk* vk = nullptr;
  int32_t ordinal = 0;
  PhysicalInfo info;
  VkDevice device = VK_NULL_HANDLE;
  // The normal streams' queues, then the high-priority streams' (from high_first on; none when
  // high_first == queues.size()).
  std::vector<VkQueue> queues;
  std::unique_ptr<std::mutex[]> queue_mu;
  uint32_t high_first = 0;
  uint32_t next_queue = 0, next_high_queue = 0;
  uint64_t block_bytes = 0;  // default block size
  uint64_t alignment = 256;

  std::mutex mem_mu;
  std::map<uint32_t, std::unique_ptr<Block>> blocks;
  uint32_t next_block = 1;
  uint64_t used = 0;       // bytes in live allocations
  uint64_t reserved = 0;   // bytes in blocks

  std::mutex streams_mu;
  std::vector<std::weak_ptr<StreamState>> streams;

  std::mutex kernels_mu;
  std::vector<std::unique_ptr<Kernel>> kernels;  // built on first use, by name

  // Memory.
  pc_error_t* Alloc(uint64_t size, pc_devptr_t* out);
  pc_error_t* Free(pc_devptr_t ptr);
  // The block and offset of [ptr, ptr + bytes), inside one live allocation; nullptr if not.
  Block* Resolve(pc_devptr_t ptr, uint64_t bytes, uint64_t* offset);
  // Waits for every stream of the device to drain (mem_free, device_close).
  void WaitIdle();

  VkResult CreateHostBuffer(uint64_t size, HostBuffer* out);
  void DestroyHostBuffer(HostBuffer* b);

  pc_devptr_t dummy = 0;  // bound where an optional operand is absent

  // Per-op counters (op_counters_read): launches, bytes and FLOPs counted at enqueue; device
  // time from timestamp pairs, added when the op's batch retires (where the queue has them).
  bool count_ops = true;  // parameter op_counters
  polychip::sdk::OpCounterTable op_counters{PC_OP_COUNTERS_BYTES | PC_OP_COUNTERS_FLOPS};
};

// vk_ops.cc: the compute domain.
int32_t OpSupports(const Device& d, const pc_op_query_t& q);
pc_error_t* OpLaunch(StreamState& s, pc_op_t op, const void* args);
void DestroyKernels(Device& d);

}  // namespace polychip::vulkan

struct pc_device {
  polychip::vulkan::Device d;
};
struct pc_stream {
  std::shared_ptr<polychip::vulkan::StreamState> s;
};
struct pc_event {
  polychip::vulkan::Device* device = nullptr;
  std::mutex mu;
  std::shared_ptr<polychip::vulkan::StreamState> stream;  // of the latest record
  uint64_t value = 0;                                      // 0: never recorded
  VkQueryPool timestamps = VK_NULL_HANDLE;                 // one query, when timing is supported
  bool stamped = false;
};
