// `polychip bench-serving`: a load generator in the spirit of sglang.bench_serving. It sends
// random prompts as streaming requests to an OpenAI-compatible server (/v1/completions: polychip,
// llama-server, vLLM, SGLang), to SGLang's /generate, or as chat turns to Anthropic's
// /v1/messages or OpenAI's /v1/responses, at a given request rate and concurrency,
// and reports request and token throughput and TTFT / TPOT / ITL / end-to-end latency
// percentiles, as a table and as JSON; with a server that speculates, the acceptance rate and
// accept length of the run, from the server's /metrics before and after.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/http_client.h"

namespace polychip::cli {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string base_url = "http://127.0.0.1:30000";
  std::string backend = "openai";
  std::string model;
  int num_prompts = 64;
  int max_concurrency = 0;  // 0: num_prompts
  double request_rate = std::numeric_limits<double>::infinity();
  int random_input_len = 128;
  int random_output_len = 128;
  int shared_prefix_len = 0;
  uint64_t seed = 1;
  std::string output_json;
  std::string api_key;
};

struct Result {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0;
  int output_tokens = 0;
  double ttft = 0, e2e = 0;
  std::vector<double> itl;
};

// Words that are one token each in common BPE vocabularies (with their leading space), so that
// N words make a prompt of about N tokens on any server.
const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "day", "man",
    "world", "life", "water", "house", "city", "work", "hand", "part", "place", "case", "week",
    "system", "number", "night", "point", "home", "room", "car", "story", "tree", "road", "book"};

std::string RandomText(std::mt19937_64& rng, int n_words) {
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  for (int i = 0; i < n_words; ++i) {
    if (!s.empty()) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - lo);
}
double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// Speculative decoding's counters, as a server's /metrics gives them.
struct SpecCounters {
  double verify_steps = 0;   // sequence steps that verified drafts
  double draft_tokens = 0;
  double accepted_tokens = 0;
};

// polychip's own series, else vLLM's (a vLLM server), each summed over its label sets; nullopt
// when the server exposes neither: it does not speculate, or serves no /metrics.
std::optional<SpecCounters> ReadSpecCounters(const BenchOptions& o, const std::string& host,
                                             int port) {
  HttpCall call;
  call.host = host;
  call.port = port;
  call.method = "GET";
  call.target = "/metrics";
  call.read_timeout_s = 30;
  if (!o.api_key.empty()) call.headers.emplace_back("Authorization", "Bearer " + o.api_key);
  std::string text;
  const HttpReply res = SendHttp(call, [&](std::string_view piece) {
    text.append(piece);
    return true;
  });
  if (!res.error.empty() || res.status != 200) return std::nullopt;
  // name -> the sum of its samples; "name{labels} value" or "name value".
  std::map<std::string, double> sums;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.empty() || line.front() == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string_view::npos || value_at == std::string_view::npos) continue;
    sums[std::string(line.substr(0, name_end))] +=
        std::strtod(std::string(line.substr(value_at + 1)).c_str(), nullptr);
  }
  auto read = [&](const char* steps, const char* drafts, const char* accepted)
      -> std::optional<SpecCounters> {
    if (!sums.count(steps) || !sums.count(drafts) || !sums.count(accepted)) return std::nullopt;
    return SpecCounters{sums[steps], sums[drafts], sums[accepted]};
  };
  if (auto c = read("polychip_spec_verify_steps_total", "polychip_spec_draft_tokens_total",
                    "polychip_spec_accepted_tokens_total")) {
    return c;
  }
  return read("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
              "vllm:spec_decode_num_accepted_tokens_total");
}

