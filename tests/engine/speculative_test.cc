// Speculative decoding in the scheduler, over the fake runner whose outputs depend on the KV it
// reads back (so a wrong block table, a lost rollback or a wrong count of verified positions
// changes the tokens): greedy outputs equal the model's with a perfect draft, a draft that is
// often wrong, and n-gram lookup, with the prefix cache, preemption and concurrent requests;
// sampled outputs keep the target's distribution (chi-square over many requests on a model
// with a real distribution); the per-request opt-out and the batch-size switch.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/fake_runner.h"

namespace polychip::engine {
namespace {

using testing::FakeRunner;
constexpr int64_t kVocab = 97;

std::string Piece(int32_t t) { return std::string(1, static_cast<char>('a' + t % 26)); }

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 1 + (seed * 31 + i * 7) % (kVocab - 1);
  return p;
}

EngineOptions Spec(SpecAlgorithm a, int k) {
  EngineOptions o;
  o.speculative.algorithm = a;
  o.speculative.num_draft_tokens = k;
  o.speculative.disable_batch_size = 64;
  return o;
}

// Submits every prompt, runs to the end, returns each request's tokens (and checks it ended
// without error).
std::vector<std::vector<int32_t>> Generate(Engine& engine,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int max_tokens, bool speculative = true) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    GenerateInput in;
    in.prompt = p;
    in.params.max_tokens = max_tokens;
    in.speculative = speculative;
    auto s = engine.Submit(in);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return {};
    streams.push_back(*s);
  }
  engine.RunUntilIdle();
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    out.emplace_back();
    bool finished = false;
    for (auto& ev : s->Pop(std::chrono::milliseconds(0))) {
      out.back().insert(out.back().end(), ev.tokens.begin(), ev.tokens.end());
      EXPECT_EQ(ev.tokens.size(), ev.logprobs.size());
      if (ev.finished) {
        finished = true;
        EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
        EXPECT_LE(ev.spec_accepted_tokens, ev.spec_draft_tokens);
      }
    }
    EXPECT_TRUE(finished);
  }
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
  return out;
}

std::vector<std::vector<int32_t>> References(const std::vector<std::vector<int32_t>>& prompts,
                                             int n) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(FakeRunner::Reference(p, n, kVocab));
  return want;
}

TEST(Speculative, PerfectDraftAcceptsEveryTokenAndMatchesGreedy) {
  FakeRunner target(kVocab, 256, 4, 128), draft(kVocab, 256, 4, 128);
  Engine engine(&target, Spec(SpecAlgorithm::kDraft, 4), Piece, {0}, &draft);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(10, 1), Prompt(7, 2), Prompt(13, 3)};
  EXPECT_EQ(Generate(engine, prompts, 30), References(prompts, 30));
  const EngineStats st = engine.Stats();
  EXPECT_GT(st.spec_verify_steps, 0);
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  // 30 tokens: the first from the prefill, then 5 per pass (4 drafts and the bonus).
  EXPECT_EQ(st.spec_emitted_tokens, 3 * 29);
  EXPECT_LE(st.spec_verify_steps, 3 * 6);
}

TEST(Speculative, WrongDraftsAreRejectedAndTheDraftRollsBack) {
  FakeRunner target(kVocab, 256, 4, 128), draft(kVocab, 256, 4, 128);
  draft.set_disagree_every(5);
  Engine engine(&target, Spec(SpecAlgorithm::kDraft, 4), Piece, {0}, &draft);
  const std::vector<std::vector<int32_t>> prompts = {Prompt(10, 1), Prompt(9, 4)};
  EXPECT_EQ(Generate(engine, prompts, 60), References(prompts, 60));
  const EngineStats st = engine.Stats();
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  // One position in five is wrong: a draft whose KV kept rejected tokens (no rollback) would
  // read a different history and be wrong nearly always.
  EXPECT_GT(st.spec_accepted_tokens, st.spec_draft_tokens / 3);
}

