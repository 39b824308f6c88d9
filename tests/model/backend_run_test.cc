// Every backend plugin the build produced runs a model through the binary, as a user would
// (`polychip run --device <name>:0`, the plugin found in the folder beside the binary): the
// bundled model's greedy continuation has every token asked for and, when the tree has the cpu
// plugin, is the cpu plugin's, token for token. The model's weights are F16, which every
// backend computes in F32 (the cpu plugin quantizes activations only for quantized weights), so
// the greedy tokens agree exactly. A new folder under plugins/backends/ gets this test with no
// edit here (tests/CMakeLists.txt, polychip_test_every_backend).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "common/command.h"

namespace polychip {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

const std::vector<std::string>& Backends() {
  static const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return names;
}

constexpr int kTokens = 24;

const std::string kPolychip = std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip";
const std::string kBundledModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

// Greedy generation of `model` (default: the bundled model) on device 0 of `backend`.
CommandResult RunOn(const std::string& backend, const std::string& model = kBundledModel,
                    const std::string& extra = "") {
  return RunCommand(kPolychip + " run --device " + backend + ":0 --print-tokens --ignore-eos -n " +
                    std::to_string(kTokens) + " --model-path " + ShellQuote(model) +
                    " --prompt " + ShellQuote("And God said") + extra);
}

// A random-weight model of one of `polychip gguf synth`'s shapes in F16 with the llama-spm
// vocabulary (32000 tokens: the embedding table fits emu's 64 MiB largest allocation, which
// qwen2's 151936 rows would not at a width of 256), written once per build directory; "" after
// adding a failure.
std::string SynthesizedModel(const std::string& shape) {
  const std::string vocab =
      (testing::LlamaCppDir() / "models/ggml-vocab-llama-spm.gguf").string();
  const std::string out = std::string(POLYCHIP_BUILD_DIR) + "/test-models/run_" + shape + ".gguf";
  // ctest runs the backends' tests in parallel: each writes its own file and renames it into
  // place (the contents are the same), so none reads a half-written model.
  const std::string tmp = out + ".tmp" + std::to_string(getpid());
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  const std::string cmd = kPolychip + " gguf synth --vocab " + ShellQuote(vocab) + " --shape " +
                          shape + " --type F16 --seed 5 --weight-std 0.08 --quiet --out " +
                          ShellQuote(tmp);
  const CommandResult r = RunCommand(cmd);
  if (r.exit_code != 0) {
    ADD_FAILURE() << cmd << " failed:\n" << r.err;
    return "";
  }
  std::filesystem::rename(tmp, out);
  return out;
}

// The ids of --print-tokens' lines ("token <id> margin <m> piece <hex>") on stderr.
std::vector<int> TokenIds(const std::string& err) {
  std::vector<int> ids;
  static const std::regex re(R"(token (-?[0-9]+) margin )");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it) {
    ids.push_back(std::stoi((*it)[1]));
  }
  return ids;
}

class BackendRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendRunTest, GreedyTokensOfTheBundledModel) {
  const CommandResult ours = RunOn(GetParam());
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  const std::vector<int> ids = TokenIds(ours.err);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kTokens)) << ours.err;

  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  if (GetParam() == "cpu" || !have_cpu) return;  // no other backend to agree with
  const CommandResult cpu = RunOn("cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(ids, TokenIds(cpu.err)) << GetParam() << ":\n" << ours.err << "\ncpu:\n" << cpu.err;
  EXPECT_EQ(ours.out, cpu.out);
}

// Every architecture runs on every backend and gives the cpu plugin's greedy tokens, token for
// token: qwen3 (per-head q/k norms, a head size of its own), phi3 (fused matrices cut by rows,
// partial rotary, LongRoPE factors).
void ExpectCpuTokens(const std::string& backend, const std::string& shape,
                     const std::string& extra = "") {
  const std::string model = SynthesizedModel(shape);
  if (model.empty()) return;
  const CommandResult ours = RunOn(backend, model, extra);
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  const std::vector<int> ids = TokenIds(ours.err);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kTokens)) << ours.err;
  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  if (backend == "cpu" || !have_cpu) return;
  const CommandResult cpu = RunOn("cpu", model);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(ids, TokenIds(cpu.err)) << backend << ":\n" << ours.err << "\ncpu:\n" << cpu.err;
}

TEST_P(BackendRunTest, GreedyTokensOfASynthesizedQwen3) {
  ExpectCpuTokens(GetParam(), "qwen3-tiny");
}
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedPhi3) {
  ExpectCpuTokens(GetParam(), "phi3-tiny");
}
// qwen3moe (the MOE op): a backend without MOE (vulkan) runs it on the cpu plugin through the op
// fallback, which stages the 3-D expert tensors once as weights; the others run it themselves.
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedQwen3Moe) {
  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  ExpectCpuTokens(GetParam(), "qwen3moe-tiny", have_cpu ? " --op-fallback cpu" : "");
}

// gemma3 (GEGLU, SCALE, ATTENTION's window on six of its seven layers). llama-spm's vocabulary,
// as above: the real Gemma one (262144 rows of 256) is past emu's largest allocation.
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedGemma3) {
  ExpectCpuTokens(GetParam(), "gemma3-tiny");
}

// Test names end in the plugin's name: `ctest -L model -R <name>` selects one backend.
INSTANTIATE_TEST_SUITE_P(Plugins, BackendRunTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendRunTest);  // a tree without backends

}  // namespace
}  // namespace polychip
