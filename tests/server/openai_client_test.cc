// Runs tests/server/openai_client_test.mjs (the official `openai` npm client) against the real
// `polychip serve`. The package comes from $POLYCHIP_NPM_DIR (default
// $HOME/.cache/polychip/npm), installed by tests/setup/setup-test-deps.sh; without it the test
// fails and says so.
#include <gtest/gtest.h>

#include <cstdio>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

TEST(OpenAiNpmClient, ChatCompletionAndStreaming) {
  PC_REQUIRE_SERVE_DEPS(model);
  ASSERT_EQ(RunCommand("node --version >/dev/null 2>&1").exit_code, 0) << "node is not installed";
  ASSERT_TRUE(fs::exists(NpmDir() / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is not installed in " << NpmDir()
      << ": run tests/setup/setup-test-deps.sh (or set POLYCHIP_NPM_DIR)";
  const std::string key = "test-key";
  ServeProcess s(model, {"--served-model-name", "tiny", "--api-key", key,
                         "--context-length", "512"});
  ASSERT_TRUE(s.ok());
  const std::string cmd = "POLYCHIP_NPM_DIR=" + NpmDir().string() + " node " +
                          (fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "server" /
                           "openai_client_test.mjs").string() +
                          " http://127.0.0.1:" + std::to_string(s.port()) + " " + key;
  const polychip::testing::CommandResult node = RunCommand(cmd, polychip::testing::Stderr::kMerged);
  const std::string& output = node.out;
  EXPECT_EQ(node.exit_code, 0) << output;
  EXPECT_NE(output.find("ok   chat.completions.create stream"), std::string::npos) << output;
  std::printf("%s", output.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
