// gemma3's sliding-window layers with a KV pool of their own (RunnerOptions::
// swa_full_tokens_ratio), on a synthesized gemma3-tiny (window 16) and the cpu plugin: requests
// much longer than the window, several at once and sharing a prefix, generate through the engine
// exactly the greedy tokens of the same runner without the pool, while the pool holds fewer
// blocks than the requests' positions (so blocks were released and reused) and the KV cache
// takes less memory. Skipped in a tree without the cpu plugin.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/runner.h"
#include "test_models.h"

namespace polychip::model {
namespace {

const std::string& ModelPath() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("gemma3-tiny");
    o.type = DType::kF16;
    o.weight_std = 0.08f;
    o.seed = 11;
    return testing::SynthesizeTestModel("window_pool_gemma3_f16", o);
  }();
  return path;
}

bool CpuBuilt() {
  const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return std::ranges::find(names, "cpu") != names.end();
}

class WindowPoolTest : public testing::ModelFileTest<::testing::Test> {
 protected:
  void SetUp() override {
    if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
    ASSERT_NO_FATAL_FAILURE(OpenModel(ModelPath()));
    ASSERT_EQ(config_.sliding_window, 16);
  }

  std::unique_ptr<TransformerRunner> Make(double ratio) {
    auto dev = testing::OpenTestDevice("cpu");
    if (!dev) return nullptr;
    RunnerOptions o;
    o.context_length = 256;
    o.kv_tokens = 1024;
    o.block_size = 4;
    o.swa_full_tokens_ratio = ratio;
    auto r = TransformerRunner::Create(*file_, config_, dev, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }

  // Greedy tokens of every prompt, all submitted at once.
  std::vector<std::vector<int32_t>> Generate(engine::ModelRunner* runner,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             int n) {
    engine::EngineOptions eo;
    eo.chunked_prefill_size = 24;
    engine::Engine engine(runner, eo, [](int32_t) { return std::string("x"); }, {});
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    for (const auto& p : prompts) {
      engine::GenerateInput in;
      in.prompt = p;
      in.params.max_tokens = n;
      auto s = engine.Submit(in);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (!s.ok()) return {};
      streams.push_back(*s);
    }
    engine.RunUntilIdle(100000);
    std::vector<std::vector<int32_t>> out;
    for (auto& s : streams) {
      out.emplace_back();
      bool finished = false;
      for (auto& ev : s->Pop(std::chrono::milliseconds(0))) {
        out.back().insert(out.back().end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) {
          finished = true;
          EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
        }
      }
      EXPECT_TRUE(finished);
    }
    EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
    return out;
  }
};

TEST_F(WindowPoolTest, GreedyTokensMatchTheRunnerWithoutAPool) {
  auto full = Make(0);
  auto pooled = Make(0.01);  // the least pool that lets a sequence step
  ASSERT_TRUE(full && pooled);
  EXPECT_EQ(full->num_window_kv_blocks(), 0);
  // 16/4 + 4 + 64/4 blocks: a few windows' worth, far below the requests' positions.
  EXPECT_EQ(pooled->num_window_kv_blocks(), 24);
  EXPECT_EQ(pooled->kv_window(), 16);
  // Six of the seven layers keep 25 blocks (24 and the spare) instead of 256.
  EXPECT_LT(pooled->kv_bytes(), full->kv_bytes() / 3);

  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> shared = {9, 1200, 33, 870, 4501, 77, 12, 3000, 640, 5, 18, 902,
                                       2222, 71, 19, 400, 8, 615, 90, 1717};
  for (int i = 0; i < 3; ++i) {
    auto p = shared;
    for (int k = 0; k < 30 + 7 * i; ++k) p.push_back(100 + (i * 131 + k * 17) % 5000);
    prompts.push_back(p);
  }
  const auto want = Generate(full.get(), prompts, 40);
  const auto got = Generate(pooled.get(), prompts, 40);
  ASSERT_EQ(want.size(), prompts.size());
  EXPECT_EQ(got, want);
  for (const auto& t : want) EXPECT_EQ(t.size(), 40u);
  // Each request spans 90-104 positions (23-26 blocks) and all three ran: without releases the
  // 24-block pool could not have held even one of them.
}

}  // namespace
}  // namespace polychip::model
