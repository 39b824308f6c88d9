// The real `polychip serve` binary over HTTP: a tiny synthesized model on the cpu plugin, one
// server process per test. Checks the API's shapes, bad inputs, client disconnects, KV-cache
// pressure, many concurrent streams and a clean SIGTERM shutdown.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <regex>
#include <thread>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

// A prompt of about `n` tokens (common English words are one token each in qwen2's vocabulary).
std::string Words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += i % 2 ? " house" : " water";
  return s;
}

TEST(ServeBinary, ChatCompletionGenerateAndStreaming) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--served-model-name", "tiny", "--context-length", "512"});
  ASSERT_TRUE(s.ok());

  auto models = s.Client()->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");

  // Chat, non-streaming. ignore_eos makes the length deterministic on a random model.
  const json chat = {{"model", "tiny"},
                     {"messages", {{{"role", "user"}, {"content", "Say something."}}}},
                     {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
  auto [status, r] = s.Post("/v1/chat/completions", chat);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 8);
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int>(), 5);  // the chat template adds markers
  EXPECT_EQ(r["usage"]["total_tokens"].get<int>(),
            r["usage"]["prompt_tokens"].get<int>() + 8);
  const std::string chat_text = r["choices"][0]["message"]["content"];

  // The same request streamed: the deltas add up to the same text (greedy).
  json chat_stream = chat;
  chat_stream["stream"] = true;
  chat_stream["stream_options"] = {{"include_usage", true}};
  auto [sst, raw] = PostStream(s, "/v1/chat/completions", chat_stream);
  ASSERT_EQ(sst, 200) << raw;
  bool done = false;
  auto events = SseEvents(raw, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  std::string streamed;
  std::string finish;
  for (const auto& e : events) {
    ASSERT_FALSE(e.is_discarded());
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    if (e["choices"].empty()) continue;
    const auto& c = e["choices"][0];
    if (c["delta"].contains("content")) streamed += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(streamed, chat_text);
  EXPECT_EQ(finish, "length");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 8);

  // Completion, non-streaming and streaming.
  const json comp = {{"prompt", "The quick brown fox"}, {"max_tokens", 6},
                     {"temperature", 0}, {"ignore_eos", true}};
  auto [cst, c] = s.Post("/v1/completions", comp);
  ASSERT_EQ(cst, 200) << c.dump();
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["usage"]["completion_tokens"], 6);
  EXPECT_EQ(c["usage"]["prompt_tokens"], 4);  // "The", " quick", " brown", " fox"
  json comp_stream = comp;
  comp_stream["stream"] = true;
  auto [cst2, craw] = PostStream(s, "/v1/completions", comp_stream);
  ASSERT_EQ(cst2, 200);
  std::string ctext;
  for (const auto& e : SseEvents(craw, &done)) ctext += e["choices"][0]["text"].get<std::string>();
  EXPECT_TRUE(done);
  EXPECT_EQ(ctext, c["choices"][0]["text"].get<std::string>());

  // SGLang's /generate from token ids, and /tokenize agreeing with usage.
  auto [tst, tok] = s.Post("/tokenize", {{"text", "The quick brown fox"}});
  ASSERT_EQ(tst, 200);
  EXPECT_EQ(tok["count"], 4);
  auto [gst, g] = s.Post("/generate", {{"input_ids", tok["tokens"]},
                                       {"sampling_params", {{"max_new_tokens", 6},
                                                            {"temperature", 0},
                                                            {"ignore_eos", true}}}});
  ASSERT_EQ(gst, 200) << g.dump();
  EXPECT_EQ(g["output_ids"].size(), 6u);
  EXPECT_EQ(g["text"], c["choices"][0]["text"]);  // same tokens in, same greedy tokens out
}

