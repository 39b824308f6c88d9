// Anthropic's Messages API as a translation of the chat route: /v1/messages bodies become chat
// bodies (system, content blocks, tool_use / tool_result, tools with input_schema, tool_choice,
// stop_sequences, output_config.format), and answers become a "message" with content blocks,
// streamed as Anthropic's events: message_start, ping, content_block_start / _delta / _stop
// per block, message_delta (stop_reason, usage), message_stop.
// https://docs.anthropic.com/en/api/messages, .../messages-streaming
#include <string>
#include <utility>

#include "server/answer.h"
#include "server/dialects.h"
#include "server/job.h"
#include "server/response_util.h"
#include "server/response_writer.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;

// A string, or an array of text blocks, as one text.
std::optional<ApiError> TextOf(const ordered& v, const std::string& param, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return BadRequest(param, "'" + param + "' must be a string or an array of blocks");
  for (size_t j = 0; j < v.size(); ++j) {
    const ordered& b = v[j];
    const std::string at = param + "." + std::to_string(j);
    if (StringMember(b, "type") != "text" || !b.contains("text") || !b["text"].is_string()) {
      return BadRequest(at, "'" + at + "': only text blocks are supported here");
    }
    PC_API_TRY(CheckFields(b, at, {"type", "text", "cache_control", "citations"}, {}));
    *out += b["text"].get<std::string>();
  }
  return std::nullopt;
}

// One Anthropic message as chat messages: a user turn's tool_result blocks become `tool`
// messages (before its text, as Anthropic orders them), an assistant turn's tool_use blocks
// its tool_calls. Thinking handed back is dropped, as chat templates drop earlier reasoning.
std::optional<ApiError> AddMessage(const ordered& m, size_t k, ordered* out) {
  const std::string param = "messages." + std::to_string(k);
  if (!m.is_object()) return BadRequest(param, "'" + param + "' must be an object");
  PC_API_TRY(CheckFields(m, param, {"role", "content"}, {}));
  const std::string role = StringMember(m, "role");
  if (role != "user" && role != "assistant") {
    return BadRequest(param + ".role", "'" + param + ".role' must be 'user' or 'assistant'");
  }
  if (!HasValue(m, "content")) return BadRequest(param + ".content", "'content' is required");
  const ordered& content = m["content"];
  if (content.is_string()) {
    out->push_back({{"role", role}, {"content", content}});
    return std::nullopt;
  }
  if (!content.is_array()) {
    return BadRequest(param + ".content", "'content' must be a string or an array of blocks");
  }
  std::string text;
  ordered calls = ordered::array();
  bool any_result = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const ordered& b = content[j];
    const std::string at = param + ".content." + std::to_string(j);
    const std::string type = StringMember(b, "type");
    if (type == "text") {
      std::string t;
      PC_API_TRY(TextOf(ordered::array({b}), param + ".content", &t));
      text += t;
    } else if (type == "tool_result" && role == "user") {
      PC_API_TRY(
          CheckFields(b, at, {"type", "tool_use_id", "content", "is_error", "cache_control"}, {}));
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) {
        return BadRequest(at + ".tool_use_id", "'tool_use_id' must be a string");
      }
      std::string result;
      if (HasValue(b, "content")) PC_API_TRY(TextOf(b["content"], at + ".content", &result));
      if (!text.empty()) {  // text before a result: keep the order
        out->push_back({{"role", "user"}, {"content", text}});
        text.clear();
      }
      out->push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      any_result = true;
    } else if (type == "tool_use" && role == "assistant") {
      PC_API_TRY(CheckFields(b, at, {"type", "id", "name", "input", "cache_control"}, {}));
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") ||
          !b["name"].is_string()) {
        return BadRequest(at, "'" + at + "': a tool_use block needs a string 'id' and 'name'");
      }
      const ordered input = b.contains("input") ? b["input"] : ordered::object();
      if (!input.is_object()) return BadRequest(at + ".input", "'input' must be an object");
      calls.push_back({{"id", b["id"]},
                       {"type", "function"},
                       {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
    } else if ((type == "thinking" || type == "redacted_thinking") && role == "assistant") {
      continue;
    } else if (type == "image" || type == "document" || type == "search_result" ||
               type == "container_upload") {
      return BadRequest(at, "'" + at + "': " + type + " blocks are not supported by this server");
    } else {
      return BadRequest(at,
                 "'" + at + "': a " + role + " message cannot hold a block of type '" + type + "'");
    }
  }
  if (role == "assistant") {
    ordered msg = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) msg["tool_calls"] = calls;
    out->push_back(std::move(msg));
  } else if (!text.empty() || !any_result) {
    out->push_back({{"role", "user"}, {"content", text}});
  }
  return std::nullopt;
}

