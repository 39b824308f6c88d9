#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace polychip::engine {
namespace {

std::vector<float> Logits(std::initializer_list<float> v) { return std::vector<float>(v); }

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(Greedy(), 4, {});
  EXPECT_EQ(s.Sample(Logits({0.f, 3.f, 1.f, 3.f})).token, 1);
  EXPECT_EQ(s.Sample(Logits({5.f, 3.f, 1.f, 3.f})).token, 0);
  EXPECT_EQ(s.n_generated(), 2);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  SamplingParams p = Greedy();
  p.top_logprobs = 2;
  p.repetition_penalty = 2.f;  // penalties must not change the reported logprobs
  std::vector<int32_t> prompt = {1};
  Sampler s(p, 3, {}, prompt);
  const auto logits = Logits({1.f, 2.f, 0.f});
  const SampleResult r = s.Sample(logits);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.0));
  EXPECT_EQ(r.token, 0);  // 2 / 2 = 1 ties with token 0, the lower id wins
  EXPECT_NEAR(r.logprob, 1.0 - lse, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].token, 1);
  EXPECT_NEAR(r.top_logprobs[0].logprob, 2.0 - lse, 1e-6);
  EXPECT_EQ(r.top_logprobs[1].token, 0);
  EXPECT_NEAR(LogSoftmaxAt(logits, 2), 0.0 - lse, 1e-9);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 4.f;
  std::vector<int32_t> prompt = {0, 2};
  Sampler s(p, 3, {}, prompt);
  // token 0: 4 -> 1; token 1: 2 unchanged; token 2: -0.1 -> -0.4
  EXPECT_EQ(s.Sample(Logits({4.f, 2.f, -0.1f})).token, 1);
  SamplingParams off = Greedy();
  Sampler s2(off, 3, {}, prompt);
  EXPECT_EQ(s2.Sample(Logits({4.f, 2.f, -0.1f})).token, 0);
}

TEST(SamplerTest, FrequencyAndPresencePenaltiesCountGeneratedTokensOnly) {
  SamplingParams p = Greedy();
  p.frequency_penalty = 1.f;
  std::vector<int32_t> prompt = {0, 0, 0};  // the prompt is not penalised
  Sampler s(p, 2, {}, prompt);
  EXPECT_EQ(s.Sample(Logits({2.5f, 1.f})).token, 0);  // no generated 0 yet
  EXPECT_EQ(s.Sample(Logits({2.5f, 1.f})).token, 0);  // 2.5 - 1 = 1.5 > 1
  EXPECT_EQ(s.Sample(Logits({2.5f, 1.f})).token, 1);  // 2.5 - 2 = 0.5 < 1

  SamplingParams q = Greedy();
  q.presence_penalty = 1.f;
  Sampler t(q, 2, {});
  EXPECT_EQ(t.Sample(Logits({2.5f, 1.f})).token, 0);
  EXPECT_EQ(t.Sample(Logits({2.5f, 1.f})).token, 0);  // presence counts once: 1.5 > 1
  EXPECT_EQ(t.Sample(Logits({1.9f, 1.f})).token, 1);  // 0.9 < 1
}

TEST(SamplerTest, PenaltyWindowLimitsHistory) {
  SamplingParams p = Greedy();
  p.repetition_penalty = 10.f;
  p.penalty_last_n = 1;
  std::vector<int32_t> prompt = {0, 1};  // only token 1 is in the window
  Sampler s(p, 2, {}, prompt);
  EXPECT_EQ(s.Sample(Logits({2.f, 3.f})).token, 0);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.f;
  std::vector<float> flat(64, 0.f);
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, 64, {});
    std::vector<int32_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(s.Sample(flat).token);
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, TemperatureSamplesFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.f;
  p.seed = 1;
  Sampler s(p, 2, {});
  const auto logits = Logits({0.f, std::log(3.f)});  // p = 0.25, 0.75
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) ones += s.Sample(logits).token;
  EXPECT_NEAR(double(ones) / n, 0.75, 0.03);
}

TEST(SamplerTest, TopKKeepsOnlyKBest) {
  SamplingParams p;
  p.temperature = 5.f;  // nearly flat
  p.top_k = 2;
  p.seed = 3;
  Sampler s(p, 5, {});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) seen[s.Sample(Logits({0.f, 1.f, 3.f, 2.f, 0.5f})).token]++;
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[3], 0);
}

TEST(SamplerTest, TopPKeepsTheNucleus) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_p = 0.7f;  // p = {0.5, 0.3, 0.2}: keeps the first two (cumulative 0.8 >= 0.7)
  p.seed = 5;
  Sampler s(p, 3, {});
  const auto logits = Logits({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 1000; ++i) seen[s.Sample(logits).token]++;
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[0] / 1000.0, 0.5 / 0.8, 0.05);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.f;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 * p_max
  p.seed = 9;
  Sampler s(p, 3, {});
  const auto logits = Logits({std::log(0.5f), std::log(0.3f), std::log(0.2f)});
  std::map<int32_t, int> seen;
  for (int i = 0; i < 1000; ++i) seen[s.Sample(logits).token]++;
  EXPECT_EQ(seen.count(2), 0u);  // 0.2 < 0.25
  EXPECT_GT(seen[1], 0);
}

