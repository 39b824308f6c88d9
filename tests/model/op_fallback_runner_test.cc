// The runner with an op fallback, in process: a coverage gap fails before any device memory is
// taken, a fallback computes the fallback device's logits for the ops it takes, and the
// launches that fell back are counted for /metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/runner.h"
#include "runtime/plugin_loader.h"

namespace polychip::model {
namespace {

const std::string kLib = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_backend_";

class OpFallbackRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kLib + "emu.so") || !std::filesystem::exists(kLib + "cpu.so")) {
      GTEST_SKIP() << "needs the emu and cpu plugins";
    }
    // emu claims only MATMUL: every other op of the model falls back to cpu.
    auto emu = runtime::LoadBackendFromPath(kLib + "emu.so", {{"only_ops", "matmul"}});
    auto cpu = runtime::LoadBackendFromPath(kLib + "cpu.so");
    ASSERT_TRUE(emu.ok() && cpu.ok()) << emu.status().ToString() << cpu.status().ToString();
    auto e = (*emu)->OpenDevice(0);
    auto c = (*cpu)->OpenDevice(0);
    ASSERT_TRUE(e.ok() && c.ok());
    emu_ = *e;
    cpu_ = *c;
    auto file = GgufFile::Open(std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    file_ = std::move(*file);
    auto config = ModelConfig::FromGguf(*file_);
    ASSERT_TRUE(config.ok());
    config_ = *config;
    options_.context_length = 32;
    options_.kv_tokens = 64;
    options_.block_size = 4;
  }

  std::vector<float> Logits(TransformerRunner& runner) {
    const std::vector<int32_t> tokens = {1, 17, 300, 42, 9, 1000, 77};
    const std::vector<int32_t> blocks = {5, 2, 9};  // scattered: the staging must follow them
    engine::SequenceStep step{1, tokens, 0, blocks, engine::LogitsMode::kAll};
    std::vector<float> logits;
    EXPECT_TRUE(runner.Forward({&step, 1}, &logits).ok());
    // A decode step reading the cached K/V of the prompt.
    const std::vector<int32_t> next = {123};
    engine::SequenceStep decode{1, next, 7, blocks, engine::LogitsMode::kLast};
    std::vector<float> last;
    EXPECT_TRUE(runner.Forward({&decode, 1}, &last).ok());
    logits.insert(logits.end(), last.begin(), last.end());
    return logits;
  }

  std::shared_ptr<runtime::Device> emu_, cpu_;
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  RunnerOptions options_;
};

TEST_F(OpFallbackRunnerTest, GapFailsBeforeAnyDeviceMemoryIsTaken) {
  uint64_t free_before = 0, total = 0, free_after = 0;
  ASSERT_TRUE(emu_->MemoryInfo(&free_before, &total).ok());
  auto r = TransformerRunner::Create(*file_, config_, emu_, options_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("attention (f16)"), std::string::npos)
      << r.status().ToString();
  ASSERT_TRUE(emu_->MemoryInfo(&free_after, &total).ok());
  EXPECT_EQ(free_after, free_before);
}

TEST_F(OpFallbackRunnerTest, FallbackComputesTheFallbackDevicesLogitsAndCountsLaunches) {
  auto on_cpu = TransformerRunner::Create(*file_, config_, cpu_, options_);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status().ToString();
  emu_->SetOpFallback(cpu_);
  auto mixed = TransformerRunner::Create(*file_, config_, emu_, options_);
  ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
  const std::vector<float> want = Logits(**on_cpu), got = Logits(**mixed);
  ASSERT_EQ(got.size(), want.size());
  float max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
  // Only MATMUL ran elsewhere (emu's reference kernel: another summation order).
  EXPECT_LT(max_diff, 2e-3f);

  std::string metrics;
  (*mixed)->RenderMetrics(&metrics);
  for (const char* op : {"embedding", "rms_norm", "rope", "kv_store", "attention", "swiglu"}) {
    const std::string series = std::string("polychip_op_fallback_launches_total{op=\"") + op +
                               "\",backend=\"emu\",fallback=\"cpu\"} ";
    const size_t at = metrics.find(series);
    ASSERT_NE(at, std::string::npos) << op << "\n" << metrics;
    EXPECT_GT(std::stoll(metrics.substr(at + series.size())), 0) << op;
  }
  // MATMUL ran on emu itself: no fallback series for it (emu's own per-op counters list it).
  EXPECT_EQ(metrics.find("polychip_op_fallback_launches_total{op=\"matmul\""), std::string::npos)
      << metrics;
  emu_->SetOpFallback(nullptr);
}

}  // namespace
}  // namespace polychip::model
