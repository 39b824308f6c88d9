// `polychip serve --tp-size 2` (and 2 x 2 with --pp-size 2) answers a greedy completion with
// the same text as a single-rank server.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/command.h"

namespace {

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

// Starts the server on a free port, sends one completion, stops the server. Returns the text
// ("" on failure, with the failure recorded).
std::string Complete(const std::string& tp, const std::string& pp) {
  polychip::testing::ChildProcess serve(
      {POLYCHIP_BINARY, "serve", "-m", kModel, "--device", "emu:0,1,2,3", "--tp-size", tp,
       "--pp-size", pp, "--port", "0", "--max-total-tokens", "4096"},
      {.stdout_to_log = false, .alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  std::string out;
  if (port == 0) {
    ADD_FAILURE() << "serve did not start:\n" << serve.Log();
  } else {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const nlohmann::json body = {{"prompt", "In the beginning"}, {"max_tokens", 24},
                                 {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) {
      ADD_FAILURE() << "request failed\n" << serve.Log();
    } else {
      out = nlohmann::json::parse(r->body)["choices"][0]["text"];
    }
  }
  serve.Signal(SIGTERM);  // rank 0 stops the other ranks on its way out
  if (!serve.Wait(10).has_value()) {
    ADD_FAILURE() << "serve did not stop on SIGTERM\n" << serve.Log();
  }
  return out;
}

TEST(TensorParallelServe, SameCompletionAsOneRank) {
  const std::string one = Complete("1", "1");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(Complete("2", "1"), one);
  EXPECT_EQ(Complete("2", "2"), one);
}

}  // namespace
