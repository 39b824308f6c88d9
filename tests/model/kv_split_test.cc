// The KV cache in pools (runner.h): on emu with its max single allocation lowered to 1 MiB, a
// tiny model's KV cache of 16,384 tokens (2 MiB per layer for K and for V at F16) is split into
// two pools of 8,192 tokens, each an allocation per layer. A batch with sequences in both pools
// gives the cpu plugin's logits (whose cache is one allocation per layer), and requests run
// through the engine all at once, landing in both pools and sharing a prefix, give the cpu
// plugin's greedy tokens. Likewise expert tensors over the limit (model_loader.h), cut at whole
// experts and routed on the host (transformer.cc): a qwen3moe of 16 experts gives the cpu
// plugin's logits. Skipped in a tree without the emu and cpu plugins.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/runner.h"
#include "test_models.h"

namespace polychip::model {
namespace {

using engine::LogitsMode;
using engine::SequenceStep;

constexpr int64_t kMaxAlloc = 1 << 20;

const std::string& ModelPath() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("tiny");  // 2 KV heads of 32: 128 bytes per token and layer at F16
    o.type = DType::kF16;  // computed in F32 by both plugins: the same greedy tokens
    o.weight_std = 0.08f;
    o.seed = 13;
    return testing::SynthesizeTestModel("kv_split_tiny_f16", o);
  }();
  return path;
}

// qwen3moe-tiny with 16 experts of which 4 are used: 2 MiB per expert tensor at F16.
const std::string& MoeModelPath() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("qwen3moe-tiny");
    o.config.n_expert = 16;
    o.config.n_expert_used = 4;
    o.type = DType::kF16;
    o.weight_std = 0.08f;
    o.seed = 17;
    return testing::SynthesizeTestModel("kv_split_qwen3moe16_f16", o);
  }();
  return path;
}

bool Built(const std::string& name) {
  const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return std::ranges::find(names, name) != names.end();
}

// The pools of the block tables a runner is given (block / kv_blocks_per_pool()).
class PoolRecorder : public engine::ModelRunner {
 public:
  explicit PoolRecorder(engine::ModelRunner* inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t context_length() const override { return inner_->context_length(); }
  int64_t block_size() const override { return inner_->block_size(); }
  int64_t num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int64_t kv_blocks_per_pool() const override { return inner_->kv_blocks_per_pool(); }
  Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) override {
    for (const SequenceStep& s : batch) pools.insert(s.block_table[0] / kv_blocks_per_pool());
    return inner_->Forward(batch, logits);
  }
  std::set<int64_t> pools;

 private:
  engine::ModelRunner* inner_;
};

class KvSplitTest : public testing::ModelFileTest<::testing::Test> {
 protected:
  void SetUp() override {
    if (!Built("cpu") || !Built("emu")) GTEST_SKIP() << "needs the emu and cpu plugins";
    ASSERT_NO_FATAL_FAILURE(OpenModel(ModelPath()));
  }

  std::unique_ptr<TransformerRunner> Make(const std::string& backend, int64_t kv_tokens = 16384) {
    runtime::PluginParams params;
    if (backend == "emu") params.push_back({"max_alloc_bytes", std::to_string(kMaxAlloc)});
    auto b = runtime::LoadBackendFromPath(
        std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_backend_" + backend + ".so",
        params);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok()) return nullptr;
    auto dev = (*b)->OpenDevice(0);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (!dev.ok()) return nullptr;
    RunnerOptions o;
    o.context_length = 256;
    o.kv_tokens = kv_tokens;
    o.block_size = 16;
    auto r = TransformerRunner::Create(*file_, config_, *dev, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Greedy tokens of every prompt, all submitted at once.
  std::vector<std::vector<int32_t>> Generate(engine::ModelRunner* runner,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int n) {
    engine::EngineOptions eo;
    eo.chunked_prefill_size = 32;
    engine::Engine engine(runner, eo, [](int32_t) { return std::string("x"); }, {});
    std::vector<engine::GenerateInput> inputs(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      inputs[i].prompt = prompts[i];
      inputs[i].params.max_tokens = n;
    }
    return testing::GenerateAll(engine, inputs);
  }
};

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 7919 + salt * 104729 + 11) % 30000);
  return t;
}

TEST_F(KvSplitTest, TheCacheIsSplitIntoPoolsThatFit) {
  auto cpu = Make("cpu");
  auto emu = Make("emu");
  ASSERT_TRUE(cpu && emu);
  EXPECT_EQ(cpu->num_kv_blocks(), 1024);
  EXPECT_EQ(cpu->kv_blocks_per_pool(), 0);  // one pool
  EXPECT_EQ(emu->num_kv_blocks(), 1024);
  EXPECT_EQ(emu->kv_blocks_per_pool(), 512);  // 512 blocks of 2 KiB: 1 MiB each
  EXPECT_EQ(emu->context_length(), 256);
  EXPECT_EQ(emu->kv_bytes(), cpu->kv_bytes());
}

