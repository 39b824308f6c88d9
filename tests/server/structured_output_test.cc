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
  ASSERT_EQ(RunCommand("node --version >/dev/null 2>&1").exit_code, 0) << "node is not installed";
  ASSERT_TRUE(fs::exists(NpmDir() / "node_modules" / "openai" / "package.json"))
      << "the openai npm package is not installed in " << NpmDir()
      << ": run tests/setup/setup-test-deps.sh (or set POLYCHIP_NPM_DIR)";
  const std::string key = "test-key";
  ServeProcess s(model,
                 {"--served-model-name", "tiny", "--api-key", key, "--context-length", "1024"});
  ASSERT_TRUE(s.ok());
  const std::string cmd =
      "POLYCHIP_NPM_DIR=" + NpmDir().string() + " node " +
      (fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "server" / "structured_output_test.mjs").string() +
      " http://127.0.0.1:" + std::to_string(s.port()) + " " + key;
  const polychip::testing::CommandResult node = RunCommand(cmd, polychip::testing::Stderr::kMerged);
  EXPECT_EQ(node.exit_code, 0) << node.out;
  EXPECT_EQ(node.out.find("FAIL"), std::string::npos) << node.out;
  EXPECT_NE(node.out.find("ok   50 json_schema responses"), std::string::npos) << node.out;
  std::printf("%s", node.out.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
