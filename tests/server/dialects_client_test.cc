// Runs tests/server/dialects_client_test.mjs (the official `@anthropic-ai/sdk` and `openai` npm
// clients) against the real `polychip serve` on the bundled random-weight model. The packages
// come from $POLYCHIP_NPM_DIR (default $HOME/.cache/polychip/npm), installed by
// tests/setup/setup-test-deps.sh; without them the test fails and says so.
#include <gtest/gtest.h>

#include <cstdio>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

TEST(DialectClients, AnthropicMessagesAndOpenAiResponses) {
  PC_REQUIRE_SERVE_DEPS(model);
  ASSERT_TRUE(HaveNodePackages({"openai", "@anthropic-ai/sdk"}));
  const std::string key = "test-key";
  ServeProcess s(model,
                 {"--served-model-name", "tiny", "--api-key", key, "--context-length", "1024"});
  ASSERT_TRUE(s.ok());
  const polychip::testing::CommandResult node = RunNodeClient("dialects_client_test.mjs", s, key);
  EXPECT_EQ(node.exit_code, 0) << node.out;
  EXPECT_EQ(node.out.find("FAIL"), std::string::npos) << node.out;
  EXPECT_NE(node.out.find("ok   openai previous_response_id"), std::string::npos) << node.out;
  EXPECT_NE(node.out.find("ok   anthropic forced tool_use"), std::string::npos) << node.out;
  std::printf("%s", node.out.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