// Sequences of both pools in one batch, out of pool order (the runner sorts them and gives the
// output rows back in the batch's order), against the same block ids on cpu.
TEST_F(KvSplitTest, BatchAcrossPoolsGivesTheCpuLogits) {
  auto cpu = Make("cpu");
  auto emu = Make("emu");
  ASSERT_TRUE(cpu && emu);
  const std::vector<int32_t> a = Prompt(40, 1), b = Prompt(21, 2), c = Prompt(7, 3);
  const std::vector<int32_t> table_a = {700, 513, 900}, table_b = {3, 4}, table_c = {1000};
  SequenceStep steps[3];
  steps[0].tokens = a;
  steps[0].block_table = table_a;  // pool 1
  steps[0].logits = LogitsMode::kAll;
  steps[1].tokens = b;
  steps[1].block_table = table_b;  // pool 0
  steps[2].tokens = c;
  steps[2].block_table = table_c;  // pool 1
  steps[2].logits = LogitsMode::kHiddenLast;
  std::vector<float> want, got;
  ASSERT_TRUE(cpu->Forward(steps, &want).ok());
  ASSERT_TRUE(emu->Forward(steps, &got).ok());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), size_t((40 + 1) * config_.n_vocab + config_.n_embd));
  float diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
  EXPECT_LT(diff, 1e-3f);

  // A sequence's blocks in two pools cannot be attended over in one launch: refused.
  const std::vector<int32_t> across = {510, 511, 512};
  SequenceStep bad;
  bad.tokens = a;
  bad.block_table = across;
  const Status s = emu->Forward({&bad, 1}, &got);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("different KV pools"), std::string::npos) << s.ToString();
}

TEST_F(KvSplitTest, EngineRequestsInBothPoolsGiveTheCpuTokens) {
  auto cpu = Make("cpu");
  auto emu = Make("emu");
  ASSERT_TRUE(cpu && emu);
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> shared = Prompt(40, 9);  // two and a half blocks in common
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = i % 2 ? shared : std::vector<int32_t>{};
    for (int32_t t : Prompt(20 + 9 * i, 20 + i)) p.push_back(t);
    prompts.push_back(p);
  }
  PoolRecorder recorder(emu.get());
  const auto want = Generate(cpu.get(), prompts, 24);
  const auto got = Generate(&recorder, prompts, 24);
  ASSERT_EQ(want.size(), prompts.size());
  for (const auto& t : want) EXPECT_EQ(t.size(), 24u);
  EXPECT_EQ(got, want);
  EXPECT_EQ(recorder.pools, (std::set<int64_t>{0, 1}));
}

// Each layer's experts in 3 pieces (6, 6 and 4 experts of 128 KiB, each piece with a zero
// expert: 1 MiB at most), the routing over all 16 computed on the host: the logits of every
// position are the cpu plugin's, whose MOE routes itself over one allocation.
TEST_F(KvSplitTest, MoeExpertsOverTheLimitGiveTheCpuLogits) {
  ASSERT_NO_FATAL_FAILURE(OpenModel(MoeModelPath()));
  auto cpu = Make("cpu", 1024);
  auto emu = Make("emu", 1024);
  ASSERT_TRUE(cpu && emu);
  const std::vector<int32_t> a = Prompt(33, 4), b = Prompt(12, 5);
  const std::vector<int32_t> table_a = {0, 1, 2}, table_b = {5};
  SequenceStep steps[2];
  steps[0].tokens = a;
  steps[0].block_table = table_a;
  steps[0].logits = LogitsMode::kAll;
  steps[1].tokens = b;
  steps[1].block_table = table_b;
  std::vector<float> want, got;
  ASSERT_TRUE(cpu->Forward(steps, &want).ok());
  ASSERT_TRUE(emu->Forward(steps, &got).ok());
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(got.size(), size_t(34 * config_.n_vocab));
  float diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  EXPECT_LT(diff, 1e-3f * std::max(scale, 1.f));
  for (int64_t r = 0; r < 34; ++r) {  // the greedy token of every row
    const float* w = want.data() + r * config_.n_vocab;
    const float* g = got.data() + r * config_.n_vocab;
    EXPECT_EQ(std::max_element(g, g + config_.n_vocab) - g,
              std::max_element(w, w + config_.n_vocab) - w)
        << "row " << r;
  }
}

}  // namespace
}  // namespace polychip::model
