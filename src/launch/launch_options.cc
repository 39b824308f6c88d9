#include "launch/launch_options.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "engine/engine.h"
#include "model/lora.h"
#include "runtime/dtype.h"
#include "server/tool_format.h"

namespace polychip::launch {
namespace {

using Kind = Option::Kind;

std::string Underscored(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}
std::string Dashed(std::string_view name) {
  std::string s(name);
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

StatusOr<int64_t> ParseInt(const std::string& v, int64_t lo, int64_t hi) {
  auto range = [&] {
    return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not '" + v +
           "'";
  };
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size() && x >= lo && x <= hi) return static_cast<int64_t>(x);
  } catch (const std::exception&) {
  }
  return InvalidArgument("expected " + range());
}

StatusOr<double> ParseNumber(const std::string& v, double lo, double hi) {
  try {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size() && std::isfinite(x) && x >= lo && x <= hi) return x;
  } catch (const std::exception&) {
  }
  std::ostringstream out;
  out << "expected a number in [" << lo << ", " << hi << "], not '" << v << "'";
  return InvalidArgument(out.str());
}

StatusOr<bool> ParseSwitch(const std::string& v) {
  std::string l = v;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "true" || l == "1" || l == "yes" || l == "on") return true;
  if (l == "false" || l == "0" || l == "no" || l == "off") return false;
  return InvalidArgument("expected true or false, not '" + v + "'");
}

std::string Number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Row builders. `get`/`put` reach the field (some are nested: http_limits, dist).
template <typename Get, typename Put>
Option Int(std::string name, std::vector<std::string> aliases, std::string help, uint32_t scope,
           Get get, Put put, int64_t lo, int64_t hi, bool zero_is_auto = false) {
  Option o{std::move(name), std::move(aliases), std::move(help), Kind::kInt, scope, {}, {}};
  o.set = [put, lo, hi, zero_is_auto](LaunchSpec& s, const std::string& v) -> Status {
    if (zero_is_auto && v == "auto") {
      put(s, 0);
      return Status::Ok();
    }
    PC_ASSIGN_OR_RETURN(int64_t x, ParseInt(v, zero_is_auto ? std::min<int64_t>(lo, 0) : lo, hi));
    put(s, x);
    return Status::Ok();
  };
  o.get = [get, zero_is_auto](const LaunchSpec& s) {
    const int64_t v = get(s);
    return zero_is_auto && v == 0 ? std::string("auto") : std::to_string(v);
  };
  return o;
}

template <typename Get, typename Put>
Option Num(std::string name, std::vector<std::string> aliases, std::string help, uint32_t scope,
           Get get, Put put, double lo, double hi) {
  Option o{std::move(name), std::move(aliases), std::move(help), Kind::kNumber, scope, {}, {}};
  o.set = [put, lo, hi](LaunchSpec& s, const std::string& v) -> Status {
    PC_ASSIGN_OR_RETURN(double x, ParseNumber(v, lo, hi));
    put(s, x);
    return Status::Ok();
  };
  o.get = [get](const LaunchSpec& s) { return Number(get(s)); };
  return o;
}

// `allowed` empty: any text.
template <typename Get, typename Put>
Option Text(std::string name, std::vector<std::string> aliases, std::string help, uint32_t scope,
            Get get, Put put, std::vector<std::string> allowed = {}) {
  Option o{std::move(name), std::move(aliases), std::move(help), Kind::kText, scope, {}, {}};
  o.set = [put, allowed](LaunchSpec& s, const std::string& v) -> Status {
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string list;
      for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return InvalidArgument("expected one of " + list + ", not '" + v + "'");
    }
    put(s, v);
    return Status::Ok();
  };
  o.get = get;
  return o;
}

