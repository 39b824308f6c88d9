// `polychip serve --tp-size 2` (and 2 x 2 with --pp-size 2) answers a greedy completion with
// the same text as a single-rank server, with speculative decoding too, and with LoRA adapters
// (one from --lora, one through the load route) in batches that mix them with the base;
// /metrics counts the bytes each comm plugin staged through host memory.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
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

// A LoRA adapter for the tiny model of `type`, synthesized once per build directory ("" when
// that failed).
std::string TinyAdapter(const std::string& type, int seed) {
  const std::string out =
      std::string(POLYCHIP_BUILD_DIR) + "/test-data/tp-serve-lora-" + type + ".gguf";
  if (access(out.c_str(), R_OK) == 0) return out;
  std::system(("mkdir -p " + std::string(POLYCHIP_BUILD_DIR) + "/test-data").c_str());
  const std::string tmp = out + ".tmp" + std::to_string(getpid());
  const std::string cmd = std::string(POLYCHIP_BINARY) + " gguf synth --lora-for " + kModel +
                          " --lora-rank 8 --lora-alpha 16 --type " + type +
                          " --weight-std 0.2 -q --seed " + std::to_string(seed) + " --out " + tmp;
  if (polychip::testing::RunCommand(cmd).exit_code != 0) return "";
  if (std::rename(tmp.c_str(), out.c_str()) != 0) return "";
  return out;
}

// Starts a server with adapter `a` (--lora), loads adapter `b` through the route, then sends
// the base, `a` and `b` requests at once; unloads `b` and asks `a` again (with one adapter
// resident, `b` is out of every rank's cache by then, so the other ranks are told to forget
// it). Returns the four texts (empty ones with a failure recorded).
std::vector<std::string> CompleteWithAdapters(const std::string& tp, const std::string& pp,
                                              const std::string& a, const std::string& b) {
  std::vector<std::string> args = {POLYCHIP_BINARY, "serve", "-m", kModel, "--device",
                                   "emu:0,1,2,3", "--tp-size", tp, "--pp-size", pp, "--port",
                                   "0", "--max-total-tokens", "4096", "--lora", "a=" + a,
                                   "--max-loras-per-batch", "1", "--admin-key", "k"};
  polychip::testing::ChildProcess serve(args, {.stdout_to_log = false, .alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  std::vector<std::string> texts(4);
  if (port == 0) {
    ADD_FAILURE() << "serve did not start:\n" << serve.Log();
    return texts;
  }
  const httplib::Headers admin = {{"Authorization", "Bearer k"}};
  auto complete = [port, &serve](const std::string& model, std::string* text) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    nlohmann::json body = {{"prompt", kPrompt}, {"max_tokens", 16}, {"temperature", 0},
                           {"ignore_eos", true}};
    if (!model.empty()) body["model"] = model;
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) {
      ADD_FAILURE() << "request for '" << model << "' failed: " << (r ? r->body : "")
                    << "\n" << serve.Log();
    } else {
      *text = nlohmann::json::parse(r->body)["choices"][0]["text"];
    }
  };
  httplib::Client c("127.0.0.1", port);
  auto loaded = c.Post("/v1/load_lora_adapter", admin,
                       nlohmann::json({{"lora_name", "b"}, {"lora_path", b}}).dump(),
                       "application/json");
  EXPECT_TRUE(loaded && loaded->status == 200) << (loaded ? loaded->body : "no answer");
  {
    std::vector<std::thread> threads;
    const char* const models[] = {"", "a", "b"};
    for (int i = 0; i < 3; ++i) threads.emplace_back(complete, models[i], &texts[size_t(i)]);
    for (std::thread& t : threads) t.join();
  }
  auto unloaded = c.Post("/v1/unload_lora_adapter", admin,
                         nlohmann::json({{"lora_name", "b"}}).dump(), "application/json");
  EXPECT_TRUE(unloaded && unloaded->status == 200) << (unloaded ? unloaded->body : "no answer");
  complete("a", &texts[3]);
  serve.Signal(SIGTERM);
  if (!serve.Wait(10).has_value()) {
    ADD_FAILURE() << "serve did not stop on SIGTERM\n" << serve.Log();
  }
  return texts;
}

// Every rank learns each step's adapters (and their scales) from rank 0, opens the ones loaded
// while serving, and applies its share: each text is the single rank's, and the adapters
// change it.
TEST(TensorParallelServe, LoraAdaptersMixedWithTheBaseAsOneRank) {
  const std::string a = TinyAdapter("F16", 201), b = TinyAdapter("Q8_0", 202);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  const std::vector<std::string> one = CompleteWithAdapters("1", "1", a, b);
  ASSERT_FALSE(one[0].empty());
  EXPECT_NE(one[1], one[0]);
  EXPECT_NE(one[2], one[0]);
  EXPECT_NE(one[2], one[1]);
  EXPECT_EQ(one[3], one[1]);
  EXPECT_EQ(CompleteWithAdapters("2", "1", a, b), one);
  EXPECT_EQ(CompleteWithAdapters("2", "2", a, b), one);
}

// An adapter that rank 0 loaded but another rank cannot open (its file gone before its first
// request): that request fails naming the rank, and the job goes on serving.
TEST(TensorParallelServe, AdapterARankCannotOpenFailsOnlyItsRequest) {
  const std::string a = TinyAdapter("F16", 201);
  ASSERT_FALSE(a.empty());
  const std::string gone = std::string(POLYCHIP_BUILD_DIR) + "/test-data/tp-serve-gone-" +
                           std::to_string(getpid()) + ".gguf";
  ASSERT_EQ(std::system(("cp " + a + " " + gone).c_str()), 0);
  polychip::testing::ChildProcess serve(
      {POLYCHIP_BINARY, "serve", "-m", kModel, "--device", "emu:0,1", "--tp-size", "2", "--port",
       "0", "--max-total-tokens", "4096", "--admin-key", "k"},
      {.stdout_to_log = false, .alarm_seconds = 120});
  const int port = serve.WaitForListeningPort(60);
  ASSERT_NE(port, 0) << serve.Log();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto loaded = c.Post("/v1/load_lora_adapter", {{"Authorization", "Bearer k"}},
                       nlohmann::json({{"lora_name", "g"}, {"lora_path", gone}}).dump(),
                       "application/json");
  std::remove(gone.c_str());  // rank 0 has it open; rank 1 has not seen it yet
  ASSERT_TRUE(loaded && loaded->status == 200) << (loaded ? loaded->body : "") << serve.Log();
  nlohmann::json body = {{"prompt", kPrompt}, {"max_tokens", 4}, {"temperature", 0},
                         {"model", "g"}};
  auto failed = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(failed);
  EXPECT_NE(failed->status, 200) << failed->body;
  EXPECT_NE(failed->body.find("rank(s) 1 could not open"), std::string::npos) << failed->body;
  body.erase("model");
  auto base = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(base);
  EXPECT_EQ(base->status, 200) << base->body << serve.Log();
  serve.Signal(SIGTERM);
  EXPECT_TRUE(serve.Wait(10).has_value()) << serve.Log();
}

}  // namespace
