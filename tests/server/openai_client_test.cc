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
  ASSERT_TRUE(HaveNodePackages({"openai"}));
  const std::string key = "test-key";
  ServeProcess s(model, {"--served-model-name", "tiny", "--api-key", key,
                         "--context-length", "512"});
  ASSERT_TRUE(s.ok());
  const polychip::testing::CommandResult node = RunNodeClient("openai_client_test.mjs", s, key);
  const std::string& output = node.out;
  EXPECT_EQ(node.exit_code, 0) << output;
  EXPECT_NE(output.find("ok   chat.completions.create stream"), std::string::npos) << output;
  std::printf("%s", output.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
