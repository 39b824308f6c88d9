// The learned step cost and the prefill chunk it sizes for an inter-token latency target:
// deterministic, costs fed in, chunk sizes checked.
#include "engine/step_cost.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace polychip::engine {
namespace {

// A device where a step costs 4 ms, plus 0.5 ms per decoding sequence, plus 0.1 ms per prompt
// token; the host adds 1 ms to every step.
constexpr double kFixed = 4e-3, kPerSeq = 0.5e-3, kPerToken = 0.1e-3, kHost = 1e-3;
double DeviceTime(int64_t seqs, int64_t tokens) {
  return kFixed + kPerSeq * seqs + kPerToken * tokens;
}

void Feed(StepCostModel* m, bool with_device_time) {
  const int64_t seqs[] = {8, 8, 7, 8, 9, 8, 6, 8};
  const int64_t tokens[] = {0, 256, 0, 512, 0, 128, 64, 0};
  for (int rep = 0; rep < 3; ++rep) {
    for (int i = 0; i < 8; ++i) {
      const double device = DeviceTime(seqs[i], tokens[i]);
      m->Observe(seqs[i], tokens[i], device + kHost,
                 with_device_time ? std::optional<double>(device) : std::nullopt);
    }
  }
}

TEST(StepCostTest, NotReadyUntilItHasSeenPrefillAndDecodeSteps) {
  StepCostModel m;
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 10; ++i) m.Observe(8, 0, DeviceTime(8, 0), std::nullopt);
  EXPECT_FALSE(m.ready());  // no step with prompt tokens yet: their cost is unknown
  m.Observe(8, 100, DeviceTime(8, 100), std::nullopt);
  EXPECT_TRUE(m.ready());
  StepCostModel fresh;
  fresh.Observe(0, 64, DeviceTime(0, 64), std::nullopt);  // one prefill step alone: too few
  EXPECT_FALSE(fresh.ready());
}

TEST(StepCostTest, LearnsTheCostsFromDeviceTimeAndAddsTheHostShare) {
  StepCostModel m;
  Feed(&m, /*with_device_time=*/true);
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.PrefillTokenSeconds(), kPerToken, 1e-7);
  EXPECT_NEAR(m.Predict(8, 0), DeviceTime(8, 0) + kHost, 2e-5);
  EXPECT_NEAR(m.Predict(8, 1000), DeviceTime(8, 1000) + kHost, 2e-5);
}

TEST(StepCostTest, LearnsFromWallTimeWithoutDeviceTime) {
  StepCostModel m;
  Feed(&m, /*with_device_time=*/false);
  EXPECT_NEAR(m.PrefillTokenSeconds(), kPerToken, 1e-7);
  EXPECT_NEAR(m.Predict(8, 300), DeviceTime(8, 300) + kHost, 2e-5);
}

TEST(StepCostTest, BudgetKeepsTheStepWithinTheTarget) {
  StepCostModel m;
  Feed(&m, true);
  // 8 sequences decoding: 4 + 8 · 0.5 + 1 (host) = 9 ms without prompt tokens. A 20 ms target
  // leaves 11 ms: 110 tokens at 0.1 ms.
  EXPECT_NEAR(m.PrefillBudget(8, 20e-3, kMinPrefillChunk, 2048), 110, 1);
  // A looser target, more tokens; a tighter one, fewer.
  EXPECT_NEAR(m.PrefillBudget(8, 50e-3, kMinPrefillChunk, 2048), 410, 1);
  EXPECT_NEAR(m.PrefillBudget(8, 12e-3, kMinPrefillChunk, 2048), 30, 1);
  // More streams decoding take more of the step: 16 seqs = 4 + 8 + 1 = 13 ms, 7 ms left.
  EXPECT_NEAR(m.PrefillBudget(16, 20e-3, kMinPrefillChunk, 2048), 70, 1);
  const int32_t b = m.PrefillBudget(8, 20e-3, kMinPrefillChunk, 2048);
  EXPECT_LE(m.Predict(8, b), 20e-3 + 1e-6);
  EXPECT_GT(m.Predict(8, b + 2), 20e-3);
}

TEST(StepCostTest, BudgetIsClampedToTheFloorAndTheCeiling) {
  StepCostModel m;
  Feed(&m, true);
  EXPECT_EQ(m.PrefillBudget(8, 5e-3, 16, 2048), 16);    // even decode alone misses 5 ms
  EXPECT_EQ(m.PrefillBudget(8, 10.0, 16, 512), 512);    // the ceiling
  EXPECT_EQ(m.PrefillBudget(8, 9.5e-3, 16, 2048), 16);  // 0.5 ms left = 5 tokens < floor
  EXPECT_EQ(m.PrefillBudget(8, 9.5e-3, 16, 8), 16);     // a ceiling under the floor: the floor
}