TEST(ServeBinary, BadInputGets4xxAndServerStillAnswers) {
  PC_REQUIRE_SERVE_DEPS(model);
  const std::string key = "sekret";
  ServeProcess s(model, {"--api-key", key, "--context-length", "128"});
  ASSERT_TRUE(s.ok());
  struct Case {
    const char* what;
    const char* path;
    std::string body;
    std::string key;
    int status;
  };
  const std::vector<Case> cases = {
      {"malformed JSON", "/v1/completions", R"({"prompt": "hi",)", key, 400},
      {"prompt of the wrong type", "/v1/completions", R"({"prompt": {"a": 1}})", key, 400},
      {"messages of the wrong type", "/v1/chat/completions", R"({"messages": "hi"})", key, 400},
      {"max_tokens a string", "/v1/completions", R"({"prompt": "hi", "max_tokens": "ten"})",
       key, 400},
      {"negative max_tokens", "/v1/completions", R"({"prompt": "hi", "max_tokens": -1})", key,
       400},
      {"huge max_tokens", "/v1/completions",
       R"({"prompt": "hi", "max_tokens": 1000000000000})", key, 400},
      {"prompt longer than the context", "/v1/completions",
       json{{"prompt", Words(300)}}.dump(), key, 400},
      {"invalid UTF-8", "/v1/completions", "{\"prompt\": \"\xff\xfe bad\"}", key, 400},
      {"unknown model", "/v1/completions", R"({"prompt": "hi", "model": "gpt-17"})", key, 404},
      {"missing API key", "/v1/completions", R"({"prompt": "hi"})", "", 401},
      {"wrong API key", "/v1/completions", R"({"prompt": "hi"})", "wrong", 401},
  };
  for (const auto& c : cases) {
    auto [status, body] = s.PostRaw(c.path, c.body, c.key);
    EXPECT_EQ(status, c.status) << c.what << ": " << body.dump();
    ASSERT_TRUE(body.is_object()) << c.what;
    ASSERT_TRUE(body.contains("error")) << c.what << ": " << body.dump();
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty()) << c.what;
    // The server still answers a good request after each bad one.
    auto [ok, good] = s.Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 2}}, key);
    EXPECT_EQ(ok, 200) << "after " << c.what << ": " << good.dump();
  }
  EXPECT_EQ(s.Metric("polychip_requests_failed_total", key), 0);
}

// The transport's limits are flags: a body over --max-request-body gets 413 before any work.
TEST(ServeBinary, MaxRequestBodyFlagSetsThe413Limit) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--max-request-body", "2048", "--request-body-timeout", "5",
                         "--write-timeout", "5"});
  ASSERT_TRUE(s.ok());
  const std::string small = json{{"prompt", "hi"}, {"max_tokens", 2}}.dump();
  const std::string large =
      json{{"prompt", "hi"}, {"max_tokens", 2}, {"user", std::string(3000, 'x')}}.dump();
  EXPECT_EQ(s.PostRaw("/v1/completions", large).first, 413);
  EXPECT_EQ(s.PostRaw("/v1/completions", small).first, 200);
}

TEST(ServeBinary, ClientDisconnectMidStreamFreesKvBlocks) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "2048"});
  ASSERT_TRUE(s.ok());
  constexpr int kMaxTokens = 1500;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", Words(40)}, {"max_tokens", kMaxTokens}, {"ignore_eos", true},
                  {"stream", true}}
                 .dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  double used_while_streaming = -1;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (std::string(data, len).find("data: ") != std::string::npos) ++chunks;
    if (chunks < 3) return true;
    used_while_streaming = s.Metric("polychip_kv_blocks_used");
    return false;  // hang up mid-stream
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  s.Client()->send(req, res, err);
  EXPECT_GE(chunks, 3);
  EXPECT_GT(used_while_streaming, 0);  // 40 prompt tokens + 3 generated: at least 3 blocks
  const bool freed = ServeProcess::WaitFor(
      [&] {
        return s.Metric("polychip_kv_blocks_used") == 0 &&
               s.Metric("polychip_requests_aborted_total") == 1;
      },
      20);
  EXPECT_TRUE(freed) << "kv_blocks_used " << s.Metric("polychip_kv_blocks_used")
                     << ", aborted " << s.Metric("polychip_requests_aborted_total");
  EXPECT_LT(s.Metric("polychip_generation_tokens_total"), kMaxTokens);
  EXPECT_EQ(s.Metric("polychip_num_running_reqs"), 0);
}

