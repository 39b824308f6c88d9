// OpenAI's Responses API as a translation of the chat route: /v1/responses bodies (input as a
// string or items, instructions, function tools, text.format, previous_response_id) become
// chat bodies, and answers become a "response" with output items (message, function_call),
// streamed as the Responses events: response.created, response.in_progress, then per item
// response.output_item.added, its deltas and .done events, response.output_item.done, and
// response.completed (or response.incomplete at max_output_tokens). Responses asked to be
// stored are kept in a ResponseStore for previous_response_id and GET /v1/responses/{id}.
// https://platform.openai.com/docs/api-reference/responses
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

json Plain(const ordered& v) { return json::parse(v.dump()); }

// A message item's content: a string, or input_text / output_text parts.
std::optional<ApiError> ContentText(const ordered& content, const std::string& param,
                                    std::string* out) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return BadRequest(param, "'" + param + "' must be a string or an array");
  for (size_t j = 0; j < content.size(); ++j) {
    const ordered& part = content[j];
    const std::string at = param + "." + std::to_string(j);
    const std::string type = StringMember(part, "type");
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!part.contains("text") || !part["text"].is_string()) {
        return BadRequest(at + ".text", "'" + at + ".text' must be a string");
      }
      *out += part["text"].get<std::string>();
    } else if (type == "refusal") {
      *out += StringMember(part, "refusal");
    } else {
      return BadRequest(at, "'" + at + "': content of type '" + type +
                         "' is not supported by this server (text only)");
    }
  }
  return std::nullopt;
}