std::optional<ApiError> AddTools(const ordered& body, ordered* chat) {
  if (HasValue(body, "tools")) {
    const ordered& tools = body["tools"];
    if (!tools.is_array()) return BadRequest("tools", "'tools' must be an array");
    ordered list = ordered::array();
    for (size_t i = 0; i < tools.size(); ++i) {
      const ordered& t = tools[i];
      const std::string at = "tools." + std::to_string(i);
      if (!t.is_object()) return BadRequest(at, "'" + at + "' must be an object");
      const std::string type = StringMember(t, "type");
      if (HasValue(t, "type") && type != "custom") {
        return BadRequest(at + ".type", "server tool '" + type +
                                     "' is not supported by this server "
                                     "(client tools only: name, description, input_schema)");
      }
      PC_API_TRY(CheckFields(
          t, at, {"type", "name", "description", "input_schema", "cache_control", "strict"}, {}));
      if (!t.contains("name") || !t["name"].is_string()) {
        return BadRequest(at + ".name", "'" + at + ".name' must be a string");
      }
      if (!t.contains("input_schema") || !t["input_schema"].is_object()) {
        return BadRequest(at + ".input_schema", "'" + at + ".input_schema' must be a JSON Schema object");
      }
      ordered fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) {
        fn["description"] = t["description"];
      }
      fn["parameters"] = t["input_schema"];
      list.push_back({{"type", "function"}, {"function", fn}});
    }
    chat->emplace("tools", std::move(list));
  }
  if (HasValue(body, "tool_choice")) {
    const ordered& tc = body["tool_choice"];
    if (!tc.is_object()) return BadRequest("tool_choice", "'tool_choice' must be an object");
    PC_API_TRY(
        CheckFields(tc, "tool_choice", {"type", "name", "disable_parallel_tool_use"}, {}));
    const std::string type = StringMember(tc, "type");
    if (type == "auto") {
      (*chat)["tool_choice"] = "auto";
    } else if (type == "any") {
      (*chat)["tool_choice"] = "required";
    } else if (type == "none") {
      (*chat)["tool_choice"] = "none";
    } else if (type == "tool") {
      if (!tc.contains("name") || !tc["name"].is_string()) {
        return BadRequest("tool_choice.name", "'tool_choice' of type 'tool' needs a 'name'");
      }
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return BadRequest("tool_choice.type", "'tool_choice.type' must be auto, any, tool or none");
    }
    if (HasValue(tc, "disable_parallel_tool_use")) {
      if (!tc["disable_parallel_tool_use"].is_boolean()) {
        return BadRequest("tool_choice.disable_parallel_tool_use",
                   "'disable_parallel_tool_use' must be a boolean");
      }
      (*chat)["parallel_tool_calls"] = !tc["disable_parallel_tool_use"].get<bool>();
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> MessagesToChat(const ordered& body, const ParseLimits& limits,
                                       DialectRequest* out) {
  if (!body.is_object()) return BadRequest("", "the request body must be a JSON object");
  PC_API_TRY(
      CheckFields(body, "",
                  {"model", "messages", "max_tokens", "system", "metadata", "stop_sequences",
                   "stream", "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking",
                   "service_tier", "output_config", "cache_control", "inference_geo", "speed",
                   // polychip's own, as on the chat route (bench-serving sends ignore_eos)
                   "ignore_eos", "seed"},
                  {"container", "mcp_servers", "context_management"}));
  ordered chat = ordered::object();
  // Anthropic requires a model; this server serves one, and takes its absence as that one, as
  // the chat route does.
  if (HasValue(body, "model")) {
    if (!body["model"].is_string()) return BadRequest("model", "'model' must be a string");
    chat["model"] = body["model"];
  }
  if (HasValue(body, "max_tokens")) {
    const ordered& mt = body["max_tokens"];
    if (!mt.is_number_integer() || mt.get<int64_t>() < 1) {
      return BadRequest("max_tokens", "'max_tokens' must be an integer of at least 1");
    }
    if (limits.context_length > 0 && mt.get<int64_t>() > limits.context_length) {
      return BadRequest("max_tokens", "'max_tokens' is " + mt.dump() +
                                   ", more than this server's "
                                   "context length (" +
                                   std::to_string(limits.context_length) + " tokens)");
    }
    chat["max_tokens"] = mt;
  } else if (!limits.count_only) {
    return BadRequest("max_tokens", "'max_tokens' is required");
  }
  if (HasValue(body, "stream")) chat["stream"] = body["stream"];
  if (HasValue(body, "temperature")) {
    const ordered& t = body["temperature"];
    if (!t.is_number() || t.get<double>() < 0 || t.get<double>() > 1) {
      return BadRequest("temperature", "'temperature' must be a number in [0, 1]");
    }
    chat["temperature"] = t;
  }
  for (const char* key : {"top_p", "top_k", "ignore_eos", "seed"}) {
    if (HasValue(body, key)) chat[key] = body[key];
  }
  if (HasValue(body, "stop_sequences")) {
    const ordered& stop = body["stop_sequences"];
    if (!stop.is_array()) return BadRequest("stop_sequences", "'stop_sequences' must be an array");
    for (const auto& s : stop) {
      if (!s.is_string()) return BadRequest("stop_sequences", "'stop_sequences' must hold strings");
    }
    chat["stop"] = stop;
    out->state["stop_sequences"] = json::parse(stop.dump());
  }
  if (HasValue(body, "metadata") && !body["metadata"].is_object()) {
    return BadRequest("metadata", "'metadata' must be an object");
  }
  if (HasValue(body, "thinking")) {
    const ordered& th = body["thinking"];
    const std::string type = StringMember(th, "type");
    if (type != "enabled" && type != "disabled" && type != "adaptive") {
      return BadRequest("thinking.type", "'thinking.type' must be enabled, disabled or adaptive");
    }
    PC_API_TRY(CheckFields(th, "thinking", {"type", "budget_tokens", "display"}, {}));
  }
  if (HasValue(body, "output_config")) {
    const ordered& oc = body["output_config"];
    PC_API_TRY(CheckFields(oc, "output_config", {"format"}, {"effort"}));
    if (HasValue(oc, "format")) {
      const ordered& f = oc["format"];
      PC_API_TRY(CheckFields(f, "output_config.format", {"type", "schema"}, {}));
      if (StringMember(f, "type") != "json_schema" || !f.contains("schema") || !f["schema"].is_object()) {
        return BadRequest("output_config.format",
                   "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
      }
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "output"}, {"schema", f["schema"]}}}};
    }
  }
  PC_API_TRY(AddTools(body, &chat));

  ordered messages = ordered::array();
  if (HasValue(body, "system")) {
    std::string system;
    PC_API_TRY(TextOf(body["system"], "system", &system));
    messages.push_back({{"role", "system"}, {"content", system}});
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return BadRequest("messages", "'messages' must be a non-empty array");
  }
  const ordered& list = body["messages"];
  for (size_t k = 0; k < list.size(); ++k) PC_API_TRY(AddMessage(list[k], k, &messages));
  if (StringMember(list.back(), "role") == "assistant") {
    return BadRequest("messages",
               "a final assistant message (a prefill to continue) is not supported by "
               "this server: the last message must be the user's");
  }
  chat["messages"] = std::move(messages);
  out->chat = std::move(chat);
  return std::nullopt;
}

