// Runs tests/server/chat_page_test.mjs: the chat page at `/` of the real `polychip serve`, in
// Debian's chromium (headless, puppeteer-core). The screenshot goes to
// <build>/test-output/chat_page.png.
#include <gtest/gtest.h>

#include <cstdio>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

TEST(ChatPage, HeadlessChromium) {
  PC_REQUIRE_SERVE_DEPS(model);
  const char* chromium_env = std::getenv("CHROMIUM");
  const std::string chromium = chromium_env && *chromium_env ? chromium_env : "/usr/bin/chromium";
  ASSERT_TRUE(fs::exists(chromium)) << chromium << " missing: run scripts/install-deps.sh";
  ASSERT_TRUE(fs::exists(NpmDir() / "node_modules" / "puppeteer-core" / "package.json"))
      << "puppeteer-core is not installed in " << NpmDir()
      << ": run tests/setup/setup-test-deps.sh";
  const std::string key = "page-key";
  ServeProcess s(model, {"--served-model-name", "tiny", "--api-key", key});
  ASSERT_TRUE(s.ok());
  const fs::path out = fs::path(POLYCHIP_BUILD_DIR) / "test-output";
  fs::create_directories(out);
  const fs::path shot = out / "chat_page.png";
  fs::remove(shot);
  const std::string cmd =
      "POLYCHIP_NPM_DIR=" + NpmDir().string() + " CHROMIUM=" + chromium + " node " +
      (fs::path(POLYCHIP_SOURCE_DIR) / "tests" / "server" / "chat_page_test.mjs").string() +
      " http://127.0.0.1:" + std::to_string(s.port()) + " " + key + " " + shot.string();
  const polychip::testing::CommandResult node = RunCommand(cmd, polychip::testing::Stderr::kMerged);
  EXPECT_EQ(node.exit_code, 0) << node.out;
  EXPECT_NE(node.out.find("ok   chat page"), std::string::npos) << node.out;
  EXPECT_TRUE(fs::exists(shot) && fs::file_size(shot) > 1000) << shot;
  std::printf("%s", node.out.c_str());
}

}  // namespace
}  // namespace polychip::server::testing