TEST(ServeBinary, MoreRequestsThanKvCapacityAllComplete) {
  PC_REQUIRE_SERVE_DEPS(model);
  // 256 tokens of KV (16 blocks of 16); each request needs 20 + 100 tokens (8 blocks).
  ServeProcess s(model, {"--context-length", "256", "--max-total-tokens", "256",
                         "--page-size", "16"});
  ASSERT_TRUE(s.ok());
  constexpr int kRequests = 6, kMaxTokens = 100;
  std::vector<int> statuses(kRequests, 0), generated(kRequests, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      auto [status, r] = s.Post("/v1/completions",
                                {{"prompt", Words(18) + " " + std::to_string(i)},
                                 {"max_tokens", kMaxTokens}, {"temperature", 0},
                                 {"ignore_eos", true}});
      statuses[i] = status;
      if (status == 200) generated[i] = r["usage"]["completion_tokens"];
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(statuses[i], 200) << "request " << i;
    EXPECT_EQ(generated[i], kMaxTokens) << "request " << i;
  }
  EXPECT_GT(s.Metric("polychip_num_preemptions_total"), 0);
  EXPECT_EQ(s.Metric("polychip_requests_finished_total"), kRequests);
  EXPECT_EQ(s.Metric("polychip_requests_failed_total"), 0);
  // The gauges are published at the end of the engine's step, just after the last response.
  EXPECT_TRUE(ServeProcess::WaitFor([&] { return s.Metric("polychip_kv_blocks_used") == 0; }, 5))
      << s.Metric("polychip_kv_blocks_used") << " KV blocks still held";
}

// 256 clients open their streams at once (the burst overflows a small listen backlog, which
// shows up as connect retries). Every one must be served to completion.
TEST(ServeBinary, ManyConcurrentStreamingClientsAllComplete) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256", "--max-total-tokens", "16384",
                         "--max-running-requests", "256"});
  ASSERT_TRUE(s.ok());
  constexpr int kClients = 256, kMaxTokens = 8;
  std::vector<std::string> failures(kClients);
  std::atomic<int> ready{0};
  std::vector<std::thread> clients;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kClients) std::this_thread::yield();
      auto [status, raw] = PostStream(
          s, "/v1/completions",
          {{"prompt", "client " + std::to_string(i) + Words(8)}, {"max_tokens", kMaxTokens},
           {"temperature", 0}, {"ignore_eos", true}, {"stream", true},
           {"stream_options", {{"include_usage", true}}}});
      if (status != 200) {
        failures[i] = "HTTP " + std::to_string(status) + " " + raw.substr(0, 200);
        return;
      }
      bool done = false;
      auto events = SseEvents(raw, &done);
      if (!done || events.empty() || !events.back().contains("usage") ||
          events.back()["usage"]["completion_tokens"] != kMaxTokens) {
        failures[i] = "incomplete stream: " + raw.substr(0, 300);
      }
    });
  }
  for (auto& t : clients) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int failed = 0;
  for (int i = 0; i < kClients; ++i) {
    if (failures[i].empty()) continue;
    if (++failed <= 5) ADD_FAILURE() << "client " << i << ": " << failures[i];
  }
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(s.Metric("polychip_requests_finished_total"), kClients);
  std::printf("256 streaming clients served in %.1f s\n", seconds);
}