template <typename Get, typename Put>
Option Switch(std::string name, std::vector<std::string> aliases, std::string help, uint32_t scope,
              Get get, Put put) {
  Option o{std::move(name), std::move(aliases), std::move(help), Kind::kSwitch, scope, {}, {}};
  o.set = [put](LaunchSpec& s, const std::string& v) -> Status {
    PC_ASSIGN_OR_RETURN(bool x, ParseSwitch(v));
    put(s, x);
    return Status::Ok();
  };
  o.get = [get](const LaunchSpec& s) { return std::string(get(s) ? "true" : "false"); };
  return o;
}

#define PC_FIELD(f) [](const LaunchSpec& s) { return s.f; }, [](LaunchSpec& s, auto v) { s.f = v; }

constexpr uint32_t kServe = kScopeServe;
constexpr uint32_t kModel = kScopeModel | kScopeServe;
constexpr uint32_t kParallel = kScopeParallel | kScopeServe;
constexpr int64_t kMaxInt = 1 << 30;

std::vector<Option> MakeOptions() {
  std::vector<Option> t;
  // Where the model runs (every command that loads one).
  t.push_back(
      Text("model-path", {"-m", "--model"}, "GGUF model file", kModel, PC_FIELD(model_path)));
  t.push_back(Int("threads", {"-t"}, "cpu plugin threads (auto: one per core)", kModel,
                  PC_FIELD(threads), 1, 4096, /*zero_is_auto=*/true));
  {
    Option o{"lora",
             {"--lora-modules"},
             "a LoRA adapter NAME=PATH[:SCALE] (GGUF; repeat for more): serve serves it as model "
             "NAME; run and perplexity apply the first to every sequence, bench sequence s the "
             "(s mod count)-th",
             Kind::kText,
             kModel,
             {},
             {}};
    o.repeated = true;
    o.set = [](LaunchSpec& s, const std::string& v) -> Status {
      PC_RETURN_IF_ERROR(model::ParseLoraSpec(v).status());
      s.lora.push_back(v);
      return Status::Ok();
    };
    o.get = [](const LaunchSpec& s) {
      if (s.lora.empty()) return std::string("[]");
      std::string list;
      for (const std::string& l : s.lora) {
        std::string q = "\"";
        for (char c : l) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
        list += (list.empty() ? "" : ", ") + q + "\"";
      }
      return "[" + list + "]";
    };
    t.push_back(std::move(o));
  }
  t.push_back(Int("max-loras-per-batch", {"--max-loras"},
                  "LoRA adapters resident on the device, the most one step uses (others are "
                  "loaded on demand, the least recently used out)",
                  kModel, PC_FIELD(max_loras_per_batch), 1, 1024));
  {
    // auto is f16 (as llama.cpp's default), fp8 is fp8_e4m3 (as vLLM's).
    const std::vector<std::string> kv_types = {"auto", "f16",  "bf16",     "f32",
                                               "q8_0", "q4_0", "fp8_e4m3", "fp8"};
    auto canonical = [](std::string v) {
      return v == "auto" ? std::string("f16") : v == "fp8" ? std::string("fp8_e4m3") : v;
    };
    Option o = Text("kv-cache-dtype", {"--kv-type"},
                    "KV cache element type of K and V: f16, bf16, f32, q8_0, q4_0, fp8_e4m3 "
                    "(fp8), or auto (f16)",
                    kModel, PC_FIELD(kv_cache_dtype), kv_types);
    Option k = Text("kv-cache-dtype-k", {"--cache-type-k"},
                    "K's KV cache type (as --kv-cache-dtype; default: --kv-cache-dtype)", kModel,
                    PC_FIELD(kv_cache_dtype_k), kv_types);
    Option v = Text("kv-cache-dtype-v", {"--cache-type-v"},
                    "V's KV cache type (as --kv-cache-dtype; default: --kv-cache-dtype)", kModel,
                    PC_FIELD(kv_cache_dtype_v), kv_types);
    for (const auto& row : {std::pair{&o, &LaunchSpec::kv_cache_dtype},
                            {&k, &LaunchSpec::kv_cache_dtype_k},
                            {&v, &LaunchSpec::kv_cache_dtype_v}}) {
      Option* option = row.first;
      auto set = option->set;
      option->set = [set, canonical, member = row.second](LaunchSpec& s, const std::string& value) {
        // K's or V's left empty (how --print-config writes the default): --kv-cache-dtype's.
        if (value.empty() && member != &LaunchSpec::kv_cache_dtype) {
          s.*member = "";
          return Status::Ok();
        }
        PC_RETURN_IF_ERROR(set(s, value));
        s.*member = canonical(value);
        return Status::Ok();
      };
      t.push_back(std::move(*option));
    }
  }
  t.push_back(Text("log-level", {}, "trace, debug, info, warn, error, critical or off", kModel,
                   PC_FIELD(log_level),
                   {"trace", "debug", "info", "warn", "warning", "error", "critical", "off"}));

  // Ranks (dist/parallel.h).
  t.push_back(Int("tp-size", {"--tp", "--tensor-parallel-size"},
                  "tensor-parallel ranks, one process each (--device emu:0,1: a device per rank)",
                  kParallel, PC_FIELD(tp_size), 1, 64));
  t.push_back(Int("pp-size", {"--pp", "--pipeline-parallel-size"},
                  "pipeline stages (layers split), one process per rank; ranks = tp x pp",
                  kParallel, PC_FIELD(pp_size), 1, 64));
  t.push_back(Int("nnodes", {}, "hosts (nodes) of the job; each lists its own --device", kParallel,
                  PC_FIELD(dist.nnodes), 1, 1024));
  t.push_back(Int("node-rank", {}, "this node's index, 0..nnodes-1 (0 serves)", kParallel,
                  PC_FIELD(dist.node_rank), 0, 1023));
  t.push_back(Text("dist-init-addr", {}, "HOST:PORT where node 0 serves the job's bootstrap store",
                   kParallel, PC_FIELD(dist.dist_init_addr)));
  {
    Option o = Text("dist-token", {},
                    "secret shared by every node of the job (default: env POLYCHIP_DIST_TOKEN)",
                    kParallel, PC_FIELD(dist.dist_token));
    o.secret = true;
    t.push_back(std::move(o));
  }
  t.push_back(Num(
      "dist-timeout", {}, "seconds to wait for every node and rank at start-up", kParallel,
      [](const LaunchSpec& s) { return s.dist.dist_timeout_ms / 1000.0; },
      [](LaunchSpec& s, double v) { s.dist.dist_timeout_ms = int64_t(v * 1000); }, 0, 86400));
  t.push_back(Text("comm-tp", {}, "comm plugin of the tensor-parallel groups (pins it)", kParallel,
                   PC_FIELD(dist.comm_tp)));
  t.push_back(Text("comm-pp", {}, "comm plugin of the pipeline groups (pins it)", kParallel,
                   PC_FIELD(dist.comm_pp)));
  t.push_back(Text("comm-world", {}, "comm plugin of the world (step broadcast, logits) (pins it)",
                   kParallel, PC_FIELD(dist.comm_world)));

  // The KV cache and the scheduler.
  t.push_back(Int("context-length", {"--max-model-len"},
                  "max tokens per sequence (auto: the model's trained context, bounded by what "
                  "the KV cache holds)",
                  kServe, PC_FIELD(context_length), 1, kMaxInt, true));
  t.push_back(Int("max-total-tokens", {}, "KV cache size in tokens (auto: from the KV budget)",
                  kServe, PC_FIELD(max_total_tokens), 1, int64_t(1) << 40, true));
  {
    Option o = Num("mem-fraction-static", {"--gpu-memory-utilization"},
                   "share of the device's free memory, less weights and comm buffers, for the KV "
                   "cache (auto: 0.85 on a device with its own memory, 0.25 on host memory)",
                   kServe, PC_FIELD(mem_fraction_static), 0.0, 1.0);
    auto set = o.set;
    o.set = [set](LaunchSpec& s, const std::string& v) -> Status {
      if (v == "auto") {
        s.mem_fraction_static = LaunchSpec::kAuto;
        return Status::Ok();
      }
      return set(s, v);
    };
    o.get = [](const LaunchSpec& s) {
      return s.mem_fraction_static < 0 ? std::string("auto") : Number(s.mem_fraction_static);
    };
    t.push_back(std::move(o));
  }
  t.push_back(Int("page-size", {"--block-size"}, "tokens per KV block", kServe, PC_FIELD(page_size),
                  1, 4096));
  t.push_back(Num("swa-full-tokens-ratio", {},
                  "sliding-window layers (gemma3): their KV pool's size as a fraction of the full "
                  "layers' tokens; blocks a sequence has moved a window past are released (0: "
                  "those layers keep every block)",
                  kServe, PC_FIELD(swa_full_tokens_ratio), 0.0, 1.0));
  t.push_back(Int("max-running-requests", {"--max-num-seqs"}, "running batch size limit", kServe,
                  PC_FIELD(max_running_requests), 1, 1 << 20));
  t.push_back(Int("max-queued-requests", {}, "waiting requests beyond which new ones get 503",
                  kServe, PC_FIELD(max_queued_requests), 0, 1 << 24));
  t.push_back(Int("chunked-prefill-size", {}, "prompt tokens per step (0 or -1: unlimited)", kServe,
                  PC_FIELD(chunked_prefill_size), -1, kMaxInt));
  t.push_back(Num("max-itl-ms", {},
                  "inter-token latency target: while streams decode, each step's prompt tokens are "
                  "sized from the learned step costs to keep it (0: off; --chunked-prefill-size "
                  "stays the ceiling)",
                  kServe, PC_FIELD(max_itl_ms), 0.0, 1e9));
  t.push_back(
      Switch("disable-radix-cache", {}, "no prefix cache", kServe, PC_FIELD(disable_radix_cache)));
  t.push_back(Text("schedule-policy", {}, "fcfs, lpm or priority", kServe,
                   PC_FIELD(schedule_policy), {"fcfs", "lpm", "priority"}));

  // Speculative decoding (docs/speculative-decoding.md).
  t.push_back(Text("speculative-algorithm", {},
                   "speculative decoding: draft (a draft model), ngram (prompt lookup), none, or "
                   "auto (draft when a draft model is given)",
                   kModel, PC_FIELD(speculative_algorithm), {"auto", "none", "draft", "ngram"}));
  t.push_back(Text("speculative-draft-model", {"--model-draft"},
                   "the draft model: a GGUF sharing the model's vocabulary (any architecture)",
                   kModel, PC_FIELD(speculative_draft_model)));
  t.push_back(Text("speculative-draft-device", {"--device-draft"},
                   "the draft model's device, backend:i (e.g. cpu:0 while the model runs on "
                   "emu:0); default: the model's backend",
                   kModel, PC_FIELD(speculative_draft_device)));
  t.push_back(Int("speculative-num-draft-tokens", {"--draft-max"},
                  "draft tokens proposed per sequence and step, at most", kModel,
                  PC_FIELD(speculative_num_draft_tokens), 1, 64));
  t.push_back(Switch("speculative-adaptive", {},
                     "each sequence's draft length follows its acceptance (up to "
                     "--speculative-num-draft-tokens)",
                     kModel, PC_FIELD(speculative_adaptive)));
  t.push_back(Int("speculative-disable-batch-size", {"--speculative-disable-by-batch-size"},
                  "steps with more decoding sequences than this run without speculation (the "
                  "batch already keeps the device busy)",
                  kModel, PC_FIELD(speculative_disable_batch_size), 0, 1 << 20));
  t.push_back(Int("speculative-ngram-max", {},
                  "ngram: the longest suffix of the sequence looked up in its own tokens", kModel,
                  PC_FIELD(speculative_ngram_max), 1, 64));

  // The HTTP server.
  t.push_back(Text("served-model-name", {}, "name reported by /v1/models (default: the file name)",
                   kServe, PC_FIELD(served_model_name)));
  t.push_back(Text("host", {}, "address to bind (0.0.0.0 in a container)", kServe, PC_FIELD(host)));
  t.push_back(Int("port", {}, "port (0: any free port)", kServe, PC_FIELD(port), 0, 65535));
  {
    Option o = Text("api-key", {}, "require 'Authorization: Bearer KEY' (every route but /health)",
                    kServe, PC_FIELD(api_key));
    o.secret = true;
    t.push_back(std::move(o));
    Option a = Text("admin-key", {},
                    "key of the admin routes (POST /admin/reload_plugin); default: --api-key; "
                    "with neither, they are refused",
                    kServe, PC_FIELD(admin_key));
    a.secret = true;
    t.push_back(std::move(a));
  }
  t.push_back(Text("chat-template", {},
                   "a built-in chat format instead of the model's own template (chatml, qwen3, "
                   "llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, phi3, gemma, "
                   "zephyr); unset: the model's tokenizer.chat_template",
                   kServe, PC_FIELD(chat_template)));
  t.push_back(Text("chat-template-file", {},
                   "a Jinja chat template file instead of the model's own", kServe,
                   PC_FIELD(chat_template_file)));
  t.push_back(Text("chat-template-kwargs", {},
                   "extra template variables for every chat, as a JSON object (a request's "
                   "chat_template_kwargs override them), e.g. '{\"enable_thinking\": false}'",
                   kServe, PC_FIELD(chat_template_kwargs)));
  {
    Option o = Text("reasoning-parser", {},
                     "auto (the chat template's), none, think, gpt-oss, mistral, command-r7b or "
                     "seed",
                     kServe, PC_FIELD(reasoning_parser));
    o.set = [](LaunchSpec& s, const std::string& v) -> Status {
      if (v != "auto" && !server::ReasoningFormatFromName(v)) {
        return InvalidArgument("unknown reasoning parser '" + v +
                               "' (auto, none, think, gpt-oss, mistral, command-r7b or seed)");
      }
      s.reasoning_parser = v;
      return Status::Ok();
    };
    t.push_back(std::move(o));
  }
  t.push_back(Int("http-threads", {},
                  "HTTP worker threads: requests being handled at once (connections waiting for "
                  "a request hold none)",
                  kServe, PC_FIELD(http_threads), 1, 65536));
  t.push_back(Int("max-connections-per-client", {},
                  "open connections one client address may hold; more are answered 503 (0: no "
                  "cap; raise it behind a proxy)",
                  kServe, PC_FIELD(http_limits.max_connections_per_client), 0, kMaxInt));
  t.push_back(Num("request-head-timeout", {},
                  "seconds a client has to send a request's head, from its first byte (or the "
                  "connection); slower ones are closed",
                  kServe, PC_FIELD(http_limits.head_timeout_s), 1e-3, 1e6));
  t.push_back(Num("keep-alive-timeout", {}, "seconds an idle keep-alive connection is kept", kServe,
                  PC_FIELD(http_limits.keep_alive_timeout_s), 1e-3, 1e6));
  t.push_back(Num("request-body-timeout", {},
                  "seconds a client has to send a request's body after its head", kServe,
                  PC_FIELD(http_limits.body_timeout_s), 1e-3, 1e6));
  t.push_back(Num("write-timeout", {},
                  "seconds one write of a response may wait on a client that does not read; the "
                  "connection is closed after",
                  kServe, PC_FIELD(http_limits.write_timeout_s), 1e-3, 1e6));
  t.push_back(Int("max-request-body", {},
                  "largest request body in bytes, Content-Length or chunked; larger ones get 413",
                  kServe, PC_FIELD(http_limits.max_body_bytes), 1, int64_t(1) << 40));
  t.push_back(Text("pooling", {},
                   "/v1/embeddings: last (the last token's final hidden state) or mean (over the "
                   "input's tokens); L2-normalised",
                   kServe, PC_FIELD(pooling), {"last", "mean"}));
  t.push_back(Num("shutdown-timeout", {},
                  "on SIGTERM/SIGINT, seconds running requests may take to finish before they are "
                  "cancelled",
                  kServe, PC_FIELD(shutdown_timeout), 0.0, 1e6));
  t.push_back(Switch("enable-metrics", {}, "serve /metrics (Prometheus text)", kServe,
                     PC_FIELD(enable_metrics)));
  t.push_back(Switch("vllm-metrics", {},
                     "also export vLLM's metric names (vllm:num_requests_running, ...) for "
                     "dashboards and routers (docs/metrics.md)",
                     kServe, PC_FIELD(vllm_metrics)));
  return t;
}

