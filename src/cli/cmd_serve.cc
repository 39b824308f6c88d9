// `polychip serve`: the OpenAI- and SGLang-compatible HTTP server. Every flag may also come from
// the YAML file given with --config (top-level keys or a `serve:` section, spelled like the
// flag without dashes: `max-running-requests: 64` or `max_running_requests: 64`); the command
// line wins. SIGINT/SIGTERM stop accepting, give running requests --shutdown-timeout seconds to
// finish, cancel the rest (streams end with finish_reason "abort" and [DONE]) and exit 0.
#include <CLI/CLI.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "cli/command.h"
#include "cli/model_options.h"
#include "cli/serve_reload.h"
#include "engine/engine.h"
#include "dist/kv_budget.h"
#include "dist/parallel.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "server/http_server.h"
#include "server/text_codec.h"

namespace polychip::cli {
namespace {

struct ServeOptions {
  std::string model_path;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string admin_key;
  int64_t context_length = 0;
  int max_running_requests = 256;
  int max_queued_requests = 4096;
  double mem_fraction_static = 0;
  int64_t max_total_tokens = 0;
  int page_size = 16;
  double swa_full_tokens_ratio = 0.5;
  int chunked_prefill_size = 512;
  double max_itl_ms = 0;
  bool disable_radix_cache = false;
  std::string schedule_policy = "fcfs";
  int threads = 0;
  int tp_size = 1;
  int pp_size = 1;
  ChatTemplateFlags chat_template;
  std::string reasoning_parser = "auto";
  std::string kv_cache_dtype = "f16";
  int http_threads = 320;
  std::string pooling = "last";
  double shutdown_timeout = 5;
  server::HttpLimits http_limits;
};

std::atomic<bool> g_stop{false};
extern "C" void OnSignal(int) { g_stop.store(true); }
// SIGHUP: re-read --config and reload the backend if it changed (serve_reload.h).
std::atomic<bool> g_reload{false};
extern "C" void OnHangup(int) { g_reload.store(true); }

int Fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

// Fills every option not given on the command line from the YAML file.
Status ApplyYaml(CLI::App& app, const std::string& path) {
  if (path.empty()) return Status::Ok();
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    return InvalidArgument("cannot read config " + path + ": " + e.what());
  }
  const YAML::Node section = root["serve"] ? root["serve"] : root;
  for (CLI::Option* opt : app.get_options()) {
    std::string name = opt->get_single_name();
    if (opt->count() > 0 || name.empty() || name == "help" || name == "config" ||
        name == "device") {
      continue;
    }
    std::string underscored = name;
    std::replace(underscored.begin(), underscored.end(), '-', '_');
    YAML::Node v = section[name] ? section[name] : section[underscored];
    if (!v || v.IsNull()) continue;
    if (!v.IsScalar()) return InvalidArgument("config key '" + name + "' must be a scalar");
    try {
      opt->add_result(v.as<std::string>());
      opt->run_callback();
    } catch (const std::exception& e) {
      return InvalidArgument("config key '" + name + "': " + e.what());
    }
  }
  if (Globals().device.empty() && section["device"]) {
    Globals().device = section["device"].as<std::string>();
  }
  return Status::Ok();
}

int Serve(CLI::App& app, ServeOptions& o) {
  if (Status s = ApplyYaml(app, Globals().config_path); !s.ok()) return Fail(s);
  if (o.model_path.empty()) return Fail(InvalidArgument("--model-path is required"));
  if (o.pooling != "mean" && o.pooling != "last") {
    return Fail(InvalidArgument("--pooling must be mean or last, not '" + o.pooling + "'"));
  }
  auto policy = engine::ParseSchedulePolicy(o.schedule_policy);
  if (!policy.ok()) return Fail(policy.status());

  auto device = model::OpenDevice(Globals().config_path, Globals().device, o.threads);
  if (!device.ok()) return Fail(device.status());
  auto mf = model::OpenModelFile(o.model_path);
  if (!mf.ok()) return Fail(mf.status());

  model::RunnerOptions ro;
  ro.context_length = o.context_length;
  ro.block_size = o.page_size;
  ro.max_tokens_per_step = std::max(o.chunked_prefill_size, 64) + o.max_running_requests;
  auto kv_type = ParseKvCacheType(o.kv_cache_dtype);
  if (!kv_type.ok()) return Fail(kv_type.status());
  ro.kv_dtype = *kv_type;
  ro.swa_full_tokens_ratio = o.swa_full_tokens_ratio;
  const auto& cfg = mf->config;
  const int64_t ctx = o.context_length > 0 ? o.context_length
                                           : std::min<int64_t>(cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 4096, 4096);
  int64_t kv_tokens = o.max_total_tokens;
  if (kv_tokens <= 0 && o.mem_fraction_static > 0) {
    // The KV cache gets the static fraction of free device memory, less the comm plugin's
    // buffers where they live in that memory.
    uint64_t free_bytes = 0, total_bytes = 0;
    if (Status s = (*device)->MemoryInfo(&free_bytes, &total_bytes); !s.ok()) return Fail(s);
    auto comm = dist::RunCommBuffers(Globals().config_path, Globals().device, {o.tp_size, o.pp_size},
                                     **device);
    if (!comm.ok()) return Fail(comm.status());
    const dist::KvBudget budget = dist::ComputeKvBudget(free_bytes, o.mem_fraction_static, *comm);
    spdlog::info("{}", budget.Describe());
    // A token of the main pool costs every layer's K and V, less the sliding layers' share
    // beyond the window pool's ratio (where that pool is used).
    const double per_layer = double(cfg.n_head_kv) *
                             (cfg.head_dim + std::max(cfg.head_dim_v, cfg.head_dim)) *
                             RowBytes(*kv_type, 1);
    const double ratio = std::clamp(o.swa_full_tokens_ratio, 0.0, 1.0);
    const int64_t sliding = ratio > 0 ? cfg.NumSlidingLayers() : 0;
    const double per_token = per_layer * (double(cfg.n_layer - sliding) + ratio * double(sliding));
    kv_tokens = static_cast<int64_t>(double(budget.kv_bytes) / std::max(per_token, 1.0));
  }
  if (kv_tokens <= 0) kv_tokens = std::max<int64_t>(65536, ctx);
  ro.kv_tokens = std::max(kv_tokens, ctx);
  // One rank: a runner whose plugin can be hot reloaded. tp_size x pp_size > 1: one process per
  // rank (dist/parallel.h); rank 0 serves, and in the other ranks this call never returns.
  const int ranks = o.tp_size * o.pp_size;
  model::ReloadableRunner* reloadable = nullptr;
  StatusOr<std::unique_ptr<engine::ModelRunner>> runner = Internal("no runner");
  if (ranks == 1 && !dist::IsFollowerRank()) {
    auto r = CreateReloadableRunner(*mf, Globals().config_path, Globals().device, o.threads, ro,
                                    std::move(*device));
    if (!r.ok()) return Fail(r.status());
    reloadable = r->get();
    runner = std::unique_ptr<engine::ModelRunner>(std::move(*r));
  } else {
    runner = dist::CreateRunner(*mf, Globals().config_path, Globals().device, o.threads, ro,
                                {o.tp_size, o.pp_size});
  }
  if (!runner.ok()) return Fail(runner.status());
  auto chat_options = ResolveChatTemplateFlags(o.chat_template);
  if (!chat_options.ok()) return Fail(chat_options.status());
  auto codec = server::MakeTokenizerCodec(mf->tokenizer.get(), *chat_options);
  if (!codec.ok()) return Fail(codec.status());
  {
    const server::OutputFormat f = (*codec)->output_format();
    spdlog::info(
        "polychip serve: tool calls in the {} format{}, reasoning {}",
        server::ToolFormatName(f.tools),
        f.tools == server::ToolFormat::kGeneric ? " (the template names no known one)" : "",
        o.reasoning_parser == "auto" ? server::ReasoningFormatName(f.reasoning)
                                     : std::string_view(o.reasoning_parser));
  }

  engine::EngineOptions eo;
  eo.max_running_requests = o.max_running_requests;
  eo.max_queued_requests = o.max_queued_requests;
  eo.chunked_prefill_size = o.chunked_prefill_size;
  eo.max_itl_ms = o.max_itl_ms;
  eo.context_length = o.context_length;
  eo.enable_prefix_cache = !o.disable_radix_cache;
  eo.policy = *policy;
  const server::TextCodec* text = codec->get();
  engine::Engine engine(
      runner->get(), eo, [text](int32_t t) { return text->Piece(t); }, text->EogTokens());
  engine.Start();

  server::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.api_key = o.api_key;
  std::string base = o.model_path.substr(o.model_path.find_last_of('/') + 1);
  so.model_name = o.served_model_name.empty() ? base : o.served_model_name;
  so.model_aliases = {o.model_path, base, "default"};
  so.http_threads = o.http_threads;
  so.pooling = o.pooling == "mean" ? engine::Pooling::kMean : engine::Pooling::kLast;
  so.shutdown_timeout_s = o.shutdown_timeout;
  so.http_limits = o.http_limits;
  so.reasoning_parser = o.reasoning_parser;
  // The device serving now: a hot reload replaces it, so it is asked each time, never held.
  std::function<std::shared_ptr<runtime::Device>()> current_device;
  if (reloadable != nullptr) {
    current_device = [reloadable] { return reloadable->device(); };
  } else {
    current_device = [dev = *device] { return dev; };
  }
  auto peak = std::make_shared<std::atomic<uint64_t>>(0);
  so.device_memory = [current_device, peak] {
    server::DeviceMemory m;
    uint64_t free_bytes = 0, total_bytes = 0;
    const std::shared_ptr<runtime::Device> dev = current_device();
    if (dev && dev->MemoryInfo(&free_bytes, &total_bytes).ok() && total_bytes >= free_bytes) {
      m.total_bytes = total_bytes;
      m.in_use_bytes = total_bytes - free_bytes;
      uint64_t p = peak->load();
      while (m.in_use_bytes > p && !peak->compare_exchange_weak(p, m.in_use_bytes)) {}
      m.peak_bytes = std::max(p, m.in_use_bytes);
    }
    return m;
  };
  so.server_info = {{"model_path", o.model_path}, {"schedule_policy", o.schedule_policy},
                    {"device", Globals().device}, {"threads", o.threads},
                    {"kv_cache_dtype", o.kv_cache_dtype}, {"tp_size", o.tp_size},
                    {"pp_size", o.pp_size}, {"nnodes", dist::GlobalLaunchFlags().nnodes},
                    {"comm_groups", dist::DescribeComms(**runner)}};
  ServeReloader reloader(&engine, reloadable, ranks, Globals().config_path, o.threads);
  so.admin_key = o.admin_key;
  so.reload_plugin = [&reloader](const nlohmann::json& body) { return reloader.Handle(body); };
  so.live_info = [&reloader] { return reloader.Info(); };
  server::HttpServer http(so, &engine, text);
  if (Status s = http.Bind(); !s.ok()) return Fail(s);

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGHUP, OnHangup);
  std::thread watcher([&http, &reloader] {
    while (!g_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (g_reload.exchange(false)) reloader.ReloadFromConfig();
    }
    http.Stop();
  });
  spdlog::info("polychip serve: model {} on {}:{} (context {}, {} KV blocks of {} tokens)",
               so.model_name, o.host, http.port(), engine.context_length(),
               (*runner)->num_kv_blocks(), (*runner)->block_size());
  if ((*runner)->num_window_kv_blocks() > 0) {
    spdlog::info("polychip serve: sliding-window layers keep the last {} positions in a pool of "
                 "{} blocks (--swa-full-tokens-ratio {:g})",
                 (*runner)->kv_window(), (*runner)->num_window_kv_blocks(),
                 o.swa_full_tokens_ratio);
  }
  std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), http.port());
  http.Run();
  g_stop.store(true);
  watcher.join();
  engine.Stop();
  spdlog::info("polychip serve: stopped");
  return 0;
}