// Runs `polychip bench-serving` against 127.0.0.1:port with `args`; its exit status in *rc and
// its JSON report (discarded when unreadable).
json BenchServing(int port, const std::string& args, int* rc) {
  const fs::path out = fs::temp_directory_path() /
                       ("polychip-bench-serving-" + std::to_string(getpid()) + ".json");
  const std::string cmd = PolychipBinary().string() + " bench-serving --base-url http://127.0.0.1:" +
                          std::to_string(port) + " " + args + " --output-json " + out.string() +
                          " > /dev/null 2>&1";
  *rc = RunCommand(cmd).exit_code;
  std::ifstream in(out);
  json r = json::parse(in, nullptr, false);
  fs::remove(out);
  return r;
}

// `polychip bench-serving` against the real server, with the openai (/v1/completions) and sglang
// (/generate) backends: every request completes with exactly the requested output tokens, the
// JSON report adds up, and a bad backend name is refused.
TEST(ServeBinary, BenchServingDrivesTheServerWithBothApis) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256"});
  ASSERT_TRUE(s.ok());
  for (const char* backend : {"openai", "sglang"}) {
    SCOPED_TRACE(backend);
    int rc = -1;
    const json r = BenchServing(s.port(),
                                std::string("--backend ") + backend +
                                    " --num-prompts 6 --max-concurrency 3 --random-input-len 16"
                                    " --random-output-len 5 --seed 3",
                                &rc);
    ASSERT_EQ(rc, 0);
    ASSERT_FALSE(r.is_discarded());
    EXPECT_EQ(r["completed"], 6);
    EXPECT_EQ(r["failed"], 0);
    EXPECT_EQ(r["total_output_tokens"], 6 * 5);
    EXPECT_EQ(r["total_streamed_tokens"], 6 * 5);
    EXPECT_GT(r["total_input_tokens"].get<int>(), 6 * 8);  // about 16 words each
    EXPECT_GT(r["output_token_throughput"].get<double>(), 0);
    EXPECT_GT(r["p50_ttft_ms"].get<double>(), 0);
    EXPECT_LE(r["p50_ttft_ms"].get<double>(), r["p50_e2e_ms"].get<double>());
    EXPECT_FALSE(r.contains("spec_acceptance_rate"));  // this server does not speculate
  }
  int rc = 0;
  BenchServing(s.port(), "--backend nosuch", &rc);
  EXPECT_NE(rc, 0);
}

// Against a server speculating by n-gram lookup (k = 4), bench-serving reports the run's
// drafts from /metrics: acceptance in [0, 1], and tokens per verification step between 1 and
// k + 1, equal to 1 + accepted / steps.
TEST(ServeBinary, BenchServingReportsSpeculativeAcceptance) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256", "--speculative-algorithm", "ngram",
                         "--speculative-num-draft-tokens", "4"});
  ASSERT_TRUE(s.ok());
  int rc = -1;
  // Prompts of random words from a short list: their own n-grams recur, so lookup drafts.
  const json r = BenchServing(s.port(),
                              "--num-prompts 6 --max-concurrency 2 --random-input-len 48"
                              " --random-output-len 24 --seed 5",
                              &rc);
  ASSERT_EQ(rc, 0);
  ASSERT_FALSE(r.is_discarded());
  ASSERT_TRUE(r.contains("spec_acceptance_rate")) << r.dump();
  const double steps = r["spec_verify_steps"], drafts = r["spec_draft_tokens"],
               accepted = r["spec_accepted_tokens"];
  EXPECT_GT(steps, 0) << r.dump();
  EXPECT_GE(drafts, steps);
  EXPECT_LE(drafts, 4 * steps);
  EXPECT_GE(accepted, 0);
  EXPECT_LE(accepted, drafts);
  EXPECT_DOUBLE_EQ(r["spec_acceptance_rate"].get<double>(), accepted / drafts);
  const double length = r["spec_accept_length"];
  EXPECT_DOUBLE_EQ(length, 1 + accepted / steps);
  EXPECT_GE(length, 1.0);
  EXPECT_LE(length, 5.0);
  // The accepted drafts are generated tokens: never more than the run's.
  EXPECT_LE(accepted + steps, r["total_output_tokens"].get<double>());
}