// The engine's floor is a few tokens, not a KV block: a target that leaves room for less than a
// block of prompt gets the tokens that fit (the chunk ends inside a block), and the step stays
// within the target down to the floor.
TEST(StepCostTest, FloorIsSmallerThanABlock) {
  static_assert(kMinPrefillChunk > 0 && kMinPrefillChunk < 16);
  StepCostModel m;
  Feed(&m, true);
  // 9 ms decode-only step; 9.55 ms leaves 0.55 ms = 5 tokens, 9.75 ms 7, 10.25 ms 12: each
  // fewer than a block of 16, each kept within the target.
  const std::pair<double, int32_t> cases[] = {{9.55e-3, 5}, {9.75e-3, 7}, {10.25e-3, 12}};
  for (const auto& [target, tokens] : cases) {
    const int32_t b = m.PrefillBudget(8, target, kMinPrefillChunk, 2048);
    EXPECT_EQ(b, tokens) << target;
    EXPECT_LE(m.Predict(8, b), target + 1e-6) << target;
    EXPECT_GT(m.Predict(8, b + 1), target - 1e-6) << target;
  }
  // Less than the floor's worth left (0.2 ms = 2 tokens), or none: the floor, so a prefill
  // still moves on.
  EXPECT_EQ(m.PrefillBudget(8, 9.2e-3, kMinPrefillChunk, 2048), kMinPrefillChunk);
  EXPECT_EQ(m.PrefillBudget(8, 1e-3, kMinPrefillChunk, 2048), kMinPrefillChunk);
}

// Noisy first steps can fit a negative cost per prompt token (here a slow warm-up step with a
// short prompt, then a fast one with a longer prompt): the budget is then the floor, not the
// ceiling that would let a whole long prompt into one step, and once steps show what prompt
// tokens cost, the budget follows.
TEST(StepCostTest, NoLearnedPromptCostMeansTheFloor) {
  StepCostModel m;
  m.Observe(0, 16, 300e-3, 300e-3);  // warm-up
  m.Observe(1, 48, 150e-3, 150e-3);
  for (int i = 0; i < 4; ++i) m.Observe(4, 0, 50e-3, 50e-3);
  ASSERT_TRUE(m.ready());
  ASSERT_LE(m.PrefillTokenSeconds(), 0.0);
  EXPECT_EQ(m.PrefillBudget(4, 60e-3, kMinPrefillChunk, 512), kMinPrefillChunk);
  // Floor-sized chunks at 5 ms a token: the cost is learned and the budget grows to what fits
  // 60 ms beside a 50 ms decode step (2 tokens: the floor), then 100 ms (10).
  for (int i = 0; i < 300; ++i) {  // long enough for the warm-up steps to fade (0.98^300)
    const int64_t tokens = i % 2 ? kMinPrefillChunk : 0;
    m.Observe(4, tokens, 50e-3 + 5e-3 * tokens, 50e-3 + 5e-3 * tokens);
  }
  EXPECT_NEAR(m.PrefillTokenSeconds(), 5e-3, 2e-4);
  // Every step decodes 4 sequences, so the fit splits the 50 ms between the fixed cost and the
  // per-sequence one at will (here with a negative per-sequence cost): the prediction holds.
  EXPECT_NEAR(m.Predict(4, 0), 50e-3, 1e-3);
  EXPECT_EQ(m.PrefillBudget(4, 60e-3, kMinPrefillChunk, 512), kMinPrefillChunk);
  EXPECT_NEAR(m.PrefillBudget(4, 100.5e-3, kMinPrefillChunk, 512), 10, 1);
}

// Prompt chunks beside decoding streams grow from the floor, at most doubling the largest one
// seen so far, up to what the fit says keeps the target: a cost learned only from startup steps
// (prompts alone, no stream decoding) is not trusted with a long prompt in one step.
TEST(StepCostTest, ChunkBesideDecodesAtMostDoublesTheLargestSeen) {
  StepCostModel m;
  m.Observe(0, 48, DeviceTime(0, 48), DeviceTime(0, 48));  // the streams' prompts
  for (int i = 0; i < 4; ++i) m.Observe(8, 0, DeviceTime(8, 0), DeviceTime(8, 0));
  ASSERT_TRUE(m.ready());
  // No step has carried prompt tokens beside decodes: the floor, whatever the target.
  EXPECT_EQ(m.PrefillBudget(8, 1.0, kMinPrefillChunk, 2048), kMinPrefillChunk);
  std::vector<int32_t> chunks;
  for (int i = 0; i < 12; ++i) {
    const int32_t b = m.PrefillBudget(8, 1.0, kMinPrefillChunk, 2048);
    chunks.push_back(b);
    m.Observe(8, b, DeviceTime(8, b), DeviceTime(8, b));
  }
  const std::vector<int32_t> expected = {4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 2048, 2048};
  EXPECT_EQ(chunks, expected);
  // The target still wins over the doubling: 20 ms beside 8 decodes (8 ms, no host share here)
  // leaves 12 ms, 120 tokens.
  EXPECT_NEAR(m.PrefillBudget(8, 20e-3, kMinPrefillChunk, 2048), 120, 1);
}

TEST(StepCostTest, FollowsAChangeOfCost) {
  StepCostModel m;
  Feed(&m, true);
  // The device slows down 2x (another tenant, a clock change): the recent steps win.
  for (int rep = 0; rep < 40; ++rep) {
    for (int64_t tokens : {0, 256, 0, 128}) {
      const double device = 2 * DeviceTime(8, tokens);
      m.Observe(8, tokens, device + kHost, device);
    }
  }
  EXPECT_NEAR(m.PrefillTokenSeconds(), 2 * kPerToken, 2 * kPerToken * 0.05);
  // 8 seqs: 16 ms + 1 ms host, 30 ms target: 13 ms left at 0.2 ms = 65 tokens.
  EXPECT_NEAR(m.PrefillBudget(8, 30e-3, kMinPrefillChunk, 2048), 65, 3);
}

}  // namespace
}  // namespace polychip::engine