TEST(Speculative, NgramLookupMatchesGreedy) {
  FakeRunner target(kVocab, 512, 4, 256);
  Engine engine(&target, Spec(SpecAlgorithm::kNgram, 3), Piece, {0});
  // A prompt that holds its own continuation: the model's greedy output, twice over.
  std::vector<int32_t> prompt = Prompt(6, 5);
  const std::vector<int32_t> cont = FakeRunner::Reference(prompt, 40, kVocab);
  std::vector<int32_t> p2 = prompt;
  p2.insert(p2.end(), cont.begin(), cont.end());
  p2.insert(p2.end(), prompt.begin(), prompt.end());
  const std::vector<std::vector<int32_t>> prompts = {p2, Prompt(12, 6)};
  EXPECT_EQ(Generate(engine, prompts, 30), References(prompts, 30));
  EXPECT_GT(engine.Stats().spec_accepted_tokens, 0);
}

TEST(Speculative, PrefixCacheAndPreemptionKeepOutputs) {
  // 40 blocks of 4 for 6 requests of up to 8 + 60 tokens: preemption by recompute happens, and
  // the second wave reuses the first's cached prefixes.
  FakeRunner target(kVocab, 128, 4, 40), draft(kVocab, 128, 4, 64);
  draft.set_disagree_every(7);
  EngineOptions o = Spec(SpecAlgorithm::kDraft, 3);
  o.chunked_prefill_size = 8;
  Engine engine(&target, o, Piece, {0}, &draft);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(Prompt(8, 10 + i % 3));
  EXPECT_EQ(Generate(engine, prompts, 60), References(prompts, 60));
  EXPECT_GT(engine.Stats().preemptions, 0);
  EXPECT_EQ(Generate(engine, prompts, 20), References(prompts, 20));
  EXPECT_GT(engine.Stats().prefix.hit_tokens, 0);
}

TEST(Speculative, OptOutAndBusyBatchesDecodePlainly) {
  FakeRunner target(kVocab, 256, 4, 128), draft(kVocab, 256, 4, 128);
  EngineOptions o = Spec(SpecAlgorithm::kDraft, 4);
  o.speculative.disable_batch_size = 2;
  Engine engine(&target, o, Piece, {0}, &draft);
  const std::vector<std::vector<int32_t>> one = {Prompt(5, 1)};
  EXPECT_EQ(Generate(engine, one, 10, /*speculative=*/false), References(one, 10));
  EXPECT_EQ(engine.Stats().spec_verify_steps, 0);
  const std::vector<std::vector<int32_t>> three = {Prompt(5, 1), Prompt(5, 2), Prompt(5, 3)};
  EXPECT_EQ(Generate(engine, three, 10), References(three, 10));
  EXPECT_EQ(engine.Stats().spec_verify_steps, 0);
  EXPECT_GT(engine.Stats().spec_skipped_steps, 0);
}

TEST(Speculative, StopTokenInsideAcceptedDraftsEndsTheRequest) {
  FakeRunner target(kVocab, 256, 4, 128), draft(kVocab, 256, 4, 128);
  Engine engine(&target, Spec(SpecAlgorithm::kDraft, 4), Piece, {0}, &draft);
  const std::vector<int32_t> prompt = Prompt(10, 1);
  const std::vector<int32_t> ref = FakeRunner::Reference(prompt, 12, kVocab);
  GenerateInput in;
  in.prompt = prompt;
  in.params.max_tokens = 40;
  in.params.stop_token_ids = {ref[6]};  // the 7th token stops it, mid-pass
  auto s = engine.Submit(in);
  ASSERT_TRUE(s.ok());
  engine.RunUntilIdle();
  std::vector<int32_t> got;
  StreamEvent last;
  for (auto& ev : (*s)->Pop(std::chrono::milliseconds(0))) {
    got.insert(got.end(), ev.tokens.begin(), ev.tokens.end());
    if (ev.finished) last = ev;
  }
  const auto stop = std::find(ref.begin(), ref.end(), ref[6]);
  EXPECT_EQ(got, std::vector<int32_t>(ref.begin(), stop + 1));
  EXPECT_EQ(last.finish, FinishReason::kStop);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
}

