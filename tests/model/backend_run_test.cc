// Every backend plugin the build produced runs a model through the binary, as a user would
// (`polychip run --device <name>:0`, the plugin found in the folder beside the binary): the
// bundled model's greedy continuation has every token asked for and, when the tree has the cpu
// plugin, is the cpu plugin's, token for token. The model's weights are F16, which every
// backend computes in F32 (the cpu plugin quantizes activations only for quantized weights), so
// the greedy tokens agree exactly. A new folder under plugins/backends/ gets this test with no
// edit here (tests/CMakeLists.txt, polychip_test_every_backend).
#include <gtest/gtest.h>

#include <algorithm>
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

// Greedy generation of the bundled model on device 0 of `backend`.
CommandResult RunOn(const std::string& backend) {
  return RunCommand(std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip run --device " + backend +
                    ":0 --print-tokens --ignore-eos -n " + std::to_string(kTokens) +
                    " --model-path " +
                    ShellQuote(std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf") +
                    " --prompt " + ShellQuote("And God said"));
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

// Test names end in the plugin's name: `ctest -L model -R <name>` selects one backend.
INSTANTIATE_TEST_SUITE_P(Plugins, BackendRunTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendRunTest);  // a tree without backends

}  // namespace
}  // namespace polychip