#undef PC_FIELD

// The runtime's part of the file (runtime/config.h): its keys and, for its sections, their keys.
const std::map<std::string, std::vector<std::string>>& RuntimeKeys() {
  static const auto* keys = new std::map<std::string, std::vector<std::string>>{
      {"plugin_path", {}},
      {"backend", {"name", "path", "params"}},
      {"comm", {"name", "path", "params", "world", "tp", "pp"}},
      {"devices", {}},
      {"op_fallback", {}},
      {"memory", {"arena_mb"}},
  };
  return *keys;
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> KnownKeys() {
  std::vector<std::string> keys;
  for (const Option& o : Options()) keys.push_back(Underscored(o.name));
  for (const auto& [k, _] : RuntimeKeys()) keys.push_back(k);
  keys.push_back("device");
  keys.push_back("serve");
  return keys;
}

Status UnknownKey(const std::string& where, const std::string& key,
                  const std::vector<std::string>& known) {
  const std::string near = Nearest(key, known);
  return InvalidArgument(where + ": unknown key '" + key + "'" +
                         (near.empty() ? "" : " (did you mean '" + near + "'?)"));
}

// The runtime sections' own keys are checked here too, so a typo there is not dropped either.
Status CheckRuntimeSection(const std::string& where, const std::string& key,
                           const YAML::Node& node) {
  const std::vector<std::string>& inner = RuntimeKeys().at(key);
  if (inner.empty() || !node.IsMap()) return Status::Ok();
  for (const auto& kv : node) {
    const std::string k = kv.first.as<std::string>();
    if (std::find(inner.begin(), inner.end(), k) != inner.end()) {
      if (key == "comm" && (k == "world" || k == "tp" || k == "pp") && kv.second.IsMap()) {
        for (const auto& g : kv.second) {
          const std::string gk = g.first.as<std::string>();
          if (gk != "name" && gk != "path" && gk != "params") {
            return UnknownKey(where + ": comm." + k, gk, {"name", "path", "params"});
          }
        }
      }
      continue;
    }
    return UnknownKey(where + ": " + key, k, inner);
  }
  return Status::Ok();
}

}  // namespace

