// The decode weight-read tuner (plugins/backends/cpu/streams_tuner.h) on simulated hosts: a
// launch's time is the matrix's size times the host's cost of each candidate way of reading.
#include "streams_tuner.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace polychip::cpu {
namespace {

using Costs = std::array<double, StreamsTuner::kCandidates>;

// One decode step: every matrix launched once, in order, timed by the host's cost per
// candidate (ns per launch = size * cost[candidate]).
void Step(StreamsTuner* t, const std::vector<int64_t>& sizes, const Costs& cost) {
  for (const int64_t& size : sizes) {  // the element's address stands for the weights
    const int c = t->Pick(&size);
    ASSERT_GE(c, 0);
    ASSERT_LT(c, StreamsTuner::kCandidates);
    t->Record(&size, c, static_cast<int64_t>(static_cast<double>(size) * cost[c]));
  }
}

// Every candidate costs 1 but `fastest`, which costs `cost`.
Costs FastestIs(int fastest, double cost) {
  Costs c;
  c.fill(1.0);
  c[fastest] = cost;
  return c;
}

constexpr int kExploreSteps = StreamsTuner::kRoundsPerCandidate * StreamsTuner::kCandidates;

TEST(StreamsTuner, CandidatesAreEveryStreamCountWithAndWithoutPrefetch) {
  int seen[StreamsTuner::kMaxStreams + 1][2] = {};
  for (int c = 0; c < StreamsTuner::kCandidates; ++c) {
    const WeightRead r = StreamsTuner::Candidate(c);
    ASSERT_GE(r.streams, 1);
    ASSERT_LE(r.streams, StreamsTuner::kMaxStreams);
    ++seen[r.streams][r.prefetch];
  }
  for (int s = 1; s <= StreamsTuner::kMaxStreams; ++s)
    EXPECT_TRUE(seen[s][0] == 1 && seen[s][1] == 1) << s << " streams";
}

TEST(StreamsTuner, KeepsTheFastestCandidateOnEachHost) {
  const std::vector<int64_t> sizes = {900, 900, 4800, 4800, 4800, 150000, 7};
  for (int fastest = 0; fastest < StreamsTuner::kCandidates; ++fastest) {
    SCOPED_TRACE("fastest " + std::to_string(fastest));
    std::vector<std::string> log;
    StreamsTuner t([&](const std::string& msg) { log.push_back(msg); });
    for (int step = 0; step < kExploreSteps; ++step) {
      ASSERT_TRUE(t.exploring()) << "step " << step;
      Step(&t, sizes, FastestIs(fastest, 0.9));
    }
    EXPECT_FALSE(t.exploring());
    EXPECT_EQ(t.best(), fastest);
    ASSERT_EQ(log.size(), 1u);
    const WeightRead r = StreamsTuner::Candidate(fastest);
    EXPECT_NE(log[0].find("weight reads: " + std::to_string(r.streams) + " stream(s) " +
                          (r.prefetch ? "with" : "without")),
              std::string::npos)
        << log[0];
    for (const int64_t& size : sizes) EXPECT_EQ(t.Pick(&size), fastest);
  }
}

// A step of six matrices (as many as the candidates), one of them large: a rotation by launch
// count would give each matrix the same candidate at every step and charge the large one's
// time to that candidate alone. Per-matrix turns find the candidate faster on every matrix.
TEST(StreamsTuner, AMixOfLargeAndSmallMatricesDoesNotBiasTheChoice) {
  const std::vector<int64_t> sizes = {1000000, 1000, 1000, 1000, 1000, 1000};
  for (int fastest = 0; fastest < StreamsTuner::kCandidates; ++fastest) {
    SCOPED_TRACE("fastest " + std::to_string(fastest));
    StreamsTuner t;
    for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, FastestIs(fastest, 0.97));
    ASSERT_FALSE(t.exploring());
    EXPECT_EQ(t.best(), fastest);
  }
}

TEST(StreamsTuner, ExploresAgainAndFollowsTheHost) {
  const std::vector<int64_t> sizes = {900, 4800, 4800, 150000};
  StreamsTuner t;
  for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, FastestIs(3, 0.8));
  ASSERT_EQ(t.best(), 3);
  ASSERT_EQ(t.decisions(), 1);
  // The host's memory changes: candidate 2 is now the fastest. The tuner keeps candidate 3 for
  // its exploitation rounds, then measures again.
  for (int step = 0; step < StreamsTuner::kExploitRounds; ++step) {
    ASSERT_FALSE(t.exploring()) << "step " << step;
    for (const int64_t& size : sizes) ASSERT_EQ(t.Pick(&size), 3);
    Step(&t, sizes, FastestIs(2, 0.8));
  }
  EXPECT_TRUE(t.exploring());
  for (int step = 0; step < kExploreSteps; ++step) Step(&t, sizes, FastestIs(2, 0.8));
  EXPECT_FALSE(t.exploring());
  EXPECT_EQ(t.best(), 2);
  EXPECT_EQ(t.decisions(), 2);
}

// Where some ways of reading are several times slower (prefetch off on a host whose hardware
// prefetcher cannot follow), they are tried in the first round only.
TEST(StreamsTuner, ACandidateFarBehindAfterTheFirstRoundIsNotTriedAgain) {
  const std::vector<int64_t> sizes = {900, 4800, 150000};
  const Costs cost = {1.0, 0.95, 1.05, 3.0, 2.5, 3.0};
  StreamsTuner t;
  int picks[StreamsTuner::kCandidates] = {};
  int steps = 0;
  for (; t.exploring() && steps < 100; ++steps) {
    for (const int64_t& size : sizes) ++picks[t.Pick(&size)];
    Step(&t, sizes, cost);
  }
  ASSERT_FALSE(t.exploring());
  EXPECT_EQ(t.best(), 1);
  // Six steps of the first round, then the three candidates left for one more round each.
  EXPECT_EQ(steps, StreamsTuner::kCandidates + 3 * (StreamsTuner::kRoundsPerCandidate - 1));
  for (int c = 0; c < StreamsTuner::kCandidates; ++c) {
    SCOPED_TRACE("candidate " + std::to_string(c));
    const int rounds =
        cost[c] > StreamsTuner::kPruneRatio * 0.95 ? 1 : StreamsTuner::kRoundsPerCandidate;
    EXPECT_EQ(picks[c], rounds * static_cast<int>(sizes.size()));
  }
}

// A matrix launched with one candidate only (it was first seen as an exploration ended) is left
// out of the comparison rather than counted as free for the others (which would make candidate
// 0, the fastest here, look the slowest).
TEST(StreamsTuner, OnlyMatricesMeasuredWithEveryCandidateAreCompared) {
  std::vector<int64_t> sizes = {1000, 1000};
  StreamsTuner t;
  for (int step = 0; step < kExploreSteps - 1; ++step) Step(&t, sizes, FastestIs(0, 0.9));
  ASSERT_TRUE(t.exploring());
  const int64_t huge = 100000000;  // appears, and is launched once, with candidate 0
  ASSERT_EQ(t.Pick(&huge), 0);
  t.Record(&huge, 0, huge);
  for (int i = 0; i < 100 && t.exploring(); ++i) Step(&t, sizes, FastestIs(0, 0.9));
  ASSERT_FALSE(t.exploring());
  EXPECT_EQ(t.best(), 0);
}

}  // namespace
}  // namespace polychip::cpu