std::function<int()> SetupServe(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  app.add_option("--model-path,-m", o->model_path, "GGUF model file");
  app.add_option("--served-model-name", o->served_model_name, "name reported by /v1/models");
  app.add_option("--host", o->host, "address to bind (default 127.0.0.1)");
  app.add_option("--port", o->port, "port (0: any free port)");
  app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY'");
  app.add_option("--admin-key", o->admin_key,
                 "key of the admin routes (POST /admin/reload_plugin); default: --api-key; "
                 "with neither, they are refused");
  app.add_option("--context-length", o->context_length, "max tokens per sequence");
  app.add_option("--max-running-requests", o->max_running_requests, "running batch size limit");
  app.add_option("--max-queued-requests", o->max_queued_requests,
                 "waiting requests beyond which new ones get 503");
  app.add_option("--mem-fraction-static", o->mem_fraction_static,
                 "fraction of free device memory for the KV cache");
  app.add_option("--max-total-tokens", o->max_total_tokens, "KV cache size in tokens");
  app.add_option("--page-size", o->page_size, "tokens per KV block");
  app.add_option("--swa-full-tokens-ratio", o->swa_full_tokens_ratio,
                 "sliding-window layers (gemma3): their KV pool's size as a fraction of the "
                 "full layers' tokens; blocks a sequence has moved a window past are released "
                 "(0: those layers keep every block)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--max-itl-ms", o->max_itl_ms,
                 "inter-token latency target: while streams decode, each step's prompt tokens "
                 "are sized from the learned step costs to keep it (default off; "
                 "--chunked-prefill-size stays the ceiling)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--chunked-prefill-size", o->chunked_prefill_size,
                 "prompt tokens per step (<= 0: unlimited)");
  app.add_flag("--disable-radix-cache", o->disable_radix_cache, "no prefix cache");
  app.add_option("--schedule-policy", o->schedule_policy, "fcfs, lpm or priority");
  app.add_option("--threads", o->threads, "device threads (CPU backend)");
  AddParallelOptions(app, &o->tp_size, &o->pp_size);
  AddChatTemplateOptions(app, &o->chat_template);
  app.add_option("--reasoning-parser", o->reasoning_parser,
                 "auto (the chat template's), none, think, gpt-oss, mistral, command-r7b or seed")
      ->check([](const std::string& v) {
        return v == "auto" || server::ReasoningFormatFromName(v) ? std::string()
                                                                 : "unknown reasoning parser";
      });
  app.add_option("--kv-cache-dtype,--kv-type", o->kv_cache_dtype, "f16, bf16 or f32");
  app.add_option("--http-threads", o->http_threads,
                 "HTTP worker threads: requests being handled at once (connections waiting "
                 "for a request hold none)");
  app.add_option("--max-connections-per-client", o->http_limits.max_connections_per_client,
                 "open connections one client address may hold; more are answered 503 "
                 "(default 1024; 0: no cap; raise it behind a proxy)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--request-head-timeout", o->http_limits.head_timeout_s,
                 "seconds a client has to send a request's head, from its first byte (or the "
                 "connection); slower ones are closed (default 10)")
      ->check(CLI::PositiveNumber);
  app.add_option("--keep-alive-timeout", o->http_limits.keep_alive_timeout_s,
                 "seconds an idle keep-alive connection is kept (default 30)")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-body-timeout", o->http_limits.body_timeout_s,
                 "seconds a client has to send a request's body after its head (default 60)")
      ->check(CLI::PositiveNumber);
  app.add_option("--write-timeout", o->http_limits.write_timeout_s,
                 "seconds one write of a response may wait on a client that does not read; "
                 "the connection is closed after (default 30)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-request-body", o->http_limits.max_body_bytes,
                 "largest request body in bytes, Content-Length or chunked; larger ones get "
                 "413 (default 64 MiB)")
      ->check(CLI::PositiveNumber);
  app.add_option("--pooling", o->pooling,
                 "/v1/embeddings: last (the last token's final hidden state, default) or mean "
                 "(over the input's tokens); L2-normalised");
  app.add_option("--shutdown-timeout", o->shutdown_timeout,
                 "on SIGTERM/SIGINT, seconds running requests may take to finish before they "
                 "are cancelled (default 5)")
      ->check(CLI::NonNegativeNumber);
  return [&app, o] { return Serve(app, *o); };
}

const bool kRegistered =
    RegisterCommand({"serve", "OpenAI/SGLang-compatible HTTP server", SetupServe});

}  // namespace
}  // namespace polychip::cli