Result RunOne(const BenchOptions& o, const std::string& host, int port, const std::string& prompt) {
  Result r;
  json body;
  std::string path;
  if (o.backend == "llamacpp") {  // llama-server's native endpoint
    path = "/completion";
    body = {{"prompt", prompt}, {"n_predict", o.random_output_len}, {"temperature", 0},
            {"ignore_eos", true}, {"stream", true}};
  } else if (o.backend == "sglang") {
    path = "/generate";
    body = {{"text", prompt}, {"stream", true},
            {"sampling_params", {{"max_new_tokens", o.random_output_len}, {"temperature", 0},
                                 {"ignore_eos", true}}}};
  } else if (o.backend == "anthropic") {
    path = "/v1/messages";
    body = {{"messages", {{{"role", "user"}, {"content", prompt}}}},
            {"max_tokens", o.random_output_len}, {"temperature", 0}, {"ignore_eos", true},
            {"stream", true}};
    if (!o.model.empty()) body["model"] = o.model;
  } else if (o.backend == "responses") {
    path = "/v1/responses";
    body = {{"input", prompt}, {"max_output_tokens", o.random_output_len}, {"temperature", 0},
            {"ignore_eos", true}, {"stream", true}, {"store", false}};
    if (!o.model.empty()) body["model"] = o.model;
  } else {
    path = "/v1/completions";
    body = {{"prompt", prompt}, {"max_tokens", o.random_output_len}, {"temperature", 0},
            {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    if (!o.model.empty()) body["model"] = o.model;
  }
  HttpCall call;
  call.host = host;
  call.port = port;
  call.target = path;
  call.body = body.dump();
  call.headers.emplace_back("Content-Type", "application/json");
  if (!o.api_key.empty()) {
    call.headers.emplace_back(o.backend == "anthropic" ? "x-api-key" : "Authorization",
                              o.backend == "anthropic" ? o.api_key : "Bearer " + o.api_key);
  }
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  int chunks_with_text = 0;
  int usage_tokens = -1;
  std::string buffer;
  size_t prev_len = 0;
  const auto on_body = [&](std::string_view data) {
    buffer.append(data);
    size_t pos;
    while ((pos = buffer.find("\n\n")) != std::string::npos) {
      std::string event = buffer.substr(0, pos);
      buffer.erase(0, pos + 2);
      // Anthropic and Responses name their events ("event: ...") before the data line.
      const size_t data = event.rfind("data: ", 0) == 0 ? 0 : event.find("\ndata: ");
      if (data == std::string::npos) continue;
      std::string payload = event.substr(data == 0 ? 6 : data + 7);
      if (payload == "[DONE]") continue;
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error") || j.value("type", "") == "error") {
        r.error = j.contains("error") ? j["error"].dump() : j.dump();
        continue;
      }
      std::string text;
      if (o.backend == "anthropic") {
        const std::string type = j.value("type", "");
        if (type == "content_block_delta") text = j["delta"].value("text", "");
        if (type == "message_start") {
          r.prompt_tokens = j["message"]["usage"].value("input_tokens", r.prompt_tokens);
        }
        if (type == "message_delta") {
          usage_tokens = j["usage"].value("output_tokens", usage_tokens);
        }
      } else if (o.backend == "responses") {
        const std::string type = j.value("type", "");
        if (type == "response.output_text.delta") text = j.value("delta", "");
        if (type == "response.completed" || type == "response.incomplete") {
          usage_tokens = j["response"]["usage"].value("output_tokens", usage_tokens);
          r.prompt_tokens = j["response"]["usage"].value("input_tokens", r.prompt_tokens);
        }
      } else if (o.backend == "llamacpp") {
        text = j.value("content", "");
        if (j.value("stop", false)) {
          usage_tokens = j.value("tokens_predicted", usage_tokens);
          r.prompt_tokens = j.value("tokens_evaluated", r.prompt_tokens);
        }
      } else if (o.backend == "sglang") {
        const std::string full = j.value("text", "");
        text = full.size() > prev_len ? full.substr(prev_len) : "";
        prev_len = full.size();
        if (j.contains("meta_info")) {
          usage_tokens = j["meta_info"].value("completion_tokens", usage_tokens);
          r.prompt_tokens = j["meta_info"].value("prompt_tokens", r.prompt_tokens);
        }
      } else {
        if (j.contains("usage") && j["usage"].is_object()) {
          usage_tokens = j["usage"].value("completion_tokens", usage_tokens);
          r.prompt_tokens = j["usage"].value("prompt_tokens", r.prompt_tokens);
        }
        if (j.contains("choices") && !j["choices"].empty()) text = j["choices"][0].value("text", "");
      }
      if (text.empty()) continue;
      const auto now = Clock::now();
      if (first) {
        r.ttft = std::chrono::duration<double>(now - start).count();
        first = false;
      } else {
        r.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
      ++chunks_with_text;
    }
    return true;
  };
  const HttpReply res = SendHttp(call, on_body);
  r.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  if (!res.error.empty()) {
    r.error = "transport error: " + res.error;
    return r;
  }
  // What arrived; a failed stream keeps this count, a completed one takes the server's usage.
  r.output_tokens = chunks_with_text;
  if (res.status != 200) {
    r.error = fmt::format("HTTP {}: {}", res.status, res.body.substr(0, 200));
    return r;
  }
  r.ok = r.error.empty() && !first;
  if (r.ok && usage_tokens >= 0) r.output_tokens = usage_tokens;
  if (first && r.error.empty()) r.error = "no tokens received";
  return r;
}

int Bench(const BenchOptions& o) {
  std::smatch m;
  const std::string url = o.base_url;
  if (!std::regex_match(url, m, std::regex(R"(http://([^:/]+)(?::(\d+))?/?)"))) {
    std::fprintf(stderr, "error: --base-url must look like http://HOST:PORT\n");
    return 2;
  }
  const std::string host = m[1];
  const int port = m[2].matched ? std::stoi(m[2]) : 80;
  if (o.backend != "openai" && o.backend != "sglang" && o.backend != "llamacpp" &&
      o.backend != "anthropic" && o.backend != "responses") {
    std::fprintf(stderr,
                 "error: --backend must be openai, sglang, llamacpp, anthropic or responses\n");
    return 2;
  }
  // Prompts: a shared prefix (a system prompt) then random words.
  std::mt19937_64 rng(o.seed);
  const std::string prefix = o.shared_prefix_len > 0 ? RandomText(rng, o.shared_prefix_len) + " " : "";
  std::vector<std::string> prompts;
  for (int i = 0; i < o.num_prompts; ++i) {
    prompts.push_back(prefix + RandomText(rng, std::max(1, o.random_input_len - o.shared_prefix_len)));
  }
  // Poisson arrivals at --request-rate (all at once when infinite).
  std::vector<double> arrival(o.num_prompts, 0.0);
  if (std::isfinite(o.request_rate) && o.request_rate > 0) {
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (auto& a : arrival) {
      a = t;
      t += gap(rng);
    }
  }
  const int workers = std::max(1, std::min(o.max_concurrency > 0 ? o.max_concurrency : o.num_prompts,
                                           o.num_prompts));
  // The server's counters are cumulative: the run's share is the difference (which includes any
  // other traffic the server had meanwhile).
  const std::optional<SpecCounters> spec_before = ReadSpecCounters(o, host, port);
  std::vector<Result> results(o.num_prompts);
  std::atomic<int> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < o.num_prompts;) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(arrival[i])));
        results[i] = RunOne(o, host, port, prompts[i]);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::optional<SpecCounters> spec_after =
      spec_before ? ReadSpecCounters(o, host, port) : std::nullopt;

  std::vector<double> ttft, tpot, itl, e2e;
  // out_tokens counts completed requests only (as sglang.bench_serving does); streamed_tokens
  // adds what failed streams delivered before their error, so a server that fails requests
  // late is not credited with the time it saved.
  int64_t completed = 0, in_tokens = 0, out_tokens = 0, streamed_tokens = 0;
  std::vector<std::string> errors;
  for (const auto& r : results) {
    streamed_tokens += r.output_tokens;
    if (!r.ok) {
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++completed;
    in_tokens += r.prompt_tokens;
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft * 1000);
    e2e.push_back(r.e2e * 1000);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) * 1000 / (r.output_tokens - 1));
    for (double x : r.itl) itl.push_back(x * 1000);
  }
  json out = {{"backend", o.backend}, {"base_url", o.base_url}, {"num_prompts", o.num_prompts},
              {"max_concurrency", workers}, {"request_rate", std::isfinite(o.request_rate) ? json(o.request_rate) : json("inf")},
              {"random_input_len", o.random_input_len}, {"random_output_len", o.random_output_len},
              {"shared_prefix_len", o.shared_prefix_len},
              {"completed", completed}, {"failed", o.num_prompts - completed},
              {"duration_s", duration},
              {"total_input_tokens", in_tokens}, {"total_output_tokens", out_tokens},
              {"request_throughput", completed / duration},
              {"input_token_throughput", in_tokens / duration},
              {"output_token_throughput", out_tokens / duration},
              {"total_streamed_tokens", streamed_tokens},
              {"streamed_token_throughput", streamed_tokens / duration}};
  auto stats = [&](const char* name, const std::vector<double>& v) {
    out[std::string("mean_") + name + "_ms"] = Mean(v);
    for (int p : {50, 90, 99}) out[fmt::format("p{}_{}_ms", p, name)] = Percentile(v, p);
  };
  stats("ttft", ttft);
  stats("tpot", tpot);
  stats("itl", itl);
  stats("e2e", e2e);
  if (!errors.empty()) out["errors"] = errors;
  if (spec_after) {
    // Acceptance: accepted / drafted; accept length: tokens a verification step yields, the
    // accepted drafts plus the target's own token (SGLang's "accept length", vLLM's "mean
    // acceptance length").
    const double steps = spec_after->verify_steps - spec_before->verify_steps;
    const double drafts = spec_after->draft_tokens - spec_before->draft_tokens;
    const double accepted = spec_after->accepted_tokens - spec_before->accepted_tokens;
    out["spec_verify_steps"] = steps;
    out["spec_draft_tokens"] = drafts;
    out["spec_accepted_tokens"] = accepted;
    out["spec_acceptance_rate"] = drafts > 0 ? accepted / drafts : 0.0;
    out["spec_accept_length"] = steps > 0 ? (accepted + steps) / steps : 0.0;
  }

  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-36s %s\n", "Backend:", o.backend.c_str());
  std::printf("%-36s %d / %d\n", "Successful / total requests:", static_cast<int>(completed), o.num_prompts);
  std::printf("%-36s %d\n", "Max concurrency:", workers);
  std::printf("%-36s %.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-36s %lld\n", "Total input tokens:", static_cast<long long>(in_tokens));
  std::printf("%-36s %lld\n", "Total generated tokens:", static_cast<long long>(out_tokens));
  std::printf("%-36s %.2f\n", "Request throughput (req/s):", completed / duration);
  std::printf("%-36s %.2f\n", "Input token throughput (tok/s):", in_tokens / duration);
  std::printf("%-36s %.2f\n", "Output token throughput (tok/s):", out_tokens / duration);
  if (streamed_tokens != out_tokens) {
    std::printf("%-36s %.2f\n", "Streamed incl. failed (tok/s):", streamed_tokens / duration);
  }
  for (const char* name : {"ttft", "tpot", "itl", "e2e"}) {
    std::printf("%-10s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f (ms)\n", name,
                out[std::string("mean_") + name + "_ms"].get<double>(),
                out[fmt::format("p50_{}_ms", name)].get<double>(),
                out[fmt::format("p90_{}_ms", name)].get<double>(),
                out[fmt::format("p99_{}_ms", name)].get<double>());
  }
  if (spec_after) {
    std::printf("%-36s %.0f / %.0f (%.3f)\n", "Spec. accepted / draft tokens:",
                out["spec_accepted_tokens"].get<double>(), out["spec_draft_tokens"].get<double>(),
                out["spec_acceptance_rate"].get<double>());
    std::printf("%-36s %.2f\n", "Spec. accept length (tok/step):",
                out["spec_accept_length"].get<double>());
  }
  for (const auto& e : errors) std::printf("error: %s\n", e.c_str());
  std::printf("==================================================\n");
  std::printf("%s\n", out.dump().c_str());
  if (!o.output_json.empty()) {
    if (FILE* f = std::fopen(o.output_json.c_str(), "w")) {
      std::fprintf(f, "%s\n", out.dump(2).c_str());
      std::fclose(f);
    }
  }
  return completed == o.num_prompts ? 0 : 1;
}