// `bench-serving --backend llamacpp` against a stand-in for llama-server's native /completion
// stream (no llama-server is built for the tests): every third request fails mid-stream the way
// llama-server does on broken UTF-8. Completed requests count their `tokens_predicted`; a failed
// one is counted as failed and only its delivered tokens go into the streamed total.
TEST(ServeBinary, BenchServingLlamaCppBackendCountsFailedStreamsApart) {
  if (!fs::exists(PolychipBinary())) GTEST_SKIP() << "polychip binary not built";
  httplib::Server fake;
  std::atomic<int> served{0};
  fake.Post("/completion", [&](const httplib::Request& req, httplib::Response& res) {
    const json body = json::parse(req.body, nullptr, false);
    const bool fail = served.fetch_add(1) % 3 == 2;
    const int n = body.is_discarded() ? 0 : body.value("n_predict", 0);
    std::string sse;
    for (int i = 0; i < n; ++i) {
      if (fail && i == 2) {
        sse += "data: " + json{{"error", {{"code", 500}, {"message", "bad format"}}}}.dump() + "\n\n";
        break;
      }
      sse += "data: " + json{{"content", "w"}, {"stop", false}}.dump() + "\n\n";
    }
    if (!fail) {
      sse += "data: " + json{{"content", ""}, {"stop", true}, {"tokens_predicted", n},
                             {"tokens_evaluated", 10}}.dump() + "\n\n";
    }
    res.set_content(sse, "text/event-stream");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread server([&] { fake.listen_after_bind(); });
  int rc = -1;
  const json r = BenchServing(port,
                              "--backend llamacpp --num-prompts 6 --max-concurrency 1"
                              " --random-input-len 8 --random-output-len 5",
                              &rc);
  fake.stop();
  server.join();
  EXPECT_EQ(rc, 1);  // bench-serving exits 1 when any request failed
  ASSERT_FALSE(r.is_discarded());
  EXPECT_EQ(r["completed"], 4);
  EXPECT_EQ(r["failed"], 2);
  EXPECT_EQ(r["total_output_tokens"], 4 * 5);
  EXPECT_EQ(r["total_input_tokens"], 4 * 10);
  EXPECT_EQ(r["total_streamed_tokens"], 4 * 5 + 2 * 2);
  EXPECT_LT(r["output_token_throughput"].get<double>(), r["streamed_token_throughput"].get<double>());
}

TEST(ServeBinary, SigtermWithAStreamInFlightExitsZero) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "2048"});
  ASSERT_TRUE(s.ok());
  std::atomic<bool> streaming{false};
  std::pair<int, std::string> result;
  std::thread client([&] {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "hello"}, {"max_tokens", 1500}, {"ignore_eos", true},
                    {"stream", true}}
                   .dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      result.second.append(data, len);
      streaming = true;
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    s.Client()->send(req, res, err);
    result.first = res.status;
  });
  ASSERT_TRUE(ServeProcess::WaitFor([&] { return streaming.load(); }, 30));
  EXPECT_EQ(s.Terminate(30), 0) << s.Log();
  client.join();  // the stream ends (cancelled) rather than hanging
  EXPECT_NE(result.second.find("data: "), std::string::npos);
  EXPECT_NE(s.Log().find("stopped"), std::string::npos);
}