// The chi-square statistic's 99.9% quantile for `df` degrees of freedom (Wilson-Hilferty).
double ChiSquareQuantile999(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + z * std::sqrt(a), 3);
}

// Sampled tokens through speculation have the target's distribution: three tokens after a
// fixed prompt (the first from the prefill, the next two from verification passes), counted
// over many requests and compared with the exact probabilities of the target model. Both a
// sampled draft (q a real distribution) and n-gram lookup (q one-hot) are checked.
void CheckDistribution(SpecAlgorithm algorithm) {
  constexpr int64_t kV = 5;
  constexpr int kRequests = 6000;
  FakeRunner target(kV, 64, 4, 2048), draft(kV, 64, 4, 2048);
  target.set_soft(true);
  draft.set_soft(true);
  draft.set_disagree_every(2);  // a draft whose distribution differs from the target's
  EngineOptions o = Spec(algorithm, 2);
  o.speculative.adaptive = false;
  o.max_running_requests = 128;
  o.max_queued_requests = kRequests;
  o.speculative.disable_batch_size = 1 << 20;
  Engine engine(&target, o, Piece, {}, algorithm == SpecAlgorithm::kDraft ? &draft : nullptr);
  // For n-gram lookup the prompt repeats, so that drafts are proposed.
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2, 3, 4, 1, 2, 4, 3, 1, 2};
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < kRequests; ++i) {
    GenerateInput in;
    in.prompt = prompt;
    in.params.max_tokens = 3;
    in.params.temperature = 1.f;
    in.params.seed = 1000 + i;
    auto s = engine.Submit(in);
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  engine.RunUntilIdle();
  std::map<std::vector<int32_t>, int> counts;
  for (auto& s : streams) {
    std::vector<int32_t> t;
    for (auto& ev : s->Pop(std::chrono::milliseconds(0))) t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
    ASSERT_EQ(t.size(), 3u);
    ++counts[t];
  }
  EXPECT_GT(engine.Stats().spec_verify_steps, kRequests / 2);
  EXPECT_GT(engine.Stats().spec_accepted_tokens, 0);
  EXPECT_LT(engine.Stats().spec_accepted_tokens, engine.Stats().spec_draft_tokens);
  // The exact probability of every 3-token continuation.
  auto probs = [&](std::vector<int32_t> h) {
    std::vector<float> row = FakeRunner::Row(h, kV, true, 0);
    double z = 0;
    for (float v : row) z += std::exp(double(v));
    std::vector<double> p;
    for (float v : row) p.push_back(std::exp(double(v)) / z);
    return p;
  };
  double chi2 = 0;
  int cells = 0;
  for (int32_t a = 0; a < kV; ++a) {
    std::vector<int32_t> h = prompt;
    const double pa = probs(h)[a];
    h.push_back(a);
    const std::vector<double> pb = probs(h);
    for (int32_t b = 0; b < kV; ++b) {
      h.push_back(b);
      const std::vector<double> pc = probs(h);
      for (int32_t c = 0; c < kV; ++c) {
        const double expected = kRequests * pa * pb[b] * pc[c];
        const auto it = counts.find({a, b, c});
        const double got = it == counts.end() ? 0 : it->second;
        chi2 += (got - expected) * (got - expected) / expected;
        ++cells;
      }
      h.pop_back();
    }
  }
  EXPECT_LT(chi2, ChiSquareQuantile999(cells - 1)) << "over " << cells << " continuations";
}

TEST(Speculative, SampledDraftKeepsTheTargetDistribution) {
  CheckDistribution(SpecAlgorithm::kDraft);
}

TEST(Speculative, SampledNgramKeepsTheTargetDistribution) {
  CheckDistribution(SpecAlgorithm::kNgram);
}

}  // namespace
}  // namespace polychip::engine
