// The decode weight-streams tuner (plugins/backends/cpu/streams_tuner.h) on simulated hosts:
// a launch's time is the matrix's size times the host's cost of each stream count.
#include "streams_tuner.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace polychip::cpu {
namespace {

// One decode step: every matrix launched once, in order, timed by the host's cost per stream
// count (ns per launch = size * cost[streams - 1]).
void Step(StreamsTuner* t, const std::vector<int64_t>& sizes,
          const std::array<double, StreamsTuner::kCandidates>& cost) {
  for (const int64_t& size : sizes) {  // the element's address stands for the weights
    const int s = t->Pick(&size);
    ASSERT_GE(s, 1);
    ASSERT_LE(s, StreamsTuner::kCandidates);
    t->Record(&size, s, static_cast<int64_t>(static_cast<double>(size) * cost[s - 1]));
  }
}

constexpr int kExploreSteps = StreamsTuner::kRoundsPerCandidate * StreamsTuner::kCandidates;

TEST(StreamsTuner, KeepsTheFastestCountOnEachHost) {
  const std::vector<int64_t> sizes = {900, 900, 4800, 4800, 4800, 150000, 7};
  for (int fastest = 1; fastest <= StreamsTuner::kCandidates; ++fastest) {
    SCOPED_TRACE("fastest " + std::to_string(fastest));
    std::array<double, StreamsTuner::kCandidates> cost;
    cost.fill(1.0);
    cost[fastest - 1] = 0.9;
    std::vector<std::string> log;
    StreamsTuner t([&](const std::string& msg) { log.push_back(msg); });
    for (int step = 0; step < kExploreSteps; ++step) {
      ASSERT_TRUE(t.exploring()) << "step " << step;
      Step(&t, sizes, cost);
    }
    EXPECT_FALSE(t.exploring());
    EXPECT_EQ(t.best(), fastest);
    ASSERT_EQ(log.size(), 1u);
    EXPECT_NE(log[0].find("weight streams: " + std::to_string(fastest)), std::string::npos)
        << log[0];
    for (const int64_t& size : sizes) EXPECT_EQ(t.Pick(&size), fastest);
  }
}

// A step of three matrices, one of them large: a rotation by launch count would give the large
// one the same candidate at every step (3 launches per step, 3 candidates) and charge its time
// to that candidate alone. Per-matrix turns find the candidate that is faster on every matrix.
TEST(StreamsTuner, AMixOfLargeAndSmallMatricesDoesNotBiasTheChoice) {
  const std::vector<int64_t> sizes = {1000000, 1000, 1000};
  for (int fastest = 1; fastest <= StreamsTuner::kCandidates; ++fastest) {
    SCOPED_TRACE("fastest " + std::to_string(fastest));
    std::array<double, StreamsTuner::kCandidates> cost;
    cost.fill(1.0);
    cost[fastest - 1] = 0.97;
    StreamsTuner t;
    for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, cost);
    ASSERT_FALSE(t.exploring());
    EXPECT_EQ(t.best(), fastest);
  }
}

TEST(StreamsTuner, ExploresAgainAndFollowsTheHost) {
  const std::vector<int64_t> sizes = {900, 4800, 4800, 150000};
  StreamsTuner t;
  for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, {0.8, 1.0, 1.0});
  ASSERT_EQ(t.best(), 1);
  ASSERT_EQ(t.decisions(), 1);
  // The host's memory changes: three streams are now the fastest. The tuner keeps one stream
  // for its exploitation rounds, then measures again.
  for (int step = 0; step < StreamsTuner::kExploitRounds; ++step) {
    ASSERT_FALSE(t.exploring()) << "step " << step;
    for (const int64_t& size : sizes) ASSERT_EQ(t.Pick(&size), 1);
    Step(&t, sizes, {1.0, 0.95, 0.8});
  }
  EXPECT_TRUE(t.exploring());
  for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, {1.0, 0.95, 0.8});
  EXPECT_FALSE(t.exploring());
  EXPECT_EQ(t.best(), 3);
  EXPECT_EQ(t.decisions(), 2);
}

// A matrix launched with one candidate only (it was first seen as an exploration ended) is left
// out of the comparison rather than counted as free for the others (which would make one stream,
// the fastest here, look the slowest).
TEST(StreamsTuner, OnlyMatricesMeasuredWithEveryCountAreCompared) {
  std::vector<int64_t> sizes = {1000, 1000};
  StreamsTuner t;
  for (int step = 0; step < kExploreSteps - 1; ++step) Step(&t, sizes, {0.9, 1.0, 1.0});
  ASSERT_TRUE(t.exploring());
  // A huge matrix appears, launched once, with one stream.
  const int64_t huge = 100000000;
  ASSERT_EQ(t.Pick(&huge), 1);
  t.Record(&huge, 1, huge);
  for (int i = 0; i < 100 && t.exploring(); ++i) Step(&t, sizes, {0.9, 1.0, 1.0});
  ASSERT_FALSE(t.exploring());
  EXPECT_EQ(t.best(), 1);
}

}  // namespace
}  // namespace polychip::cpu