// Appends the input items to `messages` as chat messages: function_call items join the
// assistant turn before them as tool_calls, function_call_output items become `tool`
// messages, reasoning handed back is dropped (chat templates drop earlier reasoning).
std::optional<ApiError> AddInput(const ordered& input, ordered* messages) {
  if (input.is_string()) {
    messages->push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return BadRequest("input", "'input' must be a string or an array of items");
  for (size_t k = 0; k < input.size(); ++k) {
    const ordered& item = input[k];
    const std::string at = "input." + std::to_string(k);
    if (!item.is_object()) return BadRequest(at, "'" + at + "' must be an object");
    const std::string type = HasValue(item, "type") ? StringMember(item, "type") : "message";
    if (type == "message") {
      PC_API_TRY(CheckFields(item, at, {"type", "role", "content", "id", "status"}, {}));
      std::string role = StringMember(item, "role");
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system") {
        return BadRequest(at + ".role", "'" + at + ".role' must be user, assistant, system or developer");
      }
      if (!item.contains("content")) return BadRequest(at + ".content", "'content' is required");
      std::string text;
      PC_API_TRY(ContentText(item["content"], at + ".content", &text));
      messages->push_back({{"role", role}, {"content", text}});
    } else if (type == "function_call") {
      PC_API_TRY(
          CheckFields(item, at, {"type", "call_id", "name", "arguments", "id", "status"}, {}));
      if (StringMember(item, "call_id").empty() || StringMember(item, "name").empty() ||
          !item.contains("arguments") || !item["arguments"].is_string()) {
        return BadRequest(at, "'" + at +
                           "': a function_call needs 'call_id', 'name' and 'arguments' "
                           "(strings)");
      }
      ordered call = {{"id", item["call_id"]},
                      {"type", "function"},
                      {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      ordered* last = messages->empty() ? nullptr : &messages->back();
      if (last && StringMember(*last, "role") == "assistant") {
        if (!last->contains("tool_calls")) (*last)["tool_calls"] = ordered::array();
        (*last)["tool_calls"].push_back(std::move(call));
      } else {
        messages->push_back(
            {{"role", "assistant"}, {"content", ""}, {"tool_calls", ordered::array({call})}});
      }
    } else if (type == "function_call_output") {
      PC_API_TRY(CheckFields(item, at, {"type", "call_id", "output", "id", "status"}, {}));
      if (StringMember(item, "call_id").empty() || !item.contains("output")) {
        return BadRequest(at, "'" + at + "': a function_call_output needs 'call_id' and 'output'");
      }
      std::string output;
      PC_API_TRY(ContentText(item["output"], at + ".output", &output));
      messages->push_back(
          {{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", output}});
    } else if (type == "reasoning") {
      continue;
    } else {
      return BadRequest(at + ".type", "input items of type '" + type +
                                   "' are not supported by this server (message, function_call, "
                                   "function_call_output, reasoning)");
    }
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
      if (StringMember(t, "type") != "function") {
        return BadRequest(at + ".type", "tools of type '" + StringMember(t, "type") +
                                     "' are not supported by this server (function tools only)");
      }
      PC_API_TRY(
          CheckFields(t, at, {"type", "name", "description", "parameters", "strict"}, {}));
      if (StringMember(t, "name").empty()) return BadRequest(at + ".name", "'" + at + ".name' must be a string");
      ordered fn = {{"name", t["name"]}};
      if (t.contains("description") && t["description"].is_string()) {
        fn["description"] = t["description"];
      }
      if (HasValue(t, "parameters")) fn["parameters"] = t["parameters"];
      list.push_back({{"type", "function"}, {"function", fn}});
    }
    (*chat)["tools"] = std::move(list);
  }
  if (HasValue(body, "tool_choice")) {
    const ordered& tc = body["tool_choice"];
    if (tc.is_string()) {
      (*chat)["tool_choice"] = tc;  // auto, none, required: the chat parser checks
    } else if (StringMember(tc, "type") == "function") {
      PC_API_TRY(CheckFields(tc, "tool_choice", {"type", "name"}, {}));
      if (StringMember(tc, "name").empty()) {
        return BadRequest("tool_choice.name", "'tool_choice.name' must name a function");
      }
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      return BadRequest("tool_choice",
                 "'tool_choice' must be auto, none, required or "
                 "{\"type\": \"function\", \"name\": ...}");
    }
  }
  if (HasValue(body, "parallel_tool_calls")) {
    (*chat)["parallel_tool_calls"] = body["parallel_tool_calls"];
  }
  return std::nullopt;
}

std::optional<ApiError> AddTextFormat(const ordered& body, ordered* chat) {
  if (!HasValue(body, "text")) return std::nullopt;
  const ordered& text = body["text"];
  PC_API_TRY(CheckFields(text, "text", {"format", "verbosity"}, {}));
  if (!HasValue(text, "format")) return std::nullopt;
  const ordered& f = text["format"];
  const std::string type = StringMember(f, "type");
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    PC_API_TRY(CheckFields(f, "text.format", {"type"}, {}));
    (*chat)["response_format"] = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    PC_API_TRY(
        CheckFields(f, "text.format", {"type", "name", "schema", "strict", "description"}, {}));
    if (!f.contains("schema") || !f["schema"].is_object()) {
      return BadRequest("text.format.schema", "'text.format.schema' must be a JSON Schema object");
    }
    ordered js = {{"name", StringMember(f, "name").empty() ? "output" : StringMember(f, "name")},
                  {"schema", f["schema"]}};
    (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  } else {
    return BadRequest("text.format.type", "'text.format.type' must be text, json_object or json_schema");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ResponsesToChat(const ordered& body, const ParseLimits& limits,
                                        DialectRequest* out) {
  if (!body.is_object()) return BadRequest("", "the request body must be a JSON object");
  PC_API_TRY(CheckFields(
      body, "",
      {"model", "input", "instructions", "previous_response_id", "tools", "tool_choice",
       "parallel_tool_calls", "text", "max_output_tokens", "temperature", "top_p", "reasoning",
       "store", "metadata", "user", "stream", "stream_options", "truncation", "service_tier",
       "include", "background", "prompt_cache_key", "safety_identifier",
       // polychip's own, as on the chat route (bench-serving sends ignore_eos)
       "ignore_eos", "seed"},
      {"top_logprobs", "max_tool_calls", "prompt", "conversation"}));
  if (HasValue(body, "background") && body["background"] != false) {
    return BadRequest("background", "'background' responses are not supported by this server");
  }
  // OpenAI's ranges (the chat parser allows wider ones for other clients).
  if (HasValue(body, "temperature") &&
      !(body["temperature"].is_number() && body["temperature"].get<double>() >= 0 &&
        body["temperature"].get<double>() <= 2)) {
    return BadRequest("temperature", "'temperature' must be a number in [0, 2]");
  }
  ordered chat = ordered::object();
  for (const char* key : {"model", "stream", "temperature", "top_p", "ignore_eos", "seed"}) {
    if (HasValue(body, key)) chat[key] = body[key];
  }
  if (HasValue(body, "max_output_tokens")) chat["max_tokens"] = body["max_output_tokens"];
  PC_API_TRY(AddTools(body, &chat));
  PC_API_TRY(AddTextFormat(body, &chat));
  if (HasValue(body, "reasoning")) {
    PC_API_TRY(
        CheckFields(body["reasoning"], "reasoning", {"effort", "summary", "generate_summary"}, {}));
  }
  bool store = true;
  if (HasValue(body, "store")) {
    if (!body["store"].is_boolean()) return BadRequest("store", "'store' must be a boolean");
    store = body["store"].get<bool>();
  }

  // The conversation: the previous response's, then this input. Instructions are not carried
  // over from a previous response (as OpenAI does): they lead this request only.
  ordered conversation = ordered::array();
  if (HasValue(body, "previous_response_id")) {
    if (!body["previous_response_id"].is_string()) {
      return BadRequest("previous_response_id", "'previous_response_id' must be a string");
    }
    const std::string prev = body["previous_response_id"].get<std::string>();
    std::optional<ResponseStore::Entry> entry;
    if (limits.responses) entry = limits.responses->Get(prev);
    if (!entry) {
      return BadRequest("previous_response_id", limits.responses ? limits.responses->Missing(prev)
                                                          : "this server does not store responses");
    }
    conversation = ordered::parse(entry->conversation.dump());
  }
  if (!HasValue(body, "input")) return BadRequest("input", "'input' is required");
  PC_API_TRY(AddInput(body["input"], &conversation));
  if (conversation.empty()) return BadRequest("input", "'input' holds no message");

  ordered messages = ordered::array();
  if (HasValue(body, "instructions")) {
    if (!body["instructions"].is_string()) {
      return BadRequest("instructions", "'instructions' must be a string");
    }
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  for (const auto& m : conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);

  // What the response repeats.
  json echo = {{"instructions", nullptr},
               {"max_output_tokens", nullptr},
               {"metadata", json::object()},
               {"parallel_tool_calls", true},
               {"previous_response_id", nullptr},
               {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
               {"store", store},
               {"temperature", 1.0},
               {"text", {{"format", {{"type", "text"}}}}},
               {"tool_choice", "auto"},
               {"tools", json::array()},
               {"top_p", 1.0},
               {"truncation", "disabled"},
               {"user", nullptr}};
  for (auto& [key, value] : echo.items()) {
    if (HasValue(body, key.c_str())) value = Plain(body[key]);
  }
  out->state = {{"echo", std::move(echo)}, {"conversation", Plain(conversation)}, {"store", store}};
  out->chat = std::move(chat);
  return std::nullopt;
}

namespace {

json Usage(const Choice& c) {
  const int64_t output = static_cast<int64_t>(c.tokens.size()) + (c.final.stop_token >= 0 ? 1 : 0);
  return {{"input_tokens", c.final.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", c.final.cached_tokens}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", c.final.prompt_tokens + output}};
}

json TextPart(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", json::array()}};
}

json MessageItem(const std::string& id, const std::string& status, json content) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

json ReasoningItem(const std::string& id, const std::string& status, const std::string& text) {
  json content = json::array();
  if (!text.empty()) content.push_back({{"type", "reasoning_text"}, {"text", text}});
  return {{"id", id},
          {"type", "reasoning"},
          {"status", status},
          {"summary", json::array()},
          {"content", std::move(content)}};
}

json CallItem(const std::string& id, const std::string& status, const std::string& call_id,
              const std::string& name, const std::string& arguments) {
  return {{"id", id},     {"type", "function_call"}, {"status", status}, {"call_id", call_id},
          {"name", name}, {"arguments", arguments}};
}

class ResponsesStream : public StreamState {
 public:
  explicit ResponsesStream(const ApiRequest& req) : answer(req) {}
  AnswerPartStreamer answer;
  int64_t seq = 0;
  enum class Open { kNone, kReasoning, kMessage, kCall } open = Open::kNone;
  json item;         // the open item
  std::string text;  // its text or arguments so far
  json output = json::array();
};

class ResponsesWriter : public ResponseWriter {
 public:
  ResponsesWriter(std::string model, ResponseStore* store)
      : model_(std::move(model)), store_(store) {}

  json Final(const Job& job) const override {
    const Choice& c = job.choices[0];
    const AnswerParts a = SplitAnswer(job.req, c.text);
    json output = json::array();
    if (!a.reasoning.empty()) {
      output.push_back(ReasoningItem(RandomId("rs_"), "completed", a.reasoning));
    }
    if (!a.text.empty() || a.calls.empty()) {
      output.push_back(MessageItem(RandomId("msg_"), "completed", json::array({TextPart(a.text)})));
    }
    for (const ToolCall& call : a.calls) {
      output.push_back(CallItem(RandomId("fc_"), "completed", call.id, call.name, call.arguments));
    }
    return Complete(job, c, std::move(output));
  }

  void StreamStart(Job& job, std::vector<SseEvent>* out) const override {
    auto& st = State(job);
    json r = Response(job, "in_progress");
    Emit(st, "response.created", {{"response", r}}, out);
    Emit(st, "response.in_progress", {{"response", r}}, out);
  }

  void StreamEvents(Job& job, size_t i, const engine::StreamEvent& ev, size_t,
                    std::vector<SseEvent>* out) const override {
    auto& st = State(job);
    std::vector<AnswerPart> parts;
    st.answer.Feed(ev.text, ev.finished, &parts);
    for (AnswerPart& p : parts) {
      switch (p.kind) {
        case AnswerPart::Kind::kReasoning:
          if (st.open != ResponsesStream::Open::kReasoning) {
            Close(st, out);
            st.open = ResponsesStream::Open::kReasoning;
            st.item = ReasoningItem(RandomId("rs_"), "in_progress", "");
            Emit(st, "response.output_item.added",
                 {{"output_index", st.output.size()}, {"item", st.item}}, out);
          }
          st.text += p.text;
          Emit(st, "response.reasoning_text.delta", Indexed(st, {{"delta", p.text}}), out);
          break;
        case AnswerPart::Kind::kText:
          if (st.open != ResponsesStream::Open::kMessage) {
            Close(st, out);
            st.open = ResponsesStream::Open::kMessage;
            st.item = MessageItem(RandomId("msg_"), "in_progress", json::array());
            Emit(st, "response.output_item.added",
                 {{"output_index", st.output.size()}, {"item", st.item}}, out);
            Emit(st, "response.content_part.added", PartFields(st, TextPart("")), out);
          }
          st.text += p.text;
          Emit(st, "response.output_text.delta",
               Indexed(st, {{"delta", p.text}, {"logprobs", json::array()}}), out);
          break;
        case AnswerPart::Kind::kCallStart:
          Close(st, out);
          st.open = ResponsesStream::Open::kCall;
          st.item = CallItem(RandomId("fc_"), "in_progress", p.call_id, p.name, "");
          Emit(st, "response.output_item.added",
               {{"output_index", st.output.size()}, {"item", st.item}}, out);
          break;
        case AnswerPart::Kind::kCallArguments:
          if (st.open != ResponsesStream::Open::kCall) break;
          st.text += p.text;
          Emit(st, "response.function_call_arguments.delta",
               {{"item_id", st.item["id"]}, {"output_index", st.output.size()}, {"delta", p.text}},
               out);
          break;
      }
    }
    if (!ev.finished) return;
    Close(st, out);
    const Choice& c = job.choices[i];
    if (ev.finish == engine::FinishReason::kNone) {  // cancelled (the server is stopping)
      json r = Response(job, "failed");
      r["output"] = st.output;
      r["error"] = {{"code", "server_error"},
                    {"message", "the request was cancelled: the server is shutting down"}};
      Emit(st, "response.failed", {{"response", r}}, out);
      return;
    }
    json r = Complete(job, c, st.output);
    Emit(st, r["status"] == "completed" ? "response.completed" : "response.incomplete",
         {{"response", r}}, out);
  }

  bool EndsWithDone() const override { return false; }

  SseEvent StreamError(Job& job, const ApiError& e) const override {
    auto& st = State(job);
    return {"error",
            {{"type", "error"},
             {"code", e.type},
             {"message", e.message},
             {"param", e.param.empty() ? json(nullptr) : json(e.param)},
             {"sequence_number", st.seq++}}};
  }

 private:
  static ResponsesStream& State(Job& job) {
    Choice& c = job.choices[0];
    if (!c.stream_state) c.stream_state = std::make_shared<ResponsesStream>(job.req);
    return static_cast<ResponsesStream&>(*c.stream_state);
  }

  static void Emit(ResponsesStream& st, const char* type, json fields, std::vector<SseEvent>* out) {
    fields["type"] = type;
    fields["sequence_number"] = st.seq++;
    out->push_back({type, std::move(fields)});
  }

  // item_id, output_index and content_index of the open message's text, with `fields`.
  static json Indexed(const ResponsesStream& st, json fields) {
    fields["item_id"] = st.item["id"];
    fields["output_index"] = st.output.size();
    fields["content_index"] = 0;
    return fields;
  }
  static json PartFields(const ResponsesStream& st, json part) {
    return Indexed(st, {{"part", std::move(part)}});
  }

  // Ends the open item with its .done events.
  static void Close(ResponsesStream& st, std::vector<SseEvent>* out) {
    if (st.open == ResponsesStream::Open::kMessage) {
      Emit(st, "response.output_text.done",
           Indexed(st, {{"text", st.text}, {"logprobs", json::array()}}), out);
      Emit(st, "response.content_part.done", PartFields(st, TextPart(st.text)), out);
      st.item["content"] = json::array({TextPart(st.text)});
    } else if (st.open == ResponsesStream::Open::kReasoning) {
      Emit(st, "response.reasoning_text.done", Indexed(st, {{"text", st.text}}), out);
      st.item = ReasoningItem(st.item["id"], "completed", st.text);
    } else if (st.open == ResponsesStream::Open::kCall) {
      Emit(st, "response.function_call_arguments.done",
           {{"item_id", st.item["id"]},
            {"output_index", st.output.size()},
            {"name", st.item["name"]},
            {"arguments", st.text}},
           out);
      st.item["arguments"] = st.text;
    } else {
      return;
    }
    st.item["status"] = "completed";
    Emit(st, "response.output_item.done", {{"output_index", st.output.size()}, {"item", st.item}},
         out);
    st.output.push_back(std::move(st.item));
    st.open = ResponsesStream::Open::kNone;
    st.text.clear();
  }

  json Response(const Job& job, const char* status) const {
    json r = {{"id", job.id},     {"object", "response"},    {"created_at", job.created},
              {"status", status}, {"error", nullptr},        {"incomplete_details", nullptr},
              {"model", model_},  {"output", json::array()}, {"usage", nullptr}};
    if (job.req.dialect.contains("echo")) r.update(job.req.dialect["echo"]);
    return r;
  }

  // The finished response; stored when the request asked for it.
  json Complete(const Job& job, const Choice& c, json output) const {
    const bool incomplete = c.final.finish == engine::FinishReason::kLength;
    json r = Response(job, incomplete ? "incomplete" : "completed");
    if (incomplete) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["usage"] = Usage(c);
    r["output"] = std::move(output);
    if (store_ && job.req.dialect.value("store", false)) {
      json conversation = job.req.dialect.value("conversation", json::array());
      json answer = {{"role", "assistant"}, {"content", ""}};
      for (const auto& item : r["output"]) {
        if (item["type"] == "message") {
          answer["content"] = item["content"][0]["text"];
        } else if (item["type"] == "function_call") {
          if (!answer.contains("tool_calls")) answer["tool_calls"] = json::array();
          answer["tool_calls"].push_back(
              {{"id", item["call_id"]},
               {"type", "function"},
               {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
        }
      }
      conversation.push_back(std::move(answer));
      store_->Put(job.id, {r, std::move(conversation)});
    }
    return r;
  }

  std::string model_;
  ResponseStore* store_;
};

}  // namespace

std::unique_ptr<ResponseWriter> MakeResponsesWriter(std::string model_name, ResponseStore* store) {
  return std::make_unique<ResponsesWriter>(std::move(model_name), store);
}

}  // namespace polychip::server
