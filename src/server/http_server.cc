// The routes of the HTTP front end: each endpoint's handler, behind one guard (API key,
// exceptions turned into a 500). The transport is server/http_transport.h; a generation's
// request flow is server/job.h and its JSON is written by its dialect's ResponseWriter.
#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "grammar/cache.h"
#include "server/api.h"
#include "server/chat_page.h"
#include "server/dialects.h"
#include "server/embeddings.h"
#include "server/http_message.h"
#include "server/http_transport.h"
#include "server/job.h"
#include "server/lora_api.h"
#include "server/response_util.h"
#include "server/response_writer.h"
#include "server/tools.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void SendJson(HttpResponse& res, int status, const json& body) {
  res.status = status;
  res.SetContent(Dump(body), "application/json");
}

void SendError(HttpResponse& res, const ApiError& e) { SendJson(res, e.status, e.ToJson()); }

}  // namespace

class HttpServer::Impl {
 public:
  Impl(ServerOptions options, engine::Engine* engine, const TextCodec* codec)
      : options_(std::move(options)),
        engine_(engine),
        codec_(codec),
        http_(options_.http_threads, options_.http_limits) {
    Routes();
  }

  Status Bind() { return http_.Bind(options_.host, options_.port); }
  void Run() { http_.Run(); }
  // Graceful shutdown: stop accepting, let the running requests finish within the shutdown
  // timeout, then cancel the rest (a stream still gets each choice's final chunk with
  // finish_reason "abort" and [DONE], a waiting non-streaming client a 503) and close every
  // connection, so that no client, reading or not, holds the exit for longer than a moment.
  void Stop() {
    if (draining_.exchange(true)) return;
    http_.StopAccepting();
    const auto grace_end =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                           std::max(options_.shutdown_timeout_s, 0.0) * 1000));
    WaitForRequests(grace_end);
    if (running_requests_ > 0) {
      spdlog::info("shutdown: {} request(s) still running after {} s: cancelled",
                   running_requests_.load(), options_.shutdown_timeout_s);
    }
    stopping_ = true;
    // The cancelled ones need a moment to send their last chunks; a client that does not read
    // is not waited for longer.
    WaitForRequests(Clock::now() + std::chrono::seconds(1));
    http_.CloseConnections();
  }
  int port() const { return http_.port(); }

 private:
  // Counts a generation request for as long as it runs (the shutdown waits for these).
  class RunningRequest {
   public:
    explicit RunningRequest(std::atomic<int>* n) : n_(n) { ++*n_; }
    ~RunningRequest() { --*n_; }
    RunningRequest(const RunningRequest&) = delete;
    RunningRequest& operator=(const RunningRequest&) = delete;

   private:
    std::atomic<int>* n_;
  };

  void WaitForRequests(Clock::time_point deadline) const {
    while (running_requests_ > 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;

  // Every handler runs inside this: API key, exceptions -> 500, never a crash.
  Handler Guard(Handler h, bool needs_key) {
    return [this, h = std::move(h), needs_key](const HttpRequest& req, HttpResponse& res) {
      try {
        if (needs_key) {
          if (auto e = CheckKey(req)) return SendError(res, *e), DialectError(req, res);
        }
        h(req, res);
      } catch (const std::exception& e) {
        spdlog::error("handler {} failed: {}", req.path, e.what());
        SendError(res, Error(500, std::string("internal error: ") + e.what(), "server_error"));
      } catch (...) {
        SendError(res, Error(500, "internal error", "server_error"));
      }
      DialectError(req, res);
    };
  }

  // Anthropic's routes answer errors in Anthropic's shape (its SDK reads error.type).
  static void DialectError(const HttpRequest& req, HttpResponse& res) {
    if (res.status < 400 || req.path.rfind("/v1/messages", 0) != 0) return;
    const json body = json::parse(res.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object() || !body.contains("error") || body.contains("type")) return;
    auto [status, shaped] = AnthropicError(res.status, body);
    SendJson(res, status, shaped);
  }

  std::optional<ApiError> CheckKey(const HttpRequest& req) const {
    if (options_.api_key.empty()) return std::nullopt;
    return CheckBearer(req, options_.api_key, "API key");
  }

  // The admin routes replace plugins, that is run code in this process: never open.
  std::optional<ApiError> CheckAdminKey(const HttpRequest& req) const {
    const std::string& key = options_.admin_key.empty() ? options_.api_key : options_.admin_key;
    if (key.empty()) {
      return Error(403, "admin routes are disabled: start the server with --admin-key (or "
                        "--api-key) to enable them", "permission_error");
    }
    return CheckBearer(req, key, options_.admin_key.empty() ? "API key" : "admin key");
  }

  static std::optional<ApiError> CheckBearer(const HttpRequest& req, const std::string& key,
                                             const std::string& what) {
    const std::string auth = req.Header("Authorization");
    // Anthropic's clients send the key as x-api-key.
    const std::string x_api_key = req.Header("x-api-key");
    if (auth.empty() && x_api_key.empty()) {
      return Error(401, "missing " + what + ": send 'Authorization: Bearer <key>' or "
                   "'x-api-key: <key>'", "authentication_error");
    }
    if (auth != "Bearer " + key && x_api_key != key) {
      return Error(401, "invalid " + what, "authentication_error");
    }
    return std::nullopt;
  }

  // Runs after the request head and before the body is read (the transport's pre-routing
  // hook): a client without the key cannot make the server read a body (a 600 MB one took
  // 1.08 GB before its 401). Bodies, Content-Length or chunked, are bounded by the transport.
  HttpTransport::HookResult BeforeBody(const HttpRequest& req, HttpResponse& res) const {
    std::optional<ApiError> e;
    if (draining_) {
      e = Error(503, "the server is shutting down", "server_error");
    } else if (req.path.rfind("/admin/", 0) == 0 || IsAdapterRoute(req.path)) {
      e = CheckAdminKey(req);
    } else if (req.path != "/health" && req.path != "/live" && req.path != "/") {
      e = CheckKey(req);
    }
    if (!e) return HttpTransport::HookResult::kUnhandled;
    SendError(res, *e);
    DialectError(req, res);
    // The body was not read: the connection cannot carry another request.
    res.SetHeader("Connection", "close");
    return HttpTransport::HookResult::kHandled;
  }

  static bool IsAdapterRoute(const std::string& path) {
    return path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter";
  }

  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter (admin key, as vLLM's answers).
  void AdapterRoute(bool load, const HttpRequest& req, HttpResponse& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    if (!body.is_object()) return SendError(res, Error(400, "the body must be a JSON object"));
    auto [status, text] = load ? LoadAdapter(options_.loras.get(), body)
                               : UnloadAdapter(options_.loras.get(), body);
    res.status = status;
    res.SetContent(std::move(text), status == 200 ? "text/plain" : "application/json");
  }

  // Parses a JSON body; on failure writes the 400 and returns false.
  bool ParseBody(const HttpRequest& req, HttpResponse& res, json* body) {
    if (!IsValidUtf8(req.body)) {
      SendError(res, Error(400, "the request body is not valid UTF-8"));
      return false;
    }
    *body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body->is_discarded()) {
      SendError(res, Error(400, "the request body is not valid JSON"));
      return false;
    }
    return true;
  }

  bool KnownModel(const std::string& name) const {
    if (name.empty() || name == options_.model_name) return true;
    if (IsAdapterModel(options_.loras.get(), name)) return true;
    for (const auto& a : options_.model_aliases) {
      if (a == name) return true;
    }
    return false;
  }

  void Routes() {
    http_.SetPreRoutingHook(
        [this](const HttpRequest& req, HttpResponse& res) { return BeforeBody(req, res); });
    // The chat page: public like /health (it asks for the API key itself when the server
    // has one).
    http_.Get("/", Guard([](const auto&, auto& res) {
               res.SetContent(std::string(ChatPageHtml()), "text/html; charset=utf-8");
             }, false));
    // On the event thread: /health answers even when every worker is busy.
    // Readiness: 503 while no backend can serve (a failed hot reload left none) and while
    // draining (BeforeBody answers that); liveness is any answer at all (docs/deployment.md).
    http_.Get("/health", Guard([this](const auto&, auto& res) {
                const std::string why = options_.unavailable ? options_.unavailable() : "";
                if (why.empty()) return SendJson(res, 200, json::object());
                SendJson(res, 503, {{"status", "unavailable"}, {"reason", why}});
              }, false),
              HttpTransport::RunOn::kEventThread);
    // Liveness: 200 whenever the event loop turns, whatever the backend's state (a pod
    // restarted for a failed reload would lose the requests that wait for the next one).
    http_.Get("/live", Guard([](const auto&, auto& res) { SendJson(res, 200, json::object()); },
                             false),
              HttpTransport::RunOn::kEventThread);
    // /health_generate runs the model and /metrics tells the load: behind the key like the
    // rest (an open /health_generate let anyone generate at full speed).
    http_.Get("/health_generate", Guard([this](const auto&, auto& res) { HealthGenerate(res); },
                                        true));
    http_.Get("/metrics", Guard([this](const auto&, auto& res) { Metrics(res); }, true));
    http_.Get("/v1/models", Guard([this](const auto&, auto& res) { Models(res); }, true));
    http_.Get("/get_model_info", Guard([this](const auto&, auto& res) {
               SendJson(res, 200, {{"model_path", options_.model_name}, {"is_generation", true}});
             }, true));
    http_.Get("/get_server_info", Guard([this](const auto&, auto& res) { ServerInfo(res); }, true));
    for (const char* path : {"/flush_cache"}) {
      auto h = Guard([this](const auto&, auto& res) {
        if (engine_->FlushCache()) {
          res.SetContent("Cache flushed.\n", "text/plain");
        } else {
          SendError(res, Error(400, "cache not flushed: requests are running", "invalid_request_error"));
        }
      }, true);
      http_.Post(path, h);
      http_.Get(path, h);
    }
    // SGLang serves both spellings with the same shapes.
    for (const char* path : {"/tokenize", "/v1/tokenize"}) {
      http_.Post(path, Guard([this](const auto& req, auto& res) { Tokenize(req, res); }, true));
    }
    http_.Post("/apply-template",
               Guard([this](const auto& req, auto& res) { ApplyTemplate(req, res); }, true));
    for (const char* path : {"/detokenize", "/v1/detokenize"}) {
      http_.Post(path, Guard([this](const auto& req, auto& res) { Detokenize(req, res); }, true));
    }
    http_.Post("/v1/embeddings",
               Guard([this](const auto& req, auto& res) { Embeddings(req, res); }, true));
    http_.Post("/v1/completions", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kCompletion, req, res);
              }, true));
    http_.Post("/v1/chat/completions", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kChat, req, res);
              }, true));
    http_.Post("/generate", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kGenerate, req, res);
              }, true));
    http_.Post("/v1/messages", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kMessages, req, res);
              }, true));
    http_.Post("/v1/messages/count_tokens",
               Guard([this](const auto& req, auto& res) { CountTokens(req, res); }, true));
    http_.Post("/v1/responses", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kResponses, req, res);
              }, true));
    http_.Get("/v1/responses/*",
              Guard([this](const auto& req, auto& res) { StoredResponse(req, res, false); }, true));
    http_.Delete("/v1/responses/*",
                 Guard([this](const auto& req, auto& res) { StoredResponse(req, res, true); },
                       true));
    // The key was checked before the body was read (BeforeBody); checked again here so that the
    // route never depends on the hook alone.
    http_.Post("/admin/reload_plugin", Guard([this](const auto& req, auto& res) {
                if (auto e = CheckAdminKey(req)) return SendError(res, *e);
                ReloadPlugin(req, res);
              }, false));
    for (const bool load : {true, false}) {
      http_.Post(load ? "/v1/load_lora_adapter" : "/v1/unload_lora_adapter",
                 Guard([this, load](const auto& req, auto& res) {
                   if (auto e = CheckAdminKey(req)) return SendError(res, *e);
                   AdapterRoute(load, req, res);
                 }, false));
    }
    // The transport's own refusals (400, 404, 413, 431, 503 over the per-client cap) carry
    // their reason in res.reason.
    http_.SetErrorHandler([](const HttpRequest& req, HttpResponse& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        SendError(res, Error(404, "no route for " + req.method + " " + req.path, "not_found_error"));
      } else if (res.status == 503) {
        SendError(res, Error(503, res.reason.empty() ? "HTTP error 503" : res.reason,
                             "server_overloaded"));
      } else {
        SendError(res, Error(res.status, res.reason.empty()
                                             ? "HTTP error " + std::to_string(res.status)
                                             : res.reason));
      }
      DialectError(req, res);
    });
  }

  void ReloadPlugin(const HttpRequest& req, HttpResponse& res) {
    if (!options_.reload_plugin) {
      return SendError(res, Error(501, "this server cannot reload plugins", "server_error"));
    }
    json body;
    if (!ParseBody(req, res, &body)) return;
    if (!body.is_object()) return SendError(res, Error(400, "the body must be a JSON object"));
    auto [status, reply] = options_.reload_plugin(body);
    SendJson(res, status, reply);
  }

  void Models(HttpResponse& res) {
    json data = json::array();
    data.push_back({{"id", options_.model_name},
                    {"object", "model"},
                    {"created", started_},
                    {"owned_by", "polychip"},
                    {"root", options_.model_name},
                    {"max_model_len", engine_->context_length()}});
    for (json& m : AdapterModels(options_.loras.get(), options_.model_name, started_,
                                 engine_->context_length())) {
      data.push_back(std::move(m));
    }
    SendJson(res, 200, {{"object", "list"}, {"data", data}});
  }

  void ServerInfo(HttpResponse& res) {
    json info = options_.server_info;
    const auto s = engine_->Stats();
    info["version"] = "0.1.0";
    info["model_name"] = options_.model_name;
    info["context_length"] = engine_->context_length();
    info["max_total_num_tokens"] = s.kv_blocks_total * engine_->runner().block_size();
    info["page_size"] = engine_->runner().block_size();
    info["max_running_requests"] = engine_->options().max_running_requests;
    info["max_queued_requests"] = engine_->options().max_queued_requests;
    info["chunked_prefill_size"] = engine_->options().chunked_prefill_size;
    info["max_itl_ms"] = engine_->options().max_itl_ms;
    info["disable_radix_cache"] = !engine_->options().enable_prefix_cache;
    info["lora_adapters"] = AdapterInfo(options_.loras.get());
    info["max_loras_per_batch"] = engine_->options().max_adapters_per_step;
    info["num_running_reqs"] = s.running;
    info["num_queue_reqs"] = s.queued;
    info["kv_blocks_used"] = s.kv_blocks_held;
    if (s.window_blocks_total > 0) {  // the sliding-window layers' own pool
      info["swa_max_total_num_tokens"] = s.window_blocks_total * engine_->runner().block_size();
      info["swa_kv_blocks_free"] = s.window_blocks_free;
      info["sliding_window"] = engine_->runner().kv_window();
    }
    info["prefix_cache_hit_rate"] = s.prefix.hit_rate();
    info["num_preemptions"] = s.preemptions;
    if (options_.live_info) info.update(options_.live_info());
    SendJson(res, 200, info);
  }

  void Metrics(HttpResponse& res) {
    if (!options_.enable_metrics) {
      return SendError(res, Error(404, "metrics are off (--enable-metrics false)"));
    }
    std::string out;
    engine_->RenderMetrics(&out);
    if (options_.vllm_metrics) engine_->RenderVllmMetrics(options_.model_name, &out);
    if (options_.device_memory) {
      const DeviceMemory m = options_.device_memory();
      out += fmt::format(
          "# HELP polychip_device_memory_used_bytes Device memory in use.\n"
          "# TYPE polychip_device_memory_used_bytes gauge\npolychip_device_memory_used_bytes {}\n"
          "# HELP polychip_device_memory_peak_bytes Peak device memory in use.\n"
          "# TYPE polychip_device_memory_peak_bytes gauge\npolychip_device_memory_peak_bytes {}\n"
          "# HELP polychip_device_memory_total_bytes Device memory.\n"
          "# TYPE polychip_device_memory_total_bytes gauge\npolychip_device_memory_total_bytes {}\n",
          m.in_use_bytes, m.peak_bytes, m.total_bytes);
    }
    const auto& g = grammar::Counters();
    out += fmt::format(
        "# HELP polychip_grammar_masks_total Token masks applied for structured outputs.\n"
        "# TYPE polychip_grammar_masks_total counter\npolychip_grammar_masks_total {}\n"
        "# HELP polychip_grammar_masks_built_total Token masks computed (not from the cache).\n"
        "# TYPE polychip_grammar_masks_built_total counter\npolychip_grammar_masks_built_total {}\n"
        "# HELP polychip_grammar_mask_seconds_total Time spent computing and applying masks.\n"
        "# TYPE polychip_grammar_mask_seconds_total counter\npolychip_grammar_mask_seconds_total {}\n"
        "# HELP polychip_grammar_mask_build_seconds_total Of which computing masks.\n"
        "# TYPE polychip_grammar_mask_build_seconds_total counter\n"
        "polychip_grammar_mask_build_seconds_total {}\n",
        g.masks.load(), g.masks_built.load(), g.mask_nanos.load() * 1e-9,
        g.build_nanos.load() * 1e-9);
    res.SetContent(std::move(out), "text/plain; version=0.0.4");
  }

  // A chat body's conversation (messages, tools, chat_template_kwargs, add_generation_prompt)
  // as the template takes it; false after sending the error.
  bool ReadChatInput(const HttpRequest& req, HttpResponse& res, const json& body,
                     model::ChatInput* chat) {
    ToolRequest tools;
    if (auto error = ParseChatInput(body, req.body, *codec_, &tools, chat)) {
      SendError(res, *error);
      return false;
    }
    return true;
  }

  // llama-server's /apply-template: the prompt the model would see, not generated from.
  void ApplyTemplate(const HttpRequest& req, HttpResponse& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    if (!body.is_object()) return SendError(res, Error(400, "the body must be a JSON object"));
    model::ChatInput chat;
    if (!ReadChatInput(req, res, body, &chat)) return;
    auto prompt = codec_->RenderChat(chat);
    if (!prompt.ok()) {
      return SendError(res, Error(400, prompt.status().message(), "invalid_request_error",
                                  "messages"));
    }
    SendJson(res, 200, {{"prompt", *prompt}});
  }

  void Tokenize(const HttpRequest& req, HttpResponse& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    if (!body.is_object()) return SendError(res, Error(400, "the body must be a JSON object"));
    if (body.contains("messages")) {  // vLLM's chat form: the rendered conversation's tokens
      model::ChatInput chat;
      if (!ReadChatInput(req, res, body, &chat)) return;
      auto tokens = codec_->EncodeChat(chat);
      if (!tokens.ok()) {
        return SendError(res, Error(400, tokens.status().message(), "invalid_request_error",
                                    "messages"));
      }
      SendJson(res, 200, {{"tokens", *tokens}, {"count", tokens->size()},
                          {"max_model_len", engine_->context_length()}});
      return;
    }
    std::string text;
    for (const char* key : {"text", "prompt"}) {
      auto it = body.find(key);
      if (it == body.end()) continue;
      if (!it->is_string()) return SendError(res, Error(400, std::string("'") + key + "' must be a string", "invalid_request_error", key));
      text = it->get<std::string>();
    }
    bool add_special = true;
    if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return SendError(res, Error(400, "'add_special_tokens' must be a boolean",
                                    "invalid_request_error", "add_special_tokens"));
      }
      add_special = it->get<bool>();
    }
    auto tokens = codec_->Encode(text, add_special);
    SendJson(res, 200, {{"tokens", tokens}, {"count", tokens.size()},
                        {"max_model_len", engine_->context_length()}});
  }

  void Detokenize(const HttpRequest& req, HttpResponse& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    auto it = body.is_object() ? body.find("tokens") : body.end();
    if (it == body.end() || !it->is_array()) {
      return SendError(res, Error(400, "'tokens' must be an array of token ids", "invalid_request_error", "tokens"));
    }
    std::vector<int32_t> tokens;
    for (const auto& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= codec_->vocab_size()) {
        return SendError(res, Error(400, "token ids must be integers in [0, " + std::to_string(codec_->vocab_size()) + ")", "invalid_request_error", "tokens"));
      }
      tokens.push_back(t.get<int32_t>());
    }
    SendJson(res, 200, {{"text", codec_->Decode(tokens)}});
  }

  void HealthGenerate(HttpResponse& res) {
    RunningRequest running(&running_requests_);
    engine::GenerateInput in;
    in.rid = RandomId("health-");
    in.prompt = codec_->Encode("health", true);
    if (in.prompt.empty()) in.prompt = {0};
    in.params.max_tokens = 1;
    auto stream = engine_->Submit(std::move(in));
    if (!stream.ok()) return SendError(res, Error(503, stream.status().message(), "server_error"));
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline && !stopping_) {
      for (auto& ev : (*stream)->Pop(std::chrono::milliseconds(50))) {
        if (!ev.finished) continue;
        if (ev.error.ok()) return SendJson(res, 200, json::object());
        return SendError(res, Error(503, ev.error.message(), "server_error"));
      }
    }
    engine_->Abort(*stream);
    SendError(res, Error(503, "generation did not finish in time", "server_error"));
  }

  // Every input is one engine request (prefill only), submitted together so that they share
  // steps; the answer keeps the request's order.
  void Embeddings(const HttpRequest& req, HttpResponse& res) {
    RunningRequest running(&running_requests_);  // the shutdown lets it finish like a generation
    json body;
    if (!ParseBody(req, res, &body)) return;
    EmbeddingRequest er;
    const int64_t hidden = engine_->runner().hidden_size();
    if (auto e = ParseEmbeddingRequest(body, *codec_, hidden, &er)) return SendError(res, *e);
    if (!KnownModel(er.model)) {
      return SendError(res, Error(404, "the model '" + er.model + "' does not exist; this server serves '" + options_.model_name + "'", "not_found_error", "model"));
    }
    if (hidden <= 0) {
      return SendError(res, Error(400, "this server's model runner cannot compute embeddings"));
    }
    const std::string id = RandomId("embd-");
    std::vector<std::shared_ptr<engine::RequestStream>> streams;
    auto abort_all = [&] {
      for (auto& st : streams) engine_->Abort(st);
    };
    int64_t prompt_tokens = 0;
    for (size_t i = 0; i < er.inputs.size(); ++i) {
      engine::GenerateInput in;
      in.rid = id + "-" + std::to_string(i);
      prompt_tokens += static_cast<int64_t>(er.inputs[i].size());
      in.prompt = std::move(er.inputs[i]);
      in.embed = options_.pooling;
      auto stream = engine_->Submit(std::move(in));
      if (!stream.ok()) {
        abort_all();
        const bool busy = stream.status().code() == StatusCode::kUnavailable;
        return SendError(res, Error(busy ? 503 : 400, "input " + std::to_string(i) + ": " + stream.status().message(),
                                    busy ? "server_overloaded" : "invalid_request_error",
                                    busy ? "" : "input"));
      }
      streams.push_back(*stream);
    }
    std::vector<std::vector<float>> vectors(streams.size());
    for (size_t i = 0; i < streams.size(); ++i) {
      bool finished = false;
      while (!finished) {
        if (stopping_) {
          abort_all();
          return SendError(res, Error(503, "the server is shutting down", "server_error"));
        }
        for (auto& ev : streams[i]->Pop(std::chrono::milliseconds(100))) {
          if (!ev.finished) continue;
          if (!ev.error.ok()) {
            abort_all();
            return SendError(res, Error(500, ev.error.message(), "server_error"));
          }
          vectors[i] = std::move(ev.embedding);
          finished = true;
        }
      }
    }
    SendJson(res, 200, EmbeddingResponse(vectors, er.base64, options_.model_name, prompt_tokens));
  }

  // ---- generation ---------------------------------------------------------------------------

  void Generate(ApiKind kind, const HttpRequest& req, HttpResponse& res) {
    // A stream counts until its connection is released, beyond this call (see below).
    auto running = std::make_shared<RunningRequest>(&running_requests_);
    json body;
    if (!ParseBody(req, res, &body)) return;
    auto job = std::make_shared<Job>();
    ParseLimits limits;
    limits.context_length = engine_->context_length();
    limits.grammars = [this] { return Grammars(); };
    limits.raw_body = req.body;
    limits.responses = &responses_;
    limits.reasoning_parser = options_.reasoning_parser;
    if (auto e = ParseApiRequest(kind, body, *codec_, limits, &job->req)) return SendError(res, *e);
    if (!KnownModel(job->req.model)) {
      return SendError(res, Error(404, "the model '" + job->req.model + "' does not exist; this server serves '" + options_.model_name + "'", "not_found_error", "model"));
    }
    if (auto e = ResolveAdapter(options_.loras.get(), body, &job->req)) return SendError(res, *e);
    const bool adapter_model = IsAdapterModel(options_.loras.get(), job->req.model);
    job->writer = MakeResponseWriter(kind, codec_,
                                     adapter_model ? job->req.model : options_.model_name,
                                     &responses_);
    job->id = kind == ApiKind::kChat        ? RandomId("chatcmpl-")
              : kind == ApiKind::kMessages  ? RandomId("msg_")
              : kind == ApiKind::kResponses ? RandomId("resp_")
              : job->req.rid.empty()        ? RandomId("cmpl-")
                                            : job->req.rid;
    job->created = UnixTime();
    if (!job->req.inputs.empty()) job->prompt_tokens = job->req.inputs[0].prompt.size();
    for (size_t i = 0; i < job->req.inputs.size(); ++i) {
      auto& in = job->req.inputs[i];
      in.rid = job->id + (job->req.inputs.size() > 1 ? "-" + std::to_string(i) : "");
      auto stream = engine_->Submit(std::move(in));
      if (!stream.ok()) {
        Abort(*job);
        const bool busy = stream.status().code() == StatusCode::kUnavailable;
        return SendError(res, Error(busy ? 503 : 400, stream.status().message(),
                                    busy ? "server_overloaded" : "invalid_request_error",
                                    busy ? "" : "prompt"));
      }
      Choice c;
      c.stream = *stream;
      job->choices.push_back(std::move(c));
    }
    if (!job->req.stream) {
      // Wait for every choice; bounded by max_tokens (the engine always finishes a request).
      // A client that hangs up is noticed and its request aborted, so that it stops generating
      // and frees its KV blocks.
      while (!AllFinished(*job)) {
        if (stopping_) {
          Abort(*job);
          return SendError(res, Error(503, "the server is shutting down", "server_error"));
        }
        Collect(*job, std::chrono::milliseconds(100), nullptr);
        if (HttpTransport::ClientGone()) {
          Abort(*job);
          return;  // nobody to answer
        }
      }
      for (const auto& c : job->choices) {
        if (!c.final.error.ok()) {
          return SendError(res, Error(500, c.final.error.message(), "server_error"));
        }
      }
      return SendJson(res, 200, job->writer->Final(*job));
    }
    res.SetHeader("Cache-Control", "no-cache");
    res.SetHeader("X-Accel-Buffering", "no");
    res.SetStream(
        "text/event-stream", [this, job](StreamSink& sink) { return Pump(job, sink); },
        [this, job, running](bool) mutable {  // ends or client gone: free what is left
          Abort(*job);
          running.reset();
        });
  }

  // /v1/messages/count_tokens: the prompt /v1/messages would run, counted.
  void CountTokens(const HttpRequest& req, HttpResponse& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    ParseLimits limits;
    limits.context_length = engine_->context_length();
    limits.grammars = [this] { return Grammars(); };
    limits.raw_body = req.body;
    limits.count_only = true;
    ApiRequest parsed;
    if (auto e = ParseApiRequest(ApiKind::kMessages, body, *codec_, limits, &parsed)) {
      return SendError(res, *e);
    }
    if (!KnownModel(parsed.model)) {
      return SendError(res, Error(404, "the model '" + parsed.model + "' does not exist; this server serves '" + options_.model_name + "'", "not_found_error", "model"));
    }
    SendJson(res, 200, {{"input_tokens", parsed.inputs.at(0).prompt.size()}});
  }

  // GET /v1/responses/{id} (the stored response) and DELETE /v1/responses/{id}.
  void StoredResponse(const HttpRequest& req, HttpResponse& res, bool remove) {
    const std::string id = req.path.substr(req.path.rfind('/') + 1);
    if (remove ? responses_.Delete(id) : false) {
      return SendJson(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
    }
    if (!remove) {
      if (auto entry = responses_.Get(id)) return SendJson(res, 200, entry->response);
    }
    SendError(res, Error(404, responses_.Missing(id), "not_found_error"));
  }

  void Abort(Job& job) { AbortJob(*engine_, job); }

  // The structured-output compiler, built on first use: its token trie reads every token's
  // bytes once (half a second at a 152k vocabulary on a busy 2-core VM).
  grammar::GrammarCache* Grammars() {
    std::call_once(grammars_once_, [this] {
      std::vector<std::string> pieces(codec_->vocab_size());
      for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = codec_->Piece(static_cast<int32_t>(i));
      grammars_ = std::make_unique<grammar::GrammarCache>(
          std::make_shared<grammar::TokenVocab>(std::move(pieces), codec_->EogTokens()));
    });
    return grammars_.get();
  }

  bool Pump(const std::shared_ptr<Job>& job, StreamSink& sink) {
    try {
      if (job->done_sent) {
        sink.done();
        return true;
      }
      if (stopping_ && !job->abort_sent) {
        // Shutting down: cancel the job but keep pumping, so that the client still gets each
        // choice's final chunk (finish_reason "abort") and [DONE] instead of a cut stream.
        Abort(*job);
        job->abort_sent = true;
      }
      const std::string out = NextSseText(*job, std::chrono::milliseconds(50));
      if (!out.empty()) {
        if (!sink.write(out)) {
          Abort(*job);
          return false;
        }
      } else if (!sink.is_writable()) {
        Abort(*job);
        return false;
      }
      if (job->done_sent) sink.done();
      return true;
    } catch (const std::exception& e) {
      spdlog::error("streaming failed: {}", e.what());
      Abort(*job);
      return false;
    }
  }

  ServerOptions options_;
  engine::Engine* engine_;
  const TextCodec* codec_;
  HttpTransport http_;  // the transport, where the routes go
  std::atomic<bool> draining_{false};  // Stop() called: no new requests
  std::atomic<bool> stopping_{false};  // the shutdown timeout is over: cancel what runs
  std::atomic<int> running_requests_{0};
  int64_t started_ = UnixTime();
  ResponseStore responses_{options_.responses_store};
  std::once_flag grammars_once_;
  std::unique_ptr<grammar::GrammarCache> grammars_;
};

HttpServer::HttpServer(ServerOptions options, engine::Engine* engine, const TextCodec* codec)
    : impl_(std::make_unique<Impl>(std::move(options), engine, codec)) {}
HttpServer::~HttpServer() = default;
Status HttpServer::Bind() { return impl_->Bind(); }
void HttpServer::Run() { impl_->Run(); }
void HttpServer::Stop() { impl_->Stop(); }
int HttpServer::port() const { return impl_->port(); }

}  // namespace polychip::server
