// Issue 16: `polychip serve` picking its backend by discovery (no --device) probes the plugins on
// the search path in child processes, so one whose probe segfaults or never returns is skipped
// with its reason in the log and the server still comes up on a usable backend.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

// A search-path folder holding only the probeenv test plugin (PCTEST_PROBE=crash|hang).
fs::path FolderWithProbeenv() {
  const fs::path dir = fs::path(::testing::TempDir()) / ("pc_probeenv_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path link = dir / fs::path(PCTEST_PROBEENV_PLUGIN).filename();
  std::error_code ec;
  fs::remove(link, ec);
  fs::create_symlink(PCTEST_PROBEENV_PLUGIN, link);
  return dir;
}

// Starts serve with `env` (VAR=value entries) and the given device flags; expects it to listen,
// answer /health and to have logged `expected`.
void ServesDespite(const std::string& model, const std::vector<std::string>& env,
                   const std::vector<std::string>& device_flags, const std::string& expected) {
  std::vector<std::string> argv = {"/usr/bin/env", "POLYCHIP_PLUGIN_PATH=" + FolderWithProbeenv().string(),
                                   polychip::testing::AsanOptionsWithoutSegvHandler()};
  argv.insert(argv.end(), env.begin(), env.end());
  for (const std::string& a : {PolychipBinary().string(), std::string("serve"),
                               std::string("--model-path"), model}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), device_flags.begin(), device_flags.end());
  for (const char* a : {"--host", "127.0.0.1", "--port", "0"}) argv.push_back(a);
  polychip::testing::ChildProcess serve(argv);
  const int port = serve.WaitForListeningPort(60);
  ASSERT_NE(port, 0) << serve.Log();
  httplib::Client client("127.0.0.1", port);
  auto health = client.Get("/health");
  ASSERT_TRUE(health) << serve.Log();
  EXPECT_EQ(health->status, 200);
  EXPECT_NE(serve.Log().find(expected), std::string::npos) << serve.Log();
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(30).value_or(-1), 0) << serve.Log();
}

TEST(ServePluginDiscovery, AProbeThatCrashesIsSkipped) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServesDespite(model, {"PCTEST_PROBE=crash"}, {},
                "libpolychip_backend_probeenv.so: crashed in probe: SIGSEGV");
}

TEST(ServePluginDiscovery, AProbeThatHangsIsSkippedAfterTheTimeout) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServesDespite(model, {"PCTEST_PROBE=hang", "POLYCHIP_PROBE_TIMEOUT_S=1"}, {},
                "libpolychip_backend_probeenv.so: probe did not return in 1 s");
}

// Asked for by name, cpu is the only plugin touched: the broken one is not even probed.
TEST(ServePluginDiscovery, TheBackendAskedForIsLoadedWithoutTheOthers) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServesDespite(model, {"PCTEST_PROBE=crash"}, {"--device", "cpu:0", "--threads", "1"},
                "backend 'cpu' selected by --device");
}

}  // namespace
}  // namespace polychip::server::testing