TEST(SamplerTest, MinTokensMasksStopTokensUnlessIgnoreEos) {
  SamplingParams p = Greedy();
  p.min_tokens = 2;
  p.stop_token_ids = {2};
  Sampler s(p, 3, /*eog=*/{0});
  const auto logits = Logits({9.f, 1.f, 8.f});
  EXPECT_EQ(s.Sample(logits).token, 1);
  EXPECT_EQ(s.Sample(logits).token, 1);
  EXPECT_EQ(s.Sample(logits).token, 0);  // min_tokens reached
  p.ignore_eos = true;
  Sampler t(p, 3, {0});
  EXPECT_EQ(t.Sample(logits).token, 0);  // EOS is an ordinary token now
}

TEST(StopCheckerTest, StopTokenEndsWithoutItsText) {
  SamplingParams p;
  StopChecker c(p, {7});
  auto a = c.Push(3, "Hello");
  EXPECT_EQ(a.text, "Hello");
  EXPECT_EQ(a.finish, FinishReason::kNone);
  auto b = c.Push(7, "</s>");
  EXPECT_EQ(b.text, "");
  EXPECT_EQ(b.finish, FinishReason::kStop);
  EXPECT_EQ(b.stop_token, 7);
  EXPECT_TRUE(c.finished());
}

TEST(StopCheckerTest, IgnoreEosKeepsGoing) {
  SamplingParams p;
  p.ignore_eos = true;
  StopChecker c(p, {7});
  EXPECT_EQ(c.Push(7, "</s>").finish, FinishReason::kNone);
}

TEST(StopCheckerTest, StopStringAcrossTokensIsNotEmitted) {
  SamplingParams p;
  p.stop = {"END"};
  StopChecker c(p, {});
  std::string out;
  auto s1 = c.Push(1, "abc E");
  out += s1.text;
  EXPECT_EQ(s1.text, "abc ");  // "E" may start the stop string
  auto s2 = c.Push(2, "N");
  out += s2.text;
  EXPECT_EQ(s2.text, "");
  auto s3 = c.Push(3, "Dxyz");
  out += s3.text;
  EXPECT_EQ(s3.finish, FinishReason::kStop);
  EXPECT_EQ(s3.stop_matched, "END");
  EXPECT_EQ(out, "abc ");
}

TEST(StopCheckerTest, FalseStartIsReleased) {
  SamplingParams p;
  p.stop = {"END"};
  StopChecker c(p, {});
  EXPECT_EQ(c.Push(1, "E").text, "");
  EXPECT_EQ(c.Push(2, "Nx").text, "ENx");
}

TEST(StopCheckerTest, EarliestStopStringWins) {
  SamplingParams p;
  p.stop = {"cd", "b"};
  StopChecker c(p, {});
  auto s = c.Push(1, "abcd");
  EXPECT_EQ(s.text, "a");
  EXPECT_EQ(s.stop_matched, "b");
}

TEST(StopCheckerTest, MinTokensDelaysStops) {
  SamplingParams p;
  p.stop = {"x"};
  p.min_tokens = 1;
  StopChecker c(p, {9});
  auto a = c.Push(9, "<eos>");  // first token: too early to stop
  EXPECT_EQ(a.finish, FinishReason::kNone);
  EXPECT_EQ(c.Push(1, "x").finish, FinishReason::kStop);
}

TEST(StopCheckerTest, MaxTokensFinishesWithLength) {
  SamplingParams p;
  p.max_tokens = 2;
  StopChecker c(p, {});
  EXPECT_EQ(c.Push(1, "a").finish, FinishReason::kNone);
  auto s = c.Push(2, "b");
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.text, "b");
}

TEST(StopCheckerTest, HoldsIncompleteUtf8) {
  SamplingParams p;
  StopChecker c(p, {});
  // U+20AC (euro sign) split over three tokens.
  EXPECT_EQ(c.Push(1, "a\xE2").text, "a");
  EXPECT_EQ(c.Push(2, "\x82").text, "");
  EXPECT_EQ(c.Push(3, "\xAC!").text, "\xE2\x82\xAC!");
  EXPECT_EQ(c.Push(4, "\xF0\x9F").text, "");
  EXPECT_EQ(c.Flush(), "\xEF\xBF\xBD");  // the unfinished sequence becomes U+FFFD
}

TEST(Utf8Test, InvalidBytesAreReplaced) {
  size_t consumed = 0;
  EXPECT_EQ(TakeCompleteUtf8("a\xFF" "b", &consumed), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(consumed, 3u);
  EXPECT_EQ(TakeCompleteUtf8("\xC3(", &consumed), "\xEF\xBF\xBD(");
  EXPECT_EQ(TakeCompleteUtf8("\xC3", &consumed), "");
  EXPECT_EQ(consumed, 0u);
}

}  // namespace
}  // namespace polychip::engine
