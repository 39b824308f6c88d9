// `polychip serve --tp-size 2` (and 2 x 2 with --pp-size 2) answers a greedy completion with
// the same text as a single-rank server, with speculative decoding too; /metrics counts the
// bytes each comm plugin staged through host memory.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "common/command.h"

namespace {

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";
// Holds its own continuation, so that n-gram lookup finds drafts.
const char* const kPrompt =
    "In the beginning God created the heaven and the earth. In the beginning";

// The value of a Prometheus series without labels (-1 when absent).
double Metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + name.size() + 2);
}

// Starts the server on a free port, sends one completion, stops the server. Returns the text
// ("" on failure, with the failure recorded); `metrics` (when given) receives /metrics after it.
std::string Complete(const std::string& tp, const std::string& pp,
                     const std::vector<std::string>& extra = {}, std::string* metrics = nullptr) {
  std::vector<std::string> args = {POLYCHIP_BINARY, "serve", "-m", kModel, "--device",
                                   "emu:0,1,2,3", "--tp-size", tp, "--pp-size", pp, "--port",
                                   "0", "--max-total-tokens", "4096"};
  args.insert(args.end(), extra.begin(), extra.end());
  polychip::testing::ChildProcess serve(args, {.stdout_to_log = false, .alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  std::string out;
  if (port == 0) {
    ADD_FAILURE() << "serve did not start:\n" << serve.Log();
  } else {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    const nlohmann::json body = {{"prompt", kPrompt}, {"max_tokens", 24},
                                 {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) {
      ADD_FAILURE() << "request failed\n" << serve.Log();
    } else {
      out = nlohmann::json::parse(r->body)["choices"][0]["text"];
    }
    if (metrics != nullptr) {
      auto m = c.Get("/metrics");
      if (m && m->status == 200) *metrics = m->body;
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

// Speculative decoding on tp 2 x pp 2: rank 0 proposes by n-gram lookup, every rank verifies;
// the text is the single rank's plain one, and drafts were accepted.
TEST(TensorParallelServe, SpeculativeCompletionAsOneRank) {
  const std::string one = Complete("1", "1");
  ASSERT_FALSE(one.empty());
  std::string metrics;
  EXPECT_EQ(Complete("2", "2", {"--speculative-algorithm", "ngram"}, &metrics), one);
  EXPECT_GT(Metric(metrics, "polychip_spec_accepted_tokens_total"), 0) << metrics;
}

// The staged-bytes counter of one group and plugin ("polychip_comm_staged_bytes_total{group=
// "tp",plugin="emuccl",device_memory="true"} 0"); -1 when absent.
double StagedBytes(const std::string& metrics, const std::string& group,
                   const std::string& plugin) {
  const std::regex re("polychip_comm_staged_bytes_total\\{group=\"" + group + "\",plugin=\"" +
                      plugin + "\",device_memory=\"(true|false)\"\\} ([0-9]+)");
  std::smatch m;
  return std::regex_search(metrics, m, re) ? std::atof(m[2].str().c_str()) : -1;
}

// tp 2 through emuccl (collectives on the emu devices' memory) stages nothing through the host,
// and /metrics says so; the same layout through shm stages every hidden state it reduces.
TEST(TensorParallelServe, MetricsShowNothingStagedForADeviceMemoryPlugin) {
  const std::string plugins = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip";
  if (!std::filesystem::exists(plugins + "/libpolychip_comm_emuccl.so")) {
    GTEST_SKIP() << "emuccl not built";
  }
  const std::string one = Complete("1", "1");
  ASSERT_FALSE(one.empty());
  for (const std::string plugin : {"emuccl", "shm"}) {
    SCOPED_TRACE(plugin);
    const std::string config =
        ::testing::TempDir() + "/tp_serve_" + plugin + "_" + std::to_string(getpid()) + ".yaml";
    std::ofstream(config) << "comm: {tp: " << plugin << "}\n";
    std::string metrics;
    EXPECT_EQ(Complete("2", "1", {"--config", config}, &metrics), one);
    const double staged = StagedBytes(metrics, "tp", plugin);
    if (plugin == "emuccl") {
      EXPECT_EQ(staged, 0) << metrics;
      EXPECT_NE(metrics.find("plugin=\"emuccl\",device_memory=\"true\""), std::string::npos);
    } else {
      EXPECT_GT(staged, 0) << metrics;
    }
  }
}

}  // namespace