namespace {

class AnthropicStream : public StreamState {
 public:
  explicit AnthropicStream(const ApiRequest& req) : answer(req) {}
  AnswerPartStreamer answer;
  enum class Open { kNone, kThinking, kText, kToolUse } open = Open::kNone;
  int index = -1;  // of the open block
};

class AnthropicWriter : public ResponseWriter {
 public:
  explicit AnthropicWriter(std::string model) : model_(std::move(model)) {}

  json Final(const Job& job) const override {
    const Choice& c = job.choices[0];
    const AnswerParts a = SplitAnswer(job.req, c.text);
    json content = json::array();
    // The model's reasoning as a thinking block. No signature: nothing here verifies one.
    if (!a.reasoning.empty()) {
      content.push_back({{"type", "thinking"}, {"thinking", a.reasoning}, {"signature", ""}});
    }
    if (!a.text.empty()) content.push_back({{"type", "text"}, {"text", a.text}});
    for (const ToolCall& call : a.calls) {
      json input = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
      if (!input.is_object()) input = json::object();
      content.push_back(
          {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input}});
    }
    json msg = Message(job);
    msg["content"] = content;
    SetStop(job, c.final, !a.calls.empty(), &msg);
    msg["usage"] = Usage(c);
    return msg;
  }

  void StreamStart(Job& job, std::vector<SseEvent>* out) const override {
    json msg = Message(job);
    msg["usage"] = {{"input_tokens", job.prompt_tokens}, {"output_tokens", 0}};
    out->push_back({"message_start", {{"type", "message_start"}, {"message", msg}}});
    out->push_back({"ping", {{"type", "ping"}}});
  }

