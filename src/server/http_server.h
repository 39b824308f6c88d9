// The HTTP front end: OpenAI-compatible /v1/completions, /v1/chat/completions (with SSE
// streaming), SGLang's /generate, Anthropic's /v1/messages, OpenAI's /v1/responses, and the
// operational endpoints (/health, /metrics, ...).
// HTTP worker threads parse a request, submit it to the Engine and then mostly wait on the
// request's channel; the engine thread is separate. Any failure inside a handler becomes an
// OpenAI-shaped error response ({"error": {"message", "type", "param", "code"}}); a request
// never brings the server down.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/http_limits.h"
#include "server/text_codec.h"
#include "util/status.h"

namespace polychip::model {
class LoraRegistry;  // model/lora.h
}  // namespace polychip::model

namespace polychip::server {

struct DeviceMemory {
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;
  uint64_t total_bytes = 0;
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;  // 0: any free port (see HttpServer::port())
  // Non-empty: required on the API, as "Authorization: Bearer <key>" or "x-api-key: <key>"
  // (Anthropic's clients).
  std::string api_key;
  std::string model_name = "default";           // what /v1/models reports
  std::vector<std::string> model_aliases;        // other names accepted in "model"
  int http_threads = 320;                        // >= 256 concurrent streaming clients
  HttpLimits http_limits;                        // what one request or client may take
  // On Stop(), how long running requests may take to finish before they are cancelled.
  double shutdown_timeout_s = 5;
  std::function<DeviceMemory()> device_memory;   // for /metrics; may be empty
  nlohmann::json server_info = nlohmann::json::object();  // merged into /get_server_info
  // /v1/embeddings: how the final hidden states of an input become its vector.
  engine::Pooling pooling = engine::Pooling::kLast;
  // Fields computed at each /get_server_info (the backend and its generation); may be empty.
  std::function<nlohmann::json()> live_info;
  // How many /v1/responses results are kept for previous_response_id and GET (newest first).
  size_t responses_store = 256;
  // The key of the admin routes (/admin/...); empty: api_key. With neither, they answer 403.
  std::string admin_key;
  // POST /admin/reload_plugin: the JSON body -> (HTTP status, JSON reply). Empty: 501.
  std::function<std::pair<int, nlohmann::json>(const nlohmann::json&)> reload_plugin;
  // How a chat answer's reasoning is found: "auto" (the chat template's format), "none" (it
  // stays in the content) or a format's name (ReasoningFormatName).
  std::string reasoning_parser = "auto";
  // Why no backend can serve now (a failed hot reload left none), "" when one can; /health
  // answers 503 with it. Called on the event thread: must not block. May be empty.
  std::function<std::string()> unavailable;
  bool enable_metrics = true;  // false: /metrics answers 404
  bool vllm_metrics = true;    // /metrics also carries the vllm: families (docs/metrics.md)
  // The LoRA adapters served beside the base model (server/lora_api.h); null: none, and the
  // load route answers 400.
  std::shared_ptr<model::LoraRegistry> loras;
};

class HttpServer {
 public:
  // `engine` (started by the caller) and `codec` must outlive the server.
  HttpServer(ServerOptions options, engine::Engine* engine, const TextCodec* codec);
  ~HttpServer();

  // Binds the listening socket; afterwards port() is the actual port.
  Status Bind();
  // Serves until Stop() (blocking).
  void Run();
  // Stops accepting, gives running requests options.shutdown_timeout_s to finish, cancels the
  // rest (streams end with finish_reason "abort" and [DONE]) and closes every connection;
  // returns once Run() can return.
  void Stop();
  int port() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace polychip::server
