// Runs tests/server/structured_output_test.mjs (the official `openai` npm client) against the
// real `polychip serve` on the bundled random-weight model: 50 json_schema responses at
// temperature 1 that all validate, regex, ebnf and json_object constraints, and the 400s of
// constraints the engine does not implement.
#include <gtest/gtest.h>

#include <cstdio>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

TEST(StructuredOutputs, OpenAiClient) {
  PC_REQUIRE_SERVE_DEPS(model);
  ASSERT_TRUE(HaveNodePackages({"openai"}));
  const std::string key = "test-key";
  ServeProcess s(model,
                 {"--served-model-name", "tiny", "--api-key", key, "--context-length", "1024"});
  ASSERT_TRUE(s.ok());
  const polychip::testing::CommandResult node = RunNodeClient("structured_output_test.mjs", s, key);
  EXPECT_EQ(node.exit_code, 0) << node.out;
  EXPECT_EQ(node.out.find("FAIL"), std::string::npos) << node.out;
  EXPECT_NE(node.out.find("ok   50 json_schema responses"), std::string::npos) << node.out;
  std::printf("%s", node.out.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
