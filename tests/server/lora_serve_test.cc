// LoRA adapters under concurrency through the real `polychip serve`: 16 streaming requests at
// once over 4 adapters and the base model, with --max-loras-per-batch 2 (so that steps mix
// adapters, sequences of a third wait, and the device's resident adapters are swapped), each
// answer equal to the same request served alone. The base is the trained tiny model in F16 (its
// greedy tokens do not depend on how many rows a step holds); the adapters are synthesized.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

const fs::path kBase = fs::path(POLYCHIP_SOURCE_DIR) / "models" / "polychip-tiny.gguf";
constexpr int kAdapters = 4;
constexpr int kRequests = 16;

// Adapter i (1-based) for the tiny model, synthesized once per build directory; empty with
// `why` set when synthesis failed.
fs::path Adapter(int i, std::string* why) {
  const fs::path out = BuildDir() / "test-data" / ("tiny-lora-" + std::to_string(i) + ".gguf");
  if (fs::exists(out)) return out;
  fs::create_directories(out.parent_path());
  // Tests may run in parallel: write aside, then rename into place atomically.
  const fs::path tmp = out.string() + ".tmp" + std::to_string(getpid());
  // Weights large enough that every adapter changes the greedy text.
  const std::string cmd = PolychipBinary().string() + " gguf synth --lora-for " +
                          kBase.string() + " --lora-rank 8 --lora-alpha 16 --type F16" +
                          " --weight-std 0.5 -q --seed " + std::to_string(100 + i) + " --out " +
                          tmp.string();
  if (RunCommand(cmd).exit_code != 0) {
    *why = "adapter synthesis failed: " + cmd;
    return {};
  }
  fs::rename(tmp, out);
  return out;
}

const char* const kPrompts[] = {
    "In the beginning God created",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the poor in spirit:",
    "And it came to pass in those days,",
};

// Request i: prompt i % 4 under model i % 5 (0: the base, else adapter a<k>), so that every
// adapter meets several prompts and every prompt several adapters.
std::string ModelOf(int i) { return i % 5 == 0 ? "base" : "a" + std::to_string(i % 5); }

json Body(int i) {
  return {{"model", ModelOf(i)}, {"prompt", kPrompts[i % 4]}, {"max_tokens", 16},
          {"temperature", 0}, {"ignore_eos", true}, {"stream", true}};
}

// The streamed text of one request ("" with a failure recorded when it fails).
std::string Stream(int port, const json& body) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r || r->status != 200) {
    ADD_FAILURE() << body.dump() << ": " << (r ? r->body : "no answer");
    return "";
  }
  bool done = false;
  std::string text;
  for (const json& ev : polychip::testing::SseEvents(r->body, &done)) {
    if (ev.contains("choices") && !ev["choices"].empty()) {
      text += ev["choices"][0].value("text", "");
    }
  }
  EXPECT_TRUE(done) << r->body;
  return text;
}

double Metric(const std::string& text, const std::string& name) {
  const size_t at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + name.size() + 2);
}

TEST(LoraServe, ConcurrentStreamsOverAdaptersEqualEachAlone) {
  if (!fs::exists(PolychipBinary())) GTEST_SKIP() << "polychip binary not built";
  if (!fs::exists(CpuPlugin())) GTEST_SKIP() << "cpu plugin not built";
  std::vector<std::string> flags = {"--served-model-name", "base", "--context-length", "256",
                                    "--max-total-tokens", "8192", "--max-loras-per-batch", "2"};
  for (int i = 1; i <= kAdapters; ++i) {
    std::string why;
    const fs::path a = Adapter(i, &why);
    ASSERT_FALSE(a.empty()) << why;
    flags.push_back("--lora");
    flags.push_back("a" + std::to_string(i) + "=" + a.string());
  }
  ServeProcess s(kBase.string(), flags);
  ASSERT_TRUE(s.ok());

  // Alone: one request at a time, and the base's text of each prompt.
  std::vector<std::string> alone(kRequests), base(std::size(kPrompts));
  for (int i = 0; i < kRequests; ++i) alone[i] = Stream(s.port(), Body(i));
  for (size_t p = 0; p < base.size(); ++p) {
    json b = Body(0);
    b["prompt"] = kPrompts[p];
    base[p] = Stream(s.port(), b);
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_FALSE(alone[i].empty()) << i;
    // Each adapter changes the text, or the comparison below could not tell them apart.
    if (i % 5 != 0) EXPECT_NE(alone[i], base[i % 4]) << ModelOf(i) << " on prompt " << i % 4;
  }

  // Together: all 16 streams at once.
  std::vector<std::string> together(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] { together[i] = Stream(s.port(), Body(i)); });
  }
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(together[i], alone[i]) << "request " << i << ": " << ModelOf(i) << " on prompt "
                                     << i % 4;
  }

  // Four adapters through two resident slots: each was uploaded at least once, so adapters
  // were evicted and reloaded on demand.
  auto m = s.Client()->Get("/metrics");
  ASSERT_TRUE(m);
  const double uploads = Metric(m->body, "polychip_lora_uploads_total");
  EXPECT_GE(uploads, kAdapters) << m->body;
  std::printf("%d streams over %d adapters and the base: %.0f adapter uploads\n", kRequests,
              kAdapters, uploads);
  EXPECT_EQ(Metric(m->body, "polychip_requests_failed_total"), 0);
  // vLLM's gauge of the adapters in use, two per step. (Its lists are published at the end of
  // a step, which may follow the last stream's end: tests/engine checks them.)
  EXPECT_NE(m->body.find("vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\""),
            std::string::npos)
      << m->body;
}

}  // namespace
}  // namespace polychip::server::testing
