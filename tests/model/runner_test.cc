// The runner's contract with the engine, on a synthesized tiny model and the cpu plugin: results
// do not depend on how a step is split, batched, or where its KV blocks lie; and every other
// backend plugin the build produced computes the cpu plugin's logits. Skipped in a tree without
// the cpu plugin.
#include "model/runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "model/synth.h"
#include "runtime/plugin_loader.h"
#include "test_models.h"

namespace polychip::model {
namespace {

namespace fs = std::filesystem;
using engine::LogitsMode;
using engine::SequenceStep;

// A tiny qwen2 model (biases, NeoX rope, GQA), synthesized once.
const std::string& ModelPath() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("tiny");
    o.config.arch = Arch::kQwen2;
    o.config.has_qkv_bias = true;
    // F16: for quantized weights the cpu plugin quantizes activations to int8 (as ggml does)
    // while emu computes in F32, so cpu and emu logits would differ by design.
    o.type = DType::kF16;
    o.weight_std = 0.15f;
    o.seed = 3;
    return testing::SynthesizeTestModel("runner_qwen2_f16", o);
  }();
  return path;
}

// The backend plugins the build produced (tests/CMakeLists.txt, polychip_test_every_backend).
const std::vector<std::string>& Backends() {
  static const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return names;
}
bool Built(const std::string& name) {
  return std::ranges::find(Backends(), name) != Backends().end();
}

class RunnerTest : public testing::ModelFileTest<::testing::Test> {
 protected:
  void SetUp() override {
    if (!Built("cpu")) GTEST_SKIP() << "no cpu plugin in this tree";
    ASSERT_NO_FATAL_FAILURE(OpenModel(ModelPath()));
  }

  std::unique_ptr<TransformerRunner> Make(const std::string& backend, RunnerOptions o = {}) {
    auto dev = testing::OpenTestDevice(backend);
    if (!dev) return nullptr;
    o.context_length = 64;
    o.kv_tokens = 256;
    o.block_size = 4;
    auto r = TransformerRunner::Create(*file_, config_, dev, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }

  std::vector<int32_t> Prompt(int n, int salt = 0) const {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * 7919 + salt * 104729 + 11) % 150000);
    return t;
  }
};

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

std::vector<int32_t> Iota(int n, int from = 0) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

TEST_F(RunnerTest, SplittingAndBlockPlacementDoNotChangeLogits) {
  auto whole = Make("cpu");
  RunnerOptions small;
  small.max_tokens_per_step = 3;  // forces sub-steps inside one sequence
  small.max_logit_rows = 2;
  auto split = Make("cpu", small);
  ASSERT_TRUE(whole && split);
  const std::vector<int32_t> prompt = Prompt(10);

  std::vector<int32_t> blocks_a = Iota(16);
  std::vector<int32_t> blocks_b = Iota(16, 40);  // other blocks, in reverse order
  std::reverse(blocks_b.begin(), blocks_b.end());
  SequenceStep a{1, prompt, 0, blocks_a, LogitsMode::kAll};
  SequenceStep b{1, prompt, 0, blocks_b, LogitsMode::kAll};
  std::vector<float> la, lb;
  ASSERT_TRUE(whole->Forward({&a, 1}, &la).ok());
  ASSERT_TRUE(split->Forward({&b, 1}, &lb).ok());
  ASSERT_EQ(la.size(), prompt.size() * whole->vocab_size());
  // Not bit-identical: the plugin may pick another matmul kernel (another summation order) for
  // 3 rows than for 10. A wrong block table or split would be off by O(1), not by 1e-3.
  EXPECT_LT(MaxAbsDiff(la, lb), 2e-3f);  // (the same tolerance below)

  // kLast gives the last row of kAll; a decode step after the prompt matches a prefill of 11.
  SequenceStep last{1, prompt, 0, blocks_a, LogitsMode::kLast};
  std::vector<float> ll;
  ASSERT_TRUE(whole->Forward({&last, 1}, &ll).ok());
  std::vector<float> tail(la.end() - whole->vocab_size(), la.end());
  EXPECT_LT(MaxAbsDiff(ll, tail), 2e-3f);

  const int32_t next = 4242;
  SequenceStep decode{1, {&next, 1}, 10, blocks_a, LogitsMode::kLast};
  std::vector<float> ld;
  ASSERT_TRUE(whole->Forward({&decode, 1}, &ld).ok());
  std::vector<int32_t> longer = prompt;
  longer.push_back(next);
  SequenceStep fresh{2, longer, 0, blocks_b, LogitsMode::kLast};
  std::vector<float> lf;
  ASSERT_TRUE(split->Forward({&fresh, 1}, &lf).ok());
  EXPECT_LT(MaxAbsDiff(ld, lf), 2e-3f);
}