std::function<int()> SetupBenchServing(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<BenchOptions>();
  app.add_option("--base-url", o->base_url, "server, http://HOST:PORT");
  app.add_option("--backend", o->backend,
                 "openai (/v1/completions), sglang (/generate), llamacpp (llama-server's "
                 "/completion), anthropic (/v1/messages) or responses (/v1/responses)");
  app.add_option("--model", o->model, "model name sent with the requests (but /generate's)");
  app.add_option("--num-prompts", o->num_prompts, "requests to send");
  app.add_option("--max-concurrency", o->max_concurrency, "requests in flight at most (0: all)");
  app.add_option("--request-rate", o->request_rate, "requests per second (Poisson; inf: all at once)");
  app.add_option("--random-input-len", o->random_input_len, "prompt length in tokens (about)");
  app.add_option("--random-output-len", o->random_output_len, "tokens to generate");
  app.add_option("--shared-prefix-len", o->shared_prefix_len, "tokens of prompt prefix shared by all");
  app.add_option("--seed", o->seed, "random seed");
  app.add_option("--output-json", o->output_json, "also write the JSON result here");
  app.add_option("--api-key", o->api_key, "Bearer token");
  return [o] { return Bench(*o); };
}

const bool kRegistered = RegisterCommand(
    {"bench-serving", "load-test an OpenAI/SGLang-compatible server", SetupBenchServing});

}  // namespace
}  // namespace polychip::cli
