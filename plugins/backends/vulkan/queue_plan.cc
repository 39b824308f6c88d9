#include "queue_plan.h"

#include <algorithm>

namespace polychip::vulkan {
namespace {

bool Offers(const QueueFamily& f, VkQueueGlobalPriorityKHR p) {
  return std::find(f.global_priorities.begin(), f.global_priorities.end(), p) !=
         f.global_priorities.end();
}

// The first compute family that `ok` accepts, compute-only ones first; UINT32_MAX if none.
template <typename Ok>
uint32_t PickCompute(const std::vector<QueueFamily>& families, Ok ok) {
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t i = 0; i < families.size(); ++i) {
      const QueueFamily& f = families[i];
      if (!f.compute || f.queue_count == 0 || !ok(i, f)) continue;
      if (pass == 0 && f.graphics) continue;
      return i;
    }
  }
  return UINT32_MAX;
}

}  // namespace

QueuePlan QueuePlan::WithoutPriorities(std::string why) const {
  QueuePlan p = *this;
  p.high_family = UINT32_MAX;
  p.high_count = 0;
  p.extension = nullptr;
  p.why_no_priorities = std::move(why);
  return p;
}

QueuePlan PlanQueues(const std::vector<QueueFamily>& families, GlobalPriorityExt ext,
                     uint32_t max_queues) {
  QueuePlan plan;
  plan.normal_family = PickCompute(families, [](uint32_t, const QueueFamily&) { return true; });
  if (plan.normal_family == UINT32_MAX) {
    plan.why_no_priorities = "no compute queue";
    return plan;
  }
  const QueueFamily& normal = families[plan.normal_family];
  plan.normal_count = std::min(normal.queue_count, max_queues);
  if (ext == GlobalPriorityExt::kNone) {
    plan.why_no_priorities = "the driver has no global-priority extension";
    return plan;
  }
  // The second family must time ops as the first does (the per-op counters read timestamps on
  // every stream's queue).
  const uint32_t high = PickCompute(families, [&](uint32_t i, const QueueFamily& f) {
    return i != plan.normal_family && (f.timestamps || !normal.timestamps);
  });
  if (high == UINT32_MAX) {
    plan.why_no_priorities =
        "a global priority applies to a whole queue family and the device has one compute "
        "family (with timestamps)";
    return plan;
  }
  const QueueFamily& hf = families[high];
  // REALTIME is never asked for: it needs privileges and can starve the display.
  if (!hf.global_priorities.empty() && !Offers(hf, VK_QUEUE_GLOBAL_PRIORITY_HIGH_KHR)) {
    plan.why_no_priorities = "the second compute family offers no HIGH global priority";
    return plan;
  }
  plan.high_family = high;
  plan.high_count = std::min(hf.queue_count, max_queues);
  plan.high_priority = VK_QUEUE_GLOBAL_PRIORITY_HIGH_KHR;
  plan.extension = ext == GlobalPriorityExt::kKhr ? VK_KHR_GLOBAL_PRIORITY_EXTENSION_NAME
                                                  : VK_EXT_GLOBAL_PRIORITY_EXTENSION_NAME;
  return plan;
}

}  // namespace polychip::vulkan