// /metrics after a request carries the plugin's per-op counters, labelled backend, device, op
// and generation; the ITL target is accepted and reported.
TEST(ServeBinary, MetricsHavePerOpCountersWithLabels) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256", "--max-itl-ms", "50"});
  ASSERT_TRUE(s.ok());
  auto [status, r] = s.Post("/v1/completions", {{"prompt", "The quick brown fox"},
                                                {"max_tokens", 4},
                                                {"temperature", 0},
                                                {"ignore_eos", true}});
  ASSERT_EQ(status, 200) << r.dump();
  auto info = s.Client()->Get("/get_server_info");
  ASSERT_TRUE(info);
  EXPECT_EQ(json::parse(info->body)["max_itl_ms"], 50.0);
  auto m = s.Client()->Get("/metrics");
  ASSERT_TRUE(m);
  const std::string& text = m->body;
  EXPECT_NE(text.find("# TYPE polychip_op_launches_total counter"), std::string::npos) << text;
  for (const char* op : {"matmul", "attention", "rms_norm", "kv_store"}) {
    const std::regex launches(std::string(R"(
polychip_op_launches_total\{backend="cpu",)"
                                          R"(device="0",generation="[0-9]+",op=")") +
                              op + R"("\} ([0-9.e+]+)
)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(text, match, launches)) << op << "\n" << text;
    // 4 prompt tokens and 4 generated ones: at least 4 steps of every op.
    EXPECT_GE(std::stod(match[1]), 4) << op;
    const std::regex seconds(std::string(R"(
polychip_op_device_seconds_total\{backend="cpu",)"
                                         R"(device="0",generation="[0-9]+",op=")") +
                             op + R"("\} ([0-9.e+-]+)
)");
    ASSERT_TRUE(std::regex_search(text, match, seconds)) << op;
    EXPECT_GT(std::stod(match[1]), 0) << op;
  }
  EXPECT_NE(text.find("polychip_op_read_bytes_total{backend=\"cpu\""), std::string::npos);
  EXPECT_NE(text.find("polychip_op_flops_total{backend=\"cpu\""), std::string::npos);
}

// Issue 16, --shutdown-timeout through the binary: on SIGTERM a stream that finishes inside the
// timeout ends normally, one still running past it ends with finish_reason "abort" and [DONE],
// and the process exits 0 soon after the timeout although one client has sent half a request
// and another never reads.
TEST(ServeBinary, SigtermLetsShortStreamsFinishAbortsLongOnesAndExitsPromptly) {
  PC_REQUIRE_SERVE_DEPS(model);
  constexpr double kTimeout = 3;
  ServeProcess s(model, {"--context-length", "32768", "--shutdown-timeout", "3"});
  ASSERT_TRUE(s.ok());
  struct Stream {
    std::atomic<bool> started{false};
    std::string text;
  };
  auto stream = [&](Stream* out, int max_tokens) {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "hello"}, {"max_tokens", max_tokens}, {"ignore_eos", true},
                    {"stream", true}}
                   .dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [out](const char* data, size_t len, uint64_t, uint64_t) {
      out->text.append(data, len);
      out->started = true;
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    s.Client()->send(req, res, err);
  };
  auto raw_connect = [&](const std::string& bytes) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(s.port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    return fd;
  };
  Stream long_one, short_one;
  std::thread long_client(stream, &long_one, 32000);
  ASSERT_TRUE(ServeProcess::WaitFor([&] { return long_one.started.load(); }, 60));
  const std::string body = json{{"prompt", "x"}, {"max_tokens", 32000}, {"stream", true},
                                {"ignore_eos", true}}.dump();
  const int silent_fd = raw_connect(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);  // never read
  const int half_fd = raw_connect("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  std::thread short_client(stream, &short_one, 30);
  ASSERT_TRUE(ServeProcess::WaitFor([&] { return short_one.started.load(); }, 60));

  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(s.Terminate(60), 0) << s.Log();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long_client.join();
  short_client.join();
  close(silent_fd);
  close(half_fd);
  EXPECT_NE(short_one.text.find(R"("finish_reason":"length")"), std::string::npos)
      << short_one.text;
  EXPECT_NE(short_one.text.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(long_one.text.find(R"("finish_reason":"abort")"), std::string::npos)
      << long_one.text.substr(long_one.text.size() - std::min<size_t>(long_one.text.size(), 600));
  EXPECT_NE(long_one.text.find("data: [DONE]"), std::string::npos);
  // Before: the half-sent request alone held the exit for the 30 s read timeout.
  EXPECT_LT(seconds, kTimeout + 12) << s.Log();
}

}  // namespace
}  // namespace polychip::server::testing