  void StreamEvents(Job& job, size_t i, const engine::StreamEvent& ev, size_t,
                    std::vector<SseEvent>* out) const override {
    Choice& c = job.choices[i];
    if (!c.stream_state) c.stream_state = std::make_shared<AnthropicStream>(job.req);
    auto& st = static_cast<AnthropicStream&>(*c.stream_state);
    std::vector<AnswerPart> parts;
    st.answer.Feed(ev.text, ev.finished, &parts);
    for (AnswerPart& p : parts) {
      switch (p.kind) {
        case AnswerPart::Kind::kReasoning:
          if (st.open != AnthropicStream::Open::kThinking) {
            Open(st, AnthropicStream::Open::kThinking,
                 {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
          }
          Delta(st, {{"type", "thinking_delta"}, {"thinking", std::move(p.text)}}, out);
          break;
        case AnswerPart::Kind::kText:
          if (st.open != AnthropicStream::Open::kText) {
            Open(st, AnthropicStream::Open::kText, {{"type", "text"}, {"text", ""}}, out);
          }
          Delta(st, {{"type", "text_delta"}, {"text", std::move(p.text)}}, out);
          break;
        case AnswerPart::Kind::kCallStart:
          Open(st, AnthropicStream::Open::kToolUse,
               {{"type", "tool_use"},
                {"id", p.call_id},
                {"name", p.name},
                {"input", json::object()}},
               out);
          break;
        case AnswerPart::Kind::kCallArguments:
          Delta(st, {{"type", "input_json_delta"}, {"partial_json", std::move(p.text)}}, out);
          break;
      }
    }
    if (!ev.finished) return;
    Close(st, out);
    if (ev.finish == engine::FinishReason::kNone) {  // cancelled (the server is stopping)
      out->push_back(StreamError(job, Error(529,
                                            "the request was cancelled: the server is "
                                            "shutting down",
                                            "server_overloaded")));
      return;
    }
    json delta = json::object();
    json msg;
    SetStop(job, ev, st.answer.any_call_started(), &msg);
    delta["stop_reason"] = msg["stop_reason"];
    delta["stop_sequence"] = msg["stop_sequence"];
    out->push_back(
        {"message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", Usage(c)}}});
    out->push_back({"message_stop", {{"type", "message_stop"}}});
  }

  bool EndsWithDone() const override { return false; }

  SseEvent StreamError(Job&, const ApiError& e) const override {
    return {"error", AnthropicError(e.status, e.ToJson()).second};
  }

 private:
  static void Open(AnthropicStream& st, AnthropicStream::Open kind, json block,
                   std::vector<SseEvent>* out) {
    Close(st, out);
    st.open = kind;
    ++st.index;
    out->push_back({"content_block_start",
                    {{"type", "content_block_start"},
                     {"index", st.index},
                     {"content_block", std::move(block)}}});
  }
  static void Delta(AnthropicStream& st, json delta, std::vector<SseEvent>* out) {
    if (st.open == AnthropicStream::Open::kNone) return;  // arguments of no call: cannot be
    out->push_back(
        {"content_block_delta",
         {{"type", "content_block_delta"}, {"index", st.index}, {"delta", std::move(delta)}}});
  }
  static void Close(AnthropicStream& st, std::vector<SseEvent>* out) {
    if (st.open == AnthropicStream::Open::kNone) return;
    // A thinking block ends with its signature, empty here (nothing verifies one).
    if (st.open == AnthropicStream::Open::kThinking) {
      Delta(st, {{"type", "signature_delta"}, {"signature", ""}}, out);
    }
    out->push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", st.index}}});
    st.open = AnthropicStream::Open::kNone;
  }

  json Message(const Job& job) const {
    return {{"id", job.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_},
            {"content", json::array()},
            {"stop_reason", nullptr},
            {"stop_sequence", nullptr}};
  }

  // end_turn, max_tokens, stop_sequence (with the sequence) or tool_use.
  static void SetStop(const Job& job, const engine::StreamEvent& f, bool calls, json* msg) {
    (*msg)["stop_sequence"] = nullptr;
    if (calls) {
      (*msg)["stop_reason"] = "tool_use";
    } else if (f.finish == engine::FinishReason::kLength) {
      (*msg)["stop_reason"] = "max_tokens";
    } else if (!f.stop_matched.empty() && job.req.dialect.contains("stop_sequences")) {
      (*msg)["stop_reason"] = "stop_sequence";
      (*msg)["stop_sequence"] = f.stop_matched;
    } else {
      (*msg)["stop_reason"] = "end_turn";
    }
  }

  // Anthropic counts prompt tokens read from the cache apart from input_tokens.
  static json Usage(const Choice& c) {
    const int64_t output =
        static_cast<int64_t>(c.tokens.size()) + (c.final.stop_token >= 0 ? 1 : 0);
    return {{"input_tokens", c.final.prompt_tokens - c.final.cached_tokens},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", c.final.cached_tokens},
            {"output_tokens", output}};
  }

  std::string model_;
};

}  // namespace

std::unique_ptr<ResponseWriter> MakeAnthropicWriter(std::string model_name) {
  return std::make_unique<AnthropicWriter>(std::move(model_name));
}

}  // namespace polychip::server
