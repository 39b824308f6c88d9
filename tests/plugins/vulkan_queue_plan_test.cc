// The Vulkan plugin's choice of queues and stream priorities (queue_plan.h) on the queue-family
// tables drivers report: lavapipe (one family, no extension), an NVIDIA-like device (a
// graphics+compute family, a transfer family, a compute-only family, VK_KHR_global_priority), a
// RADV-like one (VK_EXT_global_priority without the query), and the cases that must refuse.
#include "queue_plan.h"

#include <gtest/gtest.h>

namespace polychip::vulkan {
namespace {

constexpr auto kLow = VK_QUEUE_GLOBAL_PRIORITY_LOW_KHR;
constexpr auto kMedium = VK_QUEUE_GLOBAL_PRIORITY_MEDIUM_KHR;
constexpr auto kHigh = VK_QUEUE_GLOBAL_PRIORITY_HIGH_KHR;

QueueFamily Family(bool compute, bool graphics, uint32_t count, bool timestamps = true,
                   std::vector<VkQueueGlobalPriorityKHR> priorities = {}) {
  QueueFamily f;
  f.compute = compute;
  f.graphics = graphics;
  f.queue_count = count;
  f.timestamps = timestamps;
  f.global_priorities = std::move(priorities);
  return f;
}

TEST(VulkanQueuePlan, LavapipeHasOneFamilyAndNoPriorities) {
  const QueuePlan p = PlanQueues({Family(true, true, 1)}, GlobalPriorityExt::kNone, 4);
  EXPECT_EQ(p.normal_family, 0u);
  EXPECT_EQ(p.normal_count, 1u);
  EXPECT_FALSE(p.has_priorities());
  EXPECT_NE(p.why_no_priorities.find("no global-priority extension"), std::string::npos);
}

TEST(VulkanQueuePlan, NvidiaLikeDevicePutsHighStreamsOnTheSecondComputeFamily) {
  const std::vector<QueueFamily> families = {
      Family(true, true, 16, true, {kLow, kMedium, kHigh}),
      Family(false, false, 2, true),  // transfer only
      Family(true, false, 8, true, {kLow, kMedium, kHigh}),
  };
  const QueuePlan p = PlanQueues(families, GlobalPriorityExt::kKhr, 4);
  EXPECT_EQ(p.normal_family, 2u);  // the compute-only ("async compute") family
  EXPECT_EQ(p.normal_count, 4u);   // capped
  ASSERT_TRUE(p.has_priorities());
  EXPECT_EQ(p.high_family, 0u);
  EXPECT_EQ(p.high_count, 4u);
  EXPECT_EQ(p.high_priority, kHigh);
  EXPECT_STREQ(p.extension, VK_KHR_GLOBAL_PRIORITY_EXTENSION_NAME);
}

TEST(VulkanQueuePlan, ExtWithoutQueryTriesHighAndCanBeRefusedLater) {
  const std::vector<QueueFamily> families = {Family(true, true, 1), Family(true, false, 4)};
  const QueuePlan p = PlanQueues(families, GlobalPriorityExt::kExt, 4);
  EXPECT_EQ(p.normal_family, 1u);
  ASSERT_TRUE(p.has_priorities());
  EXPECT_EQ(p.high_family, 0u);
  EXPECT_EQ(p.high_count, 1u);
  EXPECT_STREQ(p.extension, VK_EXT_GLOBAL_PRIORITY_EXTENSION_NAME);
  // vkCreateDevice answered VK_ERROR_NOT_PERMITTED: the normal queues stay as they were.
  const QueuePlan refused = p.WithoutPriorities("HIGH global priority not permitted");
  EXPECT_FALSE(refused.has_priorities());
  EXPECT_EQ(refused.normal_family, 1u);
  EXPECT_EQ(refused.normal_count, 4u);
  EXPECT_EQ(refused.high_count, 0u);
  EXPECT_EQ(refused.extension, nullptr);
  EXPECT_EQ(refused.why_no_priorities, "HIGH global priority not permitted");
}

TEST(VulkanQueuePlan, OneComputeFamilyCannotMixPriorities) {
  const std::vector<QueueFamily> families = {Family(true, true, 8, true, {kMedium, kHigh}),
                                             Family(false, false, 1)};
  const QueuePlan p = PlanQueues(families, GlobalPriorityExt::kKhr, 4);
  EXPECT_EQ(p.normal_family, 0u);
  EXPECT_FALSE(p.has_priorities());
  EXPECT_NE(p.why_no_priorities.find("whole queue family"), std::string::npos);
}

TEST(VulkanQueuePlan, FamilyThatDoesNotOfferHighIsNotUsed) {
  const std::vector<QueueFamily> families = {Family(true, true, 1, true, {kLow, kMedium}),
                                             Family(true, false, 2, true, {kLow, kMedium})};
  const QueuePlan p = PlanQueues(families, GlobalPriorityExt::kKhr, 4);
  EXPECT_EQ(p.normal_family, 1u);
  EXPECT_FALSE(p.has_priorities());
  EXPECT_NE(p.why_no_priorities.find("no HIGH"), std::string::npos);
}

TEST(VulkanQueuePlan, HighFamilyMustHaveTimestampsWhenTheNormalOneHas) {
  // Family 1 is the normal one (compute only, timed); family 0 cannot time ops, family 2 can.
  const std::vector<QueueFamily> families = {Family(true, true, 1, false),
                                             Family(true, false, 2, true),
                                             Family(true, true, 3, true)};
  const QueuePlan p = PlanQueues(families, GlobalPriorityExt::kKhr, 4);
  EXPECT_EQ(p.normal_family, 1u);
  ASSERT_TRUE(p.has_priorities());
  EXPECT_EQ(p.high_family, 2u);
  EXPECT_EQ(p.high_count, 3u);
  // Without family 2 there is none to use.
  const QueuePlan q = PlanQueues({families[0], families[1]}, GlobalPriorityExt::kKhr, 4);
  EXPECT_FALSE(q.has_priorities());
}

TEST(VulkanQueuePlan, NoComputeFamilyAtAll) {
  const QueuePlan p = PlanQueues({Family(false, true, 1)}, GlobalPriorityExt::kKhr, 4);
  EXPECT_EQ(p.normal_family, UINT32_MAX);
  EXPECT_FALSE(p.has_priorities());
}

}  // namespace
}  // namespace polychip::vulkan
