// `polychip serve --tp-size 2` (and 2 x 2 with --pp-size 2) answers a greedy completion with
// the same text as a single-rank server.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

// Starts the server on a free port, sends one completion, stops the server. Returns the text
// ("" on failure, with the failure recorded).
std::string Complete(const std::string& tp, const std::string& pp) {
  static int n = 0;
  const std::string log = "/tmp/polychip-tp-serve-" + std::to_string(getpid()) + "-" +
                          std::to_string(++n) + ".log";
  const pid_t pid = fork();
  if (pid == 0) {
    freopen(log.c_str(), "w", stderr);
    freopen("/dev/null", "w", stdout);
    alarm(120);
    execl(POLYCHIP_BINARY, POLYCHIP_BINARY, "serve", "-m", kModel.c_str(), "--device",
          "emu:0,1,2,3", "--tp-size", tp.c_str(), "--pp-size", pp.c_str(), "--port", "0",
          "--max-total-tokens", "4096", (char*)nullptr);
    _exit(127);
  }
  auto text_of = [&] {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::regex listening(R"(listening on http://[^:]+:(\d+))");
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::smatch m;
    const std::string t = text_of();
    if (std::regex_search(t, m, listening)) port = std::stoi(m[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string out;
  if (port == 0) {
    ADD_FAILURE() << "serve did not start:\n" << text_of();
  } else {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const nlohmann::json body = {{"prompt", "In the beginning"}, {"max_tokens", 24},
                                 {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) {
      ADD_FAILURE() << "request failed\n" << text_of();
    } else {
      out = nlohmann::json::parse(r->body)["choices"][0]["text"];
    }
  }
  kill(pid, SIGTERM);  // rank 0 stops the other ranks on its way out
  int status = 0;
  for (int i = 0; i < 200 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (waitpid(pid, &status, WNOHANG) == 0) {
    ADD_FAILURE() << "serve did not stop on SIGTERM\n" << text_of();
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  std::remove(log.c_str());
  return out;
}

TEST(TensorParallelServe, SameCompletionAsOneRank) {
  const std::string one = Complete("1", "1");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(Complete("2", "1"), one);
  EXPECT_EQ(Complete("2", "2"), one);
}

}  // namespace