const std::vector<Option>& Options() {
  static const auto* options = new std::vector<Option>(MakeOptions());
  return *options;
}

const Option* FindOption(std::string_view key) {
  const std::string dashed = Dashed(key);
  for (const Option& o : Options()) {
    if (o.name == dashed) return &o;
  }
  return nullptr;
}

std::string Nearest(std::string_view key, const std::vector<std::string>& candidates) {
  const std::string k = Underscored(key);
  std::string best;
  size_t best_d = std::max<size_t>(3, k.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(k, Underscored(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

Status ApplyConfigFile(const std::string& path, uint32_t scope,
                       const std::vector<std::string>& skip, LaunchSpec* spec, Sources* sources) {
  if (path.empty()) return Status::Ok();
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgument("cannot read config " + path + ": " + e.what());
  }
  if (!root || root.IsNull()) return Status::Ok();
  if (!root.IsMap()) return InvalidArgument(path + ": expected a map of keys at the top level");
  const std::vector<std::string> known = KnownKeys();
  // Launch keys from the top level and the serve: section, each key once.
  std::vector<std::pair<std::string, YAML::Node>> entries;
  std::set<std::string> seen;
  auto collect = [&](const YAML::Node& map, const std::string& where) -> Status {
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (where.empty() && key == "serve") continue;
      if (where.empty() && RuntimeKeys().count(key)) {
        PC_RETURN_IF_ERROR(CheckRuntimeSection(path, key, kv.second));
        continue;
      }
      if (key != "device" && FindOption(key) == nullptr) {
        return UnknownKey(path + where, key, known);
      }
      const std::string name = Dashed(key);
      if (!seen.insert(name).second) {
        return InvalidArgument(path + ": '" + key +
                               "' is given twice (the top level and the "
                               "serve: section are one set of keys)");
      }
      entries.emplace_back(name, kv.second);
    }
    return Status::Ok();
  };
  PC_RETURN_IF_ERROR(collect(root, ""));
  if (const YAML::Node serve = root["serve"]) {
    if (!serve.IsMap()) return InvalidArgument(path + ": serve: expected a map of keys");
    PC_RETURN_IF_ERROR(collect(serve, " (serve:)"));
  }
  for (const auto& [name, value] : entries) {
    const std::string where = path + ": " + Underscored(name);
    const Option* repeated = FindOption(name);
    if (repeated != nullptr && repeated->repeated && value.IsSequence()) {
      if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
      for (const auto& item : value) {
        if (!item.IsScalar()) return InvalidArgument(where + ": expected a list of values");
        if (Status s = repeated->set(*spec, item.as<std::string>()); !s.ok()) {
          return InvalidArgument(where + ": " + s.message());
        }
      }
      if (sources) (*sources)[name] = "config " + path;
      continue;
    }
    if (!value.IsScalar()) return InvalidArgument(where + ": expected a single value");
    const std::string text = value.as<std::string>();
    if (name == "device") {
      if (std::find(skip.begin(), skip.end(), name) == skip.end()) spec->device = text;
      continue;
    }
    const Option* o = FindOption(name);
    // Checked whatever the command, so a bad value is never waiting for the next one to trip.
    LaunchSpec scratch;
    if (Status s = o->set(scratch, text); !s.ok()) {
      return InvalidArgument(where + ": " + s.message());
    }
    if ((o->scope & scope) == 0) continue;
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    PC_RETURN_IF_ERROR(o->set(*spec, text));
    if (sources) (*sources)[name] = "config " + path;
  }
  return Status::Ok();
}

std::string PrintConfig(const LaunchSpec& spec, uint32_t scope, const Sources& sources) {
  std::ostringstream out;
  // `raw`: already YAML (a repeated option's flow list).
  auto line = [&](const std::string& key, const std::string& value, const std::string& source,
                  bool raw = false) {
    std::string v = value;
    // Quoted where YAML would read it as something else (empty, a colon, a leading symbol).
    if (!raw && (v.empty() || v.find_first_of(":#{}[],&*!|>'\"%@`") != std::string::npos)) {
      std::string q = "\"";
      for (char c : v) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      v = q + "\"";
    }
    std::string l = key + ": " + v;
    if (l.size() < 40) l.resize(40, ' ');
    out << l << "  # " << source << "\n";
  };
  auto source_of = [&](const std::string& name) {
    auto it = sources.find(name);
    return it == sources.end() ? std::string("default") : it->second;
  };
  line("device", spec.device, source_of("device"));
  for (const Option& o : Options()) {
    if ((o.scope & scope) == 0) continue;
    const std::string value = o.get(spec);
    line(Underscored(o.name), o.secret && !value.empty() ? "<set>" : value, source_of(o.name),
         o.repeated);
  }
  return out.str();
}

}  // namespace polychip::launch
