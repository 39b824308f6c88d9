#include "server/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server/api.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Dump(const json& j) {
  // Token pieces may be partial UTF-8 sequences: replace rather than throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const ApiError& e) { SendJson(res, e.status, e.ToJson()); }

ApiError Error(int status, std::string message, std::string type = "invalid_request_error",
               std::string param = "") {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.param = std::move(param);
  return e;
}

std::string RandomId(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return fmt::format("{}{:016x}", prefix, salt ^ (++counter * 0x9e3779b97f4a7c15ull));
}

int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The accumulated output of one choice.
struct Choice {
  std::shared_ptr<engine::RequestStream> stream;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
  bool finished = false;
  engine::StreamEvent final;
  bool sent_role = false;
};

// One HTTP request's generation, shared by the handler and its streaming content provider.
struct Job {
  ApiRequest req;
  std::string id;
  int64_t created = 0;
  std::vector<Choice> choices;
  Clock::time_point start = Clock::now();
  bool done_sent = false;
};

// cpp-httplib 0.11 listens with a backlog of 5 and does not expose its socket, so a burst of a
// few hundred clients connecting at once overflows the accept queue and their SYNs are retried
// after 1 s, 3 s, ... (seen as TTFT spikes). listen() again on the bound socket (found by its
// port) raises the backlog; Linux allows this on a listening socket.
void WidenListenBacklog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (p == port && ::listen(fd, SOMAXCONN) == 0) return;
  }
  spdlog::warn("could not raise the listen backlog of port {}", port);
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(ServerOptions options, engine::Engine* engine, const TextCodec* codec)
      : options_(std::move(options)), engine_(engine), codec_(codec) {
    const int threads = std::max(options_.http_threads, 8);
    svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr_.set_keep_alive_max_count(1000);
    svr_.set_read_timeout(30, 0);
    svr_.set_write_timeout(30, 0);
    svr_.set_payload_max_length(64ull << 20);
    Routes();
  }

  Status Bind() {
    // A client that vanished mid-stream must produce a write error, not kill the process.
    ::signal(SIGPIPE, SIG_IGN);
    if (options_.port == 0) {
      port_ = svr_.bind_to_any_port(options_.host.c_str());
      if (port_ <= 0) return Unavailable("cannot bind " + options_.host);
    } else {
      if (!svr_.bind_to_port(options_.host.c_str(), options_.port)) {
        return Unavailable(fmt::format("cannot bind {}:{} (in use?)", options_.host,
                                       options_.port));
      }
      port_ = options_.port;
    }
    WidenListenBacklog(port_);
    return Status::Ok();
  }
  void Run() { svr_.listen_after_bind(); }
  void Stop() {
    stopping_ = true;
    svr_.stop();
  }
  int port() const { return port_; }

 private:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  // Every handler runs inside this: API key, exceptions -> 500, never a crash.
  Handler Guard(Handler h, bool needs_key) {
    return [this, h = std::move(h), needs_key](const httplib::Request& req,
                                               httplib::Response& res) {
      try {
        if (needs_key && !options_.api_key.empty()) {
          const std::string auth = req.get_header_value("Authorization");
          const std::string expected = "Bearer " + options_.api_key;
          if (auth.empty()) {
            return SendError(res, Error(401, "missing API key: send 'Authorization: Bearer <key>'",
                                        "authentication_error"));
          }
          if (auth != expected) {
            return SendError(res, Error(401, "invalid API key", "authentication_error"));
          }
        }
        h(req, res);
      } catch (const std::exception& e) {
        spdlog::error("handler {} failed: {}", req.path, e.what());
        SendError(res, Error(500, std::string("internal error: ") + e.what(), "server_error"));
      } catch (...) {
        SendError(res, Error(500, "internal error", "server_error"));
      }
    };
  }

  // Parses a JSON body; on failure writes the 400 and returns false.
  bool ParseBody(const httplib::Request& req, httplib::Response& res, json* body) {
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
    for (const auto& a : options_.model_aliases) {
      if (a == name) return true;
    }
    return false;
  }

  void Routes() {
    svr_.Get("/health", Guard([](const auto&, auto& res) { SendJson(res, 200, json::object()); },
                              false));
    svr_.Get("/health_generate", Guard([this](const auto&, auto& res) { HealthGenerate(res); },
                                       false));
    svr_.Get("/metrics", Guard([this](const auto&, auto& res) { Metrics(res); }, false));
    svr_.Get("/v1/models", Guard([this](const auto&, auto& res) { Models(res); }, true));
    svr_.Get("/get_model_info", Guard([this](const auto&, auto& res) {
               SendJson(res, 200, {{"model_path", options_.model_name}, {"is_generation", true}});
             }, true));
    svr_.Get("/get_server_info", Guard([this](const auto&, auto& res) { ServerInfo(res); }, true));
    for (const char* path : {"/flush_cache"}) {
      auto h = Guard([this](const auto&, auto& res) {
        if (engine_->FlushCache()) {
          res.set_content("Cache flushed.\n", "text/plain");
        } else {
          SendError(res, Error(400, "cache not flushed: requests are running", "invalid_request_error"));
        }
      }, true);
      svr_.Post(path, h);
      svr_.Get(path, h);
    }
    svr_.Post("/tokenize", Guard([this](const auto& req, auto& res) { Tokenize(req, res); }, true));
    svr_.Post("/detokenize",
              Guard([this](const auto& req, auto& res) { Detokenize(req, res); }, true));
    svr_.Post("/v1/completions", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kCompletion, req, res);
              }, true));
    svr_.Post("/v1/chat/completions", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kChat, req, res);
              }, true));
    svr_.Post("/generate", Guard([this](const auto& req, auto& res) {
                Generate(ApiKind::kGenerate, req, res);
              }, true));
    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404) {
        SendError(res, Error(404, "no route for " + req.method + " " + req.path, "not_found_error"));
      } else {
        SendError(res, Error(res.status, "HTTP error " + std::to_string(res.status)));
      }
    });
  }

  void Models(httplib::Response& res) {
    json data = json::array();
    data.push_back({{"id", options_.model_name},
                    {"object", "model"},
                    {"created", started_},
                    {"owned_by", "polychip"},
                    {"root", options_.model_name},
                    {"max_model_len", engine_->context_length()}});
    SendJson(res, 200, {{"object", "list"}, {"data", data}});
  }

  void ServerInfo(httplib::Response& res) {
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
    info["disable_radix_cache"] = !engine_->options().enable_prefix_cache;
    info["num_running_reqs"] = s.running;
    info["num_queue_reqs"] = s.queued;
    info["kv_blocks_used"] = s.kv_blocks_held;
    info["prefix_cache_hit_rate"] = s.prefix.hit_rate();
    info["num_preemptions"] = s.preemptions;
    SendJson(res, 200, info);
  }

  void Metrics(httplib::Response& res) {
    std::string out;
    engine_->RenderMetrics(&out);
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
    res.set_content(out, "text/plain; version=0.0.4");
  }

  void Tokenize(const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    if (!body.is_object()) return SendError(res, Error(400, "the body must be a JSON object"));
    std::string text;
    for (const char* key : {"text", "prompt"}) {
      auto it = body.find(key);
      if (it == body.end()) continue;
      if (!it->is_string()) return SendError(res, Error(400, std::string("'") + key + "' must be a string", "invalid_request_error", key));
      text = it->get<std::string>();
    }
    bool add_special = body.value("add_special_tokens", true);
    auto tokens = codec_->Encode(text, add_special);
    SendJson(res, 200, {{"tokens", tokens}, {"count", tokens.size()},
                        {"max_model_len", engine_->context_length()}});
  }

  void Detokenize(const httplib::Request& req, httplib::Response& res) {
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

  void HealthGenerate(httplib::Response& res) {
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

  // ---- generation ---------------------------------------------------------------------------

  void Generate(ApiKind kind, const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!ParseBody(req, res, &body)) return;
    auto job = std::make_shared<Job>();
    ParseLimits limits;
    limits.context_length = engine_->context_length();
    if (auto e = ParseApiRequest(kind, body, *codec_, limits, &job->req)) return SendError(res, *e);
    if (!KnownModel(job->req.model)) {
      return SendError(res, Error(404, "the model '" + job->req.model + "' does not exist; this server serves '" + options_.model_name + "'", "not_found_error", "model"));
    }
    job->id = kind == ApiKind::kChat ? RandomId("chatcmpl-")
              : job->req.rid.empty() ? RandomId("cmpl-") : job->req.rid;
    job->created = UnixTime();
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
      while (!AllFinished(*job)) {
        if (stopping_) {
          Abort(*job);
          return SendError(res, Error(503, "the server is shutting down", "server_error"));
        }
        Collect(*job, std::chrono::milliseconds(100), nullptr);
      }
      for (const auto& c : job->choices) {
        if (!c.final.error.ok()) {
          return SendError(res, Error(500, c.final.error.message(), "server_error"));
        }
      }
      return SendJson(res, 200, FinalResponse(*job));
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job](size_t, httplib::DataSink& sink) { return Pump(job, sink); },
        [this, job](bool) { Abort(*job); });  // ends or client gone: free what is left
  }

  static bool AllFinished(const Job& job) {
    for (const auto& c : job.choices) {
      if (!c.finished) return false;
    }
    return true;
  }

  void Abort(Job& job) {
    for (auto& c : job.choices) {
      if (!c.finished) engine_->Abort(c.stream);
    }
  }

  // Pops pending events of every choice into its state; `chunks` (streaming) receives the SSE
  // payloads to send.
  void Collect(Job& job, std::chrono::milliseconds wait, std::vector<json>* chunks) {
    bool any = false;
    for (size_t i = 0; i < job.choices.size(); ++i) {
      Choice& c = job.choices[i];
      if (c.finished) continue;
      // Wait only on the first unfinished choice, poll the others.
      auto events = c.stream->Pop(any ? std::chrono::milliseconds(0) : wait);
      any = true;
      for (auto& ev : events) {
        const size_t first = c.tokens.size();
        c.text += ev.text;
        for (size_t k = 0; k < ev.tokens.size(); ++k) {
          // The token that matched a stop condition is not part of the output.
          if (ev.finished && ev.stop_token >= 0 && k + 1 == ev.tokens.size()) break;
          c.tokens.push_back(ev.tokens[k]);
          c.logprobs.push_back(ev.logprobs[k]);
          c.top.push_back(ev.top_logprobs[k]);
        }
        if (ev.finished) {
          c.finished = true;
          c.final = ev;
        }
        if (chunks) StreamChunk(job, i, ev, first, chunks);
      }
    }
  }

  static const char* FinishName(const engine::StreamEvent& ev) {
    if (!ev.finished) return nullptr;
    switch (ev.finish) {
      case engine::FinishReason::kStop: return "stop";
      case engine::FinishReason::kLength: return "length";
      default: return "abort";
    }
  }

  json CompletionLogprobs(const Choice& c, size_t from, size_t to) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    size_t offset = 0;
    for (size_t k = from; k < to; ++k) {
      const std::string piece = codec_->Piece(c.tokens[k]);
      tokens.push_back(piece);
      lps.push_back(c.logprobs[k]);
      json top = json::object();
      for (const auto& t : c.top[k]) top[codec_->Piece(t.token)] = t.logprob;
      tops.push_back(top);
      offs.push_back(offset);
      offset += piece.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops},
            {"text_offset", offs}};
  }

  static json Bytes(const std::string& s) {
    json b = json::array();
    for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
    return b;
  }

  json ChatLogprobs(const Choice& c, size_t from, size_t to) const {
    json content = json::array();
    for (size_t k = from; k < to; ++k) {
      const std::string piece = codec_->Piece(c.tokens[k]);
      json top = json::array();
      for (const auto& t : c.top[k]) {
        const std::string p = codec_->Piece(t.token);
        top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", Bytes(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", c.logprobs[k]}, {"bytes", Bytes(piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  json Usage(const Job& job) const {
    int64_t prompt = 0, completion = 0, cached = 0;
    // n choices of one prompt count the prompt once, as OpenAI does.
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const auto& f = job.choices[i].final;
      if (i % job.req.n == 0) {
        prompt += f.prompt_tokens;
        cached += f.cached_tokens;
      }
      completion += static_cast<int64_t>(job.choices[i].tokens.size()) +
                    (f.stop_token >= 0 ? 1 : 0);
    }
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  json MetaInfo(const Job& job, const Choice& c) const {
    json meta = {{"id", c.stream->rid()},
                 {"prompt_tokens", c.final.prompt_tokens},
                 {"completion_tokens", static_cast<int64_t>(c.tokens.size()) + (c.final.stop_token >= 0 ? 1 : 0)},
                 {"cached_tokens", c.final.cached_tokens},
                 {"e2e_latency", std::chrono::duration<double>(Clock::now() - job.start).count()}};
    if (c.finished) {
      json fr = {{"type", FinishName(c.final)}};
      if (!c.final.stop_matched.empty()) fr["matched"] = c.final.stop_matched;
      else if (c.final.stop_token >= 0) fr["matched"] = c.final.stop_token;
      meta["finish_reason"] = fr;
    } else {
      meta["finish_reason"] = nullptr;
    }
    if (job.req.logprobs >= 0) {
      json out = json::array();
      for (size_t k = 0; k < c.tokens.size(); ++k) out.push_back({c.logprobs[k], c.tokens[k], nullptr});
      meta["output_token_logprobs"] = out;
    }
    return meta;
  }

  json FinalResponse(const Job& job) const {
    const ApiRequest& r = job.req;
    if (r.kind == ApiKind::kGenerate) {
      json all = json::array();
      for (const auto& c : job.choices) {
        all.push_back({{"text", c.text}, {"output_ids", c.tokens}, {"meta_info", MetaInfo(job, c)}});
      }
      return all.size() == 1 ? all[0] : all;
    }
    json choices = json::array();
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const Choice& c = job.choices[i];
      json ch = {{"index", i}, {"finish_reason", FinishName(c.final)}};
      if (!c.final.stop_matched.empty()) ch["matched_stop"] = c.final.stop_matched;
      if (r.kind == ApiKind::kChat) {
        ch["message"] = {{"role", "assistant"}, {"content", c.text}};
        ch["logprobs"] = r.chat_logprobs ? ChatLogprobs(c, 0, c.tokens.size()) : json(nullptr);
      } else {
        std::string text = c.text;
        if (r.echo) text = r.prompt_texts[i / r.n] + text;
        ch["text"] = text;
        ch["logprobs"] = r.logprobs >= 0 ? CompletionLogprobs(c, 0, c.tokens.size()) : json(nullptr);
      }
      choices.push_back(ch);
    }
    return {{"id", job.id},
            {"object", r.kind == ApiKind::kChat ? "chat.completion" : "text_completion"},
            {"created", job.created},
            {"model", options_.model_name},
            {"choices", choices},
            {"usage", Usage(job)}};
  }

  // The SSE payload(s) for one event of choice i. `first`: index of the event's first token.
  void StreamChunk(const Job& job, size_t i, const engine::StreamEvent& ev, size_t first,
                   std::vector<json>* chunks) {
    const ApiRequest& r = job.req;
    Choice& c = const_cast<Job&>(job).choices[i];
    if (!ev.error.ok() && ev.error.code() != StatusCode::kCancelled) {
      chunks->push_back(Error(500, ev.error.message(), "server_error").ToJson());
      return;
    }
    if (r.kind == ApiKind::kGenerate) {
      json chunk = {{"text", c.text}, {"output_ids", c.tokens}, {"meta_info", MetaInfo(job, c)},
                    {"index", i}};
      chunks->push_back(chunk);
      return;
    }
    const size_t to = c.tokens.size();
    json ch = {{"index", i}, {"finish_reason", ev.finished ? json(FinishName(ev)) : json(nullptr)}};
    if (r.kind == ApiKind::kChat) {
      json delta = json::object();
      if (!c.sent_role) {
        delta["role"] = "assistant";
        c.sent_role = true;
      }
      if (!ev.text.empty() || !ev.finished) delta["content"] = ev.text;
      ch["delta"] = delta;
      ch["logprobs"] = r.chat_logprobs ? ChatLogprobs(c, first, to) : json(nullptr);
    } else {
      ch["text"] = ev.text;
      ch["logprobs"] = r.logprobs >= 0 ? CompletionLogprobs(c, first, to) : json(nullptr);
    }
    if (ev.finished && !ev.stop_matched.empty()) ch["matched_stop"] = ev.stop_matched;
    chunks->push_back({{"id", job.id},
                       {"object", r.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
                       {"created", job.created},
                       {"model", options_.model_name},
                       {"choices", json::array({ch})}});
  }

  bool Pump(const std::shared_ptr<Job>& job, httplib::DataSink& sink) {
    try {
      if (job->done_sent) {
        sink.done();
        return true;
      }
      if (stopping_) {
        Abort(*job);
        return false;
      }
      std::vector<json> chunks;
      Collect(*job, std::chrono::milliseconds(50), &chunks);
      std::string out;
      for (const auto& c : chunks) out += "data: " + Dump(c) + "\n\n";
      if (AllFinished(*job)) {
        if (job->req.include_usage && job->req.kind != ApiKind::kGenerate) {
          out += "data: " + Dump({{"id", job->id},
                                  {"object", job->req.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
                                  {"created", job->created},
                                  {"model", options_.model_name},
                                  {"choices", json::array()},
                                  {"usage", Usage(*job)}}) + "\n\n";
        }
        out += "data: [DONE]\n\n";
        job->done_sent = true;
      }
      if (!out.empty()) {
        if (!sink.write(out.data(), out.size())) {
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
  httplib::Server svr_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  int64_t started_ = UnixTime();
};

HttpServer::HttpServer(ServerOptions options, engine::Engine* engine, const TextCodec* codec)
    : impl_(std::make_unique<Impl>(std::move(options), engine, codec)) {}
HttpServer::~HttpServer() = default;
Status HttpServer::Bind() { return impl_->Bind(); }
void HttpServer::Run() { impl_->Run(); }
void HttpServer::Stop() { impl_->Stop(); }
int HttpServer::port() const { return impl_->port(); }

}  // namespace polychip::server
