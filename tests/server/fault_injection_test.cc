// Faults injected through the emu plugin's parameters (issue 16): an allocation that fails, an
// op that fails on its Nth launch, a stream that stalls. The affected work fails with a clear
// error, nothing crashes, the requests after it go on, KV blocks come back and the server keeps
// answering. Runs `polychip run` and `polychip serve` over the bundled model on emu.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/command.h"

namespace polychip {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ChildProcess;
using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

const std::string kBin = std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip";
const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_backend_emu.so")) {
      GTEST_SKIP() << "needs the emu plugin";
    }
    dir_ = fs::temp_directory_path() /
           ("polychip-faults-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // A config selecting emu with one fault parameter.
  std::string Config(const std::string& key, const std::string& value) {
    const fs::path p = dir_ / "emu.yaml";
    std::ofstream(p) << "backend:\n  name: emu\n  params: {" << key << ": \"" << value << "\"}\n";
    return p.string();
  }

  fs::path dir_;
};

double Metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  std::smatch m;
  const std::regex re("(^|\n)" + name + " ([0-9.e+-]+)");
  if (!r || !std::regex_search(r->body, m, re)) return -1;
  return std::stod(m[2]);
}

std::pair<int, json> Complete(httplib::Client& c, int max_tokens) {
  const json body = {{"prompt", "And God said"}, {"max_tokens", max_tokens},
                     {"temperature", 0}, {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return {-1, json()};
  return {r->status, json::parse(r->body, nullptr, false)};
}

// Wherever the allocation budget runs out while the model loads, `run` exits 1 naming the
// fault: never a signal, never a hang.
TEST_F(FaultInjectionTest, AllocationFailureAnywhereInTheLoadIsACleanError) {
  for (const char* budget : {"1", "2000000", "6000000", "11000000"}) {
    SCOPED_TRACE(budget);
    const CommandResult r =
        RunCommand(kBin + " run --device emu:0 --config " + Config("fail_alloc_after_bytes", budget) +
                   " -n 4 --prompt Hi --model-path " + ShellQuote(kModel));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("RESOURCE_EXHAUSTED"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("emu fault injection: allocation of"), std::string::npos) << r.err;
  }
}

// An op that fails on the device fails the request whose step launched it (a 500 with the
// device's message); the next requests complete, the KV blocks are back, /health answers.
TEST_F(FaultInjectionTest, FailingOpLaunchFailsOneRequestAndTheServerGoesOn) {
  ChildProcess serve({kBin, "serve", "--model-path", kModel, "--device", "emu:0", "--config",
                      Config("fail_op_launch", "matmul:100"), "--host", "127.0.0.1", "--port",
                      "0"},
                     {.alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  ASSERT_GT(port, 0) << serve.Log();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  // 7 matmuls per layer x 6 layers + the output = 43 per step: launch 100 is in the third step.
  auto [status, body] = Complete(c, 8);
  EXPECT_EQ(status, 500) << body.dump();
  EXPECT_NE(body.dump().find("emu fault injection: matmul (launch #"), std::string::npos)
      << body.dump();
  for (int i = 0; i < 2; ++i) {
    auto [ok, good] = Complete(c, 8);
    EXPECT_EQ(ok, 200) << good.dump();
  }
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(Metric(c, "polychip_requests_failed_total"), 1);
  EXPECT_EQ(Metric(c, "polychip_requests_finished_total"), 2);
  EXPECT_EQ(Metric(c, "polychip_kv_blocks_used"), 0);
  EXPECT_TRUE(serve.running());
}

// A stalled device stream delays the step it is in, not the server: /health answers at once
// while a request waits on the stall, and the request then completes.
TEST_F(FaultInjectionTest, StalledStreamDelaysItsRequestButNotHealth) {
  ChildProcess serve({kBin, "serve", "--model-path", kModel, "--device", "emu:0", "--config",
                      Config("stall_stream_ms", "2000@60"), "--host", "127.0.0.1", "--port", "0"},
                     {.alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  ASSERT_GT(port, 0) << serve.Log();
  auto generation = std::async(std::launch::async, [port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const auto start = std::chrono::steady_clock::now();
    auto [status, body] = Complete(c, 4);
    return std::make_pair(status, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                                start)
                                      .count());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // inside the stall
  httplib::Client c("127.0.0.1", port);
  double worst = 0;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto health = c.Get("/health");
    worst = std::max(worst, std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                          start)
                                .count());
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
  }
  EXPECT_LT(worst, 0.5);
  auto [status, seconds] = generation.get();
  EXPECT_EQ(status, 200);
  EXPECT_GE(seconds, 1.5) << "the stall did not happen";
  EXPECT_EQ(Metric(c, "polychip_kv_blocks_used"), 0);
}

}  // namespace
}  // namespace polychip
