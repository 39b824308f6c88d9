// Which queues the Vulkan plugin creates on a device, and whether it can offer stream
// priorities. A pure function of what the driver reports, so that the choice can be tested
// without a driver that has the global-priority extension (lavapipe has none).
//
// Stream priorities come from VK_KHR_global_priority / VK_EXT_global_priority: a queue created
// at VK_QUEUE_GLOBAL_PRIORITY_HIGH is scheduled ahead of MEDIUM (the default) queues, on the
// whole GPU. A global priority applies to every queue of one VkDeviceQueueCreateInfo, and a
// device may have only one create info per queue family, so high-priority streams need a second
// compute-capable family: normal streams take the first (compute-only families preferred, the
// "async compute" queues), high-priority streams the second, created at HIGH. With one compute
// family, or without the extension, there are no priorities (the ABI's low == high).
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

namespace polychip::vulkan {

// One queue family as the plan needs it.
struct QueueFamily {
  bool compute = false;
  bool graphics = false;
  uint32_t queue_count = 0;
  bool timestamps = false;
  // The global priorities its queues may be created with (VkQueueFamilyGlobalPriorityProperties
  // KHR); empty when the driver cannot say (VK_EXT_global_priority without the query).
  std::vector<VkQueueGlobalPriorityKHR> global_priorities;
};

// Which global-priority extension the device offers (the KHR one includes the query).
enum class GlobalPriorityExt { kNone, kExt, kKhr };

struct QueuePlan {
  uint32_t normal_family = UINT32_MAX;
  uint32_t normal_count = 0;
  // UINT32_MAX: no high-priority queues (the device reports low == high).
  uint32_t high_family = UINT32_MAX;
  uint32_t high_count = 0;
  VkQueueGlobalPriorityKHR high_priority = VK_QUEUE_GLOBAL_PRIORITY_HIGH_KHR;
  const char* extension = nullptr;  // the extension to enable for the high family
  std::string why_no_priorities;    // set when high_family is UINT32_MAX

  bool has_priorities() const { return high_family != UINT32_MAX; }
  // The plan after the driver refused the high priority (VK_ERROR_NOT_PERMITTED: HIGH needs
  // privileges on some drivers): normal queues only.
  QueuePlan WithoutPriorities(std::string why) const;
};

// At most `max_queues` queues per family.
QueuePlan PlanQueues(const std::vector<QueueFamily>& families, GlobalPriorityExt ext,
                     uint32_t max_queues);

}  // namespace polychip::vulkan