TEST_F(RunnerTest, BatchedSequencesMatchSeparateRuns) {
  auto r = Make("cpu");
  ASSERT_TRUE(r);
  const std::vector<int32_t> p1 = Prompt(7, 1), p2 = Prompt(5, 2);
  const std::vector<int32_t> b1 = Iota(8), b2 = Iota(8, 20);
  SequenceStep s1{1, p1, 0, b1, LogitsMode::kLast};
  SequenceStep s2{2, p2, 0, b2, LogitsMode::kAll};
  std::vector<float> sep1, sep2, both;
  ASSERT_TRUE(r->Forward({&s1, 1}, &sep1).ok());
  ASSERT_TRUE(r->Forward({&s2, 1}, &sep2).ok());
  SequenceStep batch[2] = {s1, s2};
  ASSERT_TRUE(r->Forward(batch, &both).ok());
  std::vector<float> expected = sep1;
  expected.insert(expected.end(), sep2.begin(), sep2.end());
  EXPECT_LT(MaxAbsDiff(both, expected), 2e-3f);
}

// Hidden-state rows (embeddings) interleave with logits rows in batch order, each of its own
// width, through sub-steps and logit-row chunks; kHiddenLast is the last row of kHiddenAll.
TEST_F(RunnerTest, HiddenStatesBesideLogits) {
  RunnerOptions small;
  small.max_tokens_per_step = 3;
  small.max_logit_rows = 2;
  auto r = Make("cpu", small);
  ASSERT_TRUE(r);
  const int64_t d = r->hidden_size(), v = r->vocab_size();
  ASSERT_EQ(d, config_.n_embd);
  const std::vector<int32_t> p1 = Prompt(7, 1), p2 = Prompt(5, 2);
  const std::vector<int32_t> b1 = Iota(8), b2 = Iota(8, 20), b3 = Iota(8, 40);
  SequenceStep all{1, p1, 0, b1, LogitsMode::kHiddenAll};
  SequenceStep logits{2, p2, 0, b2, LogitsMode::kLast};
  SequenceStep last{3, p1, 0, b3, LogitsMode::kHiddenLast};
  std::vector<float> h_all, l2, h_last, batched;
  ASSERT_TRUE(r->Forward({&all, 1}, &h_all).ok());
  ASSERT_TRUE(r->Forward({&logits, 1}, &l2).ok());
  ASSERT_TRUE(r->Forward({&last, 1}, &h_last).ok());
  ASSERT_EQ(h_all.size(), p1.size() * d);
  ASSERT_EQ(l2.size(), static_cast<size_t>(v));
  ASSERT_EQ(h_last.size(), static_cast<size_t>(d));
  EXPECT_LT(MaxAbsDiff(h_last, std::vector<float>(h_all.end() - d, h_all.end())), 2e-3f);
  // Different tokens, different states (a runner returning one row for all would fail here).
  EXPECT_GT(MaxAbsDiff(std::vector<float>(h_all.begin(), h_all.begin() + d), h_last), 1e-2f);

  SequenceStep batch[3] = {all, logits, last};
  ASSERT_TRUE(r->Forward(batch, &batched).ok());
  std::vector<float> expected = h_all;
  expected.insert(expected.end(), l2.begin(), l2.end());
  expected.insert(expected.end(), h_last.begin(), h_last.end());
  EXPECT_LT(MaxAbsDiff(batched, expected), 2e-3f);
}

TEST_F(RunnerTest, RejectsBadSteps) {
  auto r = Make("cpu");
  ASSERT_TRUE(r);
  const std::vector<int32_t> p = Prompt(5);
  const std::vector<int32_t> short_table = {0};  // 5 tokens need 2 blocks of 4
  SequenceStep s{1, p, 0, short_table, LogitsMode::kLast};
  std::vector<float> out;
  EXPECT_EQ(r->Forward({&s, 1}, &out).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_block = {0, 9999};
  s.block_table = bad_block;
  EXPECT_EQ(r->Forward({&s, 1}, &out).code(), StatusCode::kInvalidArgument);
  const std::vector<int32_t> big = Iota(32);
  s.block_table = big;
  s.start_pos = 62;  // past the context length of 64
  EXPECT_EQ(r->Forward({&s, 1}, &out).code(), StatusCode::kInvalidArgument);
}

class EveryBackendTest : public RunnerTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(EveryBackendTest, ComputesTheCpuLogits) {
  auto cpu = Make("cpu");
  auto other = Make(GetParam());
  ASSERT_TRUE(cpu && other);
  const std::vector<int32_t> prompt = Prompt(9);
  const std::vector<int32_t> blocks = Iota(16);
  SequenceStep s{1, prompt, 0, blocks, LogitsMode::kAll};
  std::vector<float> a, b;
  ASSERT_TRUE(cpu->Forward({&s, 1}, &a).ok());
  ASSERT_TRUE(other->Forward({&s, 1}, &b).ok());
  float scale = 0;
  for (float v : a) scale = std::max(scale, std::abs(v));
  EXPECT_LT(MaxAbsDiff(a, b), 1e-3f * std::max(1.f, scale)) << "max |logit| " << scale;
}

std::vector<std::string> BackendsOtherThanCpu() {
  std::vector<std::string> names;
  std::ranges::copy_if(Backends(), std::back_inserter(names),
                       [](const std::string& n) { return n != "cpu"; });
  return names;
}
INSTANTIATE_TEST_SUITE_P(Plugins, EveryBackendTest, ::testing::ValuesIn(BackendsOtherThanCpu()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EveryBackendTest);  // cpu alone

}  // namespace
}  // namespace polychip::model
