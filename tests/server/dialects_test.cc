// The Anthropic Messages and OpenAI Responses dialects without a server: their translation into
// chat requests, their refusals, the stored responses, and their event streams checked against
// the published sequences (docs.anthropic.com/en/api/messages-streaming,
// platform.openai.com/docs/api-reference/responses-streaming) for text and for tool calls.
#include "server/dialects.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/job.h"
#include "server/response_writer.h"
#include "byte_codec.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;
using testing::ByteCodec;
using testing::ByteCodecOptions;


const json kWeatherTool = {{"name", "get_weather"},
                           {"description", "The weather in a city"},
                           {"input_schema",
                            {{"type", "object"},
                             {"properties", {{"city", {{"type", "string"}}}}},
                             {"required", {"city"}}}}};

std::optional<ApiError> ToChat(ApiKind kind, const json& body, DialectRequest* d,
                               const ResponseStore* store = nullptr) {
  ParseLimits limits;
  limits.context_length = 1024;
  limits.responses = store;
  const ordered raw = ordered::parse(body.dump());
  return kind == ApiKind::kMessages ? MessagesToChat(raw, limits, d)
                                    : ResponsesToChat(raw, limits, d);
}

TEST(AnthropicMessages, TranslatesBlocksToolsAndChoice) {
  const json body = {{"model", "toy"},
                     {"max_tokens", 64},
                     {"system", json::array({{{"type", "text"}, {"text", "Be brief."}}})},
                     {"stop_sequences", {"END"}},
                     {"tools", {kWeatherTool}},
                     {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
                     {"messages",
                      {{{"role", "user"}, {"content", "Weather in Paris?"}},
                       {{"role", "assistant"},
                        {"content",
                         {{{"type", "thinking"}, {"thinking", "hm"}, {"signature", "s"}},
                          {{"type", "text"}, {"text", "Let me look."}},
                          {{"type", "tool_use"},
                           {"id", "toolu_1"},
                           {"name", "get_weather"},
                           {"input", {{"city", "Paris"}}}}}}},
                       {{"role", "user"},
                        {"content",
                         {{{"type", "tool_result"},
                           {"tool_use_id", "toolu_1"},
                           {"content", {{{"type", "text"}, {"text", "sunny"}}}}},
                          {{"type", "text"}, {"text", "And tomorrow?"}}}}}}}};
  DialectRequest d;
  ASSERT_FALSE(ToChat(ApiKind::kMessages, body, &d).has_value());
  const json chat = json::parse(d.chat.dump());
  EXPECT_EQ(chat["max_tokens"], 64);
  EXPECT_EQ(chat["stop"], json({"END"}));
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["parallel_tool_calls"], false);
  EXPECT_EQ(chat["tools"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], kWeatherTool["input_schema"]);
  const json& m = chat["messages"];
  ASSERT_EQ(m.size(), 5u) << m.dump();
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[2]["content"], "Let me look.");  // thinking handed back is dropped
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(json::parse(m[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(m[3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "sunny"}}));
  EXPECT_EQ(m[4], json({{"role", "user"}, {"content", "And tomorrow?"}}));
  // A named tool.
  json named = body;
  named["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  ASSERT_FALSE(ToChat(ApiKind::kMessages, named, &d).has_value());
  EXPECT_EQ(d.chat["tool_choice"]["function"]["name"], "get_weather");
}

TEST(AnthropicMessages, RefusesWhatItCannotHonour) {
  const json ok = {
      {"model", "toy"}, {"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto param_of = [](json body) {
    DialectRequest d;
    auto e = ToChat(ApiKind::kMessages, body, &d);
    return e ? e->param : std::string("(accepted)");
  };
  EXPECT_EQ(param_of(ok), "(accepted)");
  json b = ok;
  b.erase("max_tokens");
  EXPECT_EQ(param_of(b), "max_tokens");
  b = ok;
  b["max_tokens"] = 4096;  // over the context length
  EXPECT_EQ(param_of(b), "max_tokens");
  b = ok;
  b["temperature"] = 1.5;  // Anthropic's range is [0, 1]
  EXPECT_EQ(param_of(b), "temperature");
  b = ok;
  b["mcp_servers"] = json::array({json::object()});
  EXPECT_EQ(param_of(b), "mcp_servers");
  b = ok;
  b["frobnicate"] = 1;
  EXPECT_EQ(param_of(b), "frobnicate");
  b = ok;
  b["messages"][0]["content"] = {{{"type", "image"}, {"source", json::object()}}};
  EXPECT_EQ(param_of(b), "messages.0.content.0");
  b = ok;
  b["tools"] = {{{"type", "web_search_20250305"}, {"name", "web_search"}}};
  EXPECT_EQ(param_of(b), "tools.0.type");
  b = ok;
  b["messages"].push_back({{"role", "assistant"}, {"content", "The answer is"}});
  EXPECT_EQ(param_of(b), "messages");  // prefill
  b = ok;
  b["output_config"] = {{"effort", "high"}};
  EXPECT_EQ(param_of(b), "output_config.effort");
}

TEST(AnthropicMessages, ErrorsInAnthropicShape) {
  const json openai = {{"error", {{"message", "nope"}, {"type", "invalid_request_error"}}}};
  auto [status, body] = AnthropicError(400, openai);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(body, json({{"type", "error"},
                        {"error", {{"type", "invalid_request_error"}, {"message", "nope"}}}}));
  EXPECT_EQ(AnthropicError(401, openai).second["error"]["type"], "authentication_error");
  EXPECT_EQ(AnthropicError(404, openai).second["error"]["type"], "not_found_error");
  EXPECT_EQ(AnthropicError(413, openai).second["error"]["type"], "request_too_large");
  EXPECT_EQ(AnthropicError(500, openai).second["error"]["type"], "api_error");
  const json busy = {{"error", {{"message", "full"}, {"type", "server_overloaded"}}}};
  EXPECT_EQ(AnthropicError(503, busy).first, 529);
  EXPECT_EQ(AnthropicError(503, busy).second["error"]["type"], "overloaded_error");
}

TEST(OpenAiResponses, TranslatesItemsFormatAndPreviousResponse) {
  ResponseStore store(4);
  store.Put("resp_prev", {json{{"id", "resp_prev"}},
                          json::array({{{"role", "user"}, {"content", "My name is Ada."}},
                                       {{"role", "assistant"}, {"content", "Hello Ada."}}})});
  const json body = {
      {"model", "toy"},
      {"instructions", "Be brief."},
      {"previous_response_id", "resp_prev"},
      {"max_output_tokens", 32},
      {"text",
       {{"format", {{"type", "json_schema"}, {"name", "w"}, {"schema", {{"type", "object"}}}}}}},
      {"tools",
       {{{"type", "function"}, {"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}},
      {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
      {"input",
       {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather?"}}}}},
        {{"type", "function_call"},
         {"call_id", "call_1"},
         {"name", "get_weather"},
         {"arguments", "{\"city\":\"Paris\"}"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}}}}};
  DialectRequest d;
  ASSERT_FALSE(ToChat(ApiKind::kResponses, body, &d, &store).has_value());
  const json chat = json::parse(d.chat.dump());
  EXPECT_EQ(chat["max_tokens"], 32);
  EXPECT_EQ(chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "w");
  EXPECT_EQ(chat["tool_choice"]["function"]["name"], "get_weather");
  const json& m = chat["messages"];
  ASSERT_EQ(m.size(), 6u) << m.dump();
  EXPECT_EQ(m[0], json({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1]["content"], "My name is Ada.");  // the previous response's conversation
  EXPECT_EQ(m[2]["content"], "Hello Ada.");
  EXPECT_EQ(m[3]["content"], "Weather?");
  EXPECT_EQ(m[4]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[5], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}));
  // The stored conversation leaves the instructions out.
  EXPECT_EQ(d.state["conversation"].size(), 5u);
  EXPECT_EQ(d.state["echo"]["instructions"], "Be brief.");
  EXPECT_EQ(d.state["echo"]["previous_response_id"], "resp_prev");
}

TEST(OpenAiResponses, RefusesWhatItCannotHonour) {
  const json ok = {{"model", "toy"}, {"input", "hi"}};
  auto param_of = [](json body) {
    DialectRequest d;
    ResponseStore store(2);
    auto e = ToChat(ApiKind::kResponses, body, &d, &store);
    return e ? e->param : std::string("(accepted)");
  };
  EXPECT_EQ(param_of(ok), "(accepted)");
  json b = ok;
  b["tools"] = {{{"type", "web_search"}}};
  EXPECT_EQ(param_of(b), "tools.0.type");
  b = ok;
  b["background"] = true;
  EXPECT_EQ(param_of(b), "background");
  b = ok;
  b["tools"] = {{{"type", "function"}, {"name", "f"}}};
  b["tool_choice"] = {{"type", "function"}};
  EXPECT_EQ(param_of(b), "tool_choice.name");
  b = ok;
  b["temperature"] = 2.5;  // OpenAI's range is [0, 2]
  EXPECT_EQ(param_of(b), "temperature");
  b = ok;
  b["top_logprobs"] = 3;
  EXPECT_EQ(param_of(b), "top_logprobs");
  b = ok;
  b["input"] = {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}};
  EXPECT_EQ(param_of(b), "input.0.content.0");
  b = ok;
  b["previous_response_id"] = "resp_unknown";
  EXPECT_EQ(param_of(b), "previous_response_id");
  b = ok;
  b.erase("input");
  EXPECT_EQ(param_of(b), "input");
}

TEST(ResponseStore, KeepsTheNewestAndSaysWhyAnIdIsGone) {
  ResponseStore store(2);
  for (const char* id : {"a", "b", "c"}) store.Put(id, {json{{"id", id}}, json::array()});
  EXPECT_FALSE(store.Get("a").has_value());
  EXPECT_EQ(store.Get("b")->response["id"], "b");
  EXPECT_EQ(store.Get("c")->response["id"], "c");
  EXPECT_NE(store.Missing("a").find("dropped"), std::string::npos) << store.Missing("a");
  EXPECT_NE(store.Missing("a").find("newest 2"), std::string::npos) << store.Missing("a");
  EXPECT_TRUE(store.Delete("b"));
  EXPECT_FALSE(store.Delete("b"));
  EXPECT_NE(store.Missing("b").find("deleted"), std::string::npos);
  EXPECT_NE(store.Missing("zzz").find("never stored"), std::string::npos);
}

// Drives a dialect's writer through a generation of `pieces` as the server's stream does.
struct Drive {
  Drive(ApiKind kind, json body, ResponseStore* store = nullptr, std::string family = "chatml")
      : codec(ByteCodecOptions{.letters_above_bytes = false, .family = std::move(family)}) {
    ParseLimits limits;
    limits.context_length = 1024;
    limits.responses = store;
    limits.grammars = [] { return nullptr; };
    const std::string raw = body.dump();
    limits.raw_body = raw;
    auto e = ParseApiRequest(kind, body, codec, limits, &job.req);
    EXPECT_FALSE(e.has_value()) << e->message;
    job.writer = MakeResponseWriter(kind, &codec, "toy", store);
    job.id = kind == ApiKind::kMessages ? "msg_1" : "resp_1";
    job.prompt_tokens = 10;
    job.choices.resize(1);
  }
  std::vector<SseEvent> Run(const std::vector<std::string>& pieces,
                            engine::FinishReason finish = engine::FinishReason::kStop) {
    std::vector<SseEvent> out;
    job.writer->StreamStart(job, &out);
    Choice& c = job.choices[0];
    for (size_t k = 0; k < pieces.size(); ++k) {
      engine::StreamEvent ev;
      ev.text = pieces[k];
      ev.tokens = {1};
      ev.logprobs = {0.f};
      ev.top_logprobs = {{}};
      const size_t first = c.tokens.size();
      c.text += ev.text;
      c.tokens.push_back(1);
      if (k + 1 == pieces.size()) {
        ev.finished = true;
        ev.finish = finish;
        ev.prompt_tokens = 10;
        c.finished = true;
        c.final = ev;
      }
      job.writer->StreamEvents(job, 0, ev, first, &out);
    }
    job.writer->StreamEnd(job, &out);
    return out;
  }
  ByteCodec codec;
  Job job;
};

std::vector<std::string> Names(const std::vector<SseEvent>& events) {
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.name);
  return names;
}

// Anthropic: every event's data carries its name as "type"; blocks are opened, filled and
// closed in index order; message_delta and message_stop end the stream.
void CheckAnthropicShape(const std::vector<SseEvent>& events) {
  ASSERT_GE(events.size(), 3u);
  int open = -1, next = 0;
  for (const auto& e : events) {
    EXPECT_EQ(e.data["type"], e.name);
    if (e.name == "content_block_start") {
      EXPECT_EQ(open, -1);
      EXPECT_EQ(e.data["index"], next);
      open = next++;
    } else if (e.name == "content_block_delta") {
      EXPECT_EQ(e.data["index"], open);
    } else if (e.name == "content_block_stop") {
      EXPECT_EQ(e.data["index"], open);
      open = -1;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(events.front().name, "message_start");
  EXPECT_EQ(events[events.size() - 2].name, "message_delta");
  EXPECT_EQ(events.back().name, "message_stop");
}

TEST(AnthropicStream, TextFollowsThePublishedSequence) {
  Drive d(ApiKind::kMessages, {{"model", "toy"},
                               {"max_tokens", 8},
                               {"stream", true},
                               {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
  const auto events = d.Run({"Hel", "lo", "!"}, engine::FinishReason::kLength);
  EXPECT_EQ(Names(events), (std::vector<std::string>{"message_start", "ping", "content_block_start",
                                                     "content_block_delta", "content_block_delta",
                                                     "content_block_delta", "content_block_stop",
                                                     "message_delta", "message_stop"}));
  CheckAnthropicShape(events);
  const json& start = events[0].data["message"];
  EXPECT_EQ(start["id"], "msg_1");
  EXPECT_EQ(start["type"], "message");
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_EQ(start["content"], json::array());
  EXPECT_EQ(start["stop_reason"], nullptr);
  EXPECT_EQ(start["usage"]["input_tokens"], 10);
  EXPECT_EQ(events[2].data["content_block"], json({{"type", "text"}, {"text", ""}}));
  EXPECT_EQ(events[3].data["delta"], json({{"type", "text_delta"}, {"text", "Hel"}}));
  EXPECT_EQ(events[7].data["delta"]["stop_reason"], "max_tokens");
  EXPECT_EQ(events[7].data["usage"]["output_tokens"], 3);
}

TEST(AnthropicStream, ToolCallAsToolUseBlockWithInputJsonDeltas) {
  Drive d(ApiKind::kMessages,
          {{"model", "toy"},
           {"max_tokens", 64},
           {"stream", true},
           {"tools", {kWeatherTool}},
           {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}});
  const auto events = d.Run({"Sure.", "<tool_call>\n{\"name\": \"get_weather\", ",
                             "\"arguments\": {\"city\": ", "\"Paris\"}}\n</tool_call>"});
  CheckAnthropicShape(events);
  std::string text, partial;
  json tool_start;
  for (const auto& e : events) {
    if (e.name == "content_block_start" && e.data["content_block"]["type"] == "tool_use") {
      tool_start = e.data["content_block"];
    }
    if (e.name != "content_block_delta") continue;
    if (e.data["delta"]["type"] == "text_delta") text += e.data["delta"]["text"];
    if (e.data["delta"]["type"] == "input_json_delta") {
      partial += e.data["delta"]["partial_json"];
    }
  }
  EXPECT_EQ(text, "Sure.");
  EXPECT_EQ(tool_start["name"], "get_weather");
  EXPECT_EQ(tool_start["input"], json::object());
  EXPECT_EQ(json::parse(partial), json({{"city", "Paris"}}));
  EXPECT_EQ(events[events.size() - 2].data["delta"]["stop_reason"], "tool_use");
  // The non-streaming answer of the same text.
  const json msg = d.job.writer->Final(d.job);
  ASSERT_EQ(msg["content"].size(), 2u) << msg.dump();
  EXPECT_EQ(msg["content"][0], json({{"type", "text"}, {"text", "Sure."}}));
  EXPECT_EQ(msg["content"][1]["type"], "tool_use");
  EXPECT_EQ(msg["content"][1]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(msg["stop_reason"], "tool_use");
}

// Responses: sequence numbers count from 0; each item is added, filled and done, in output
// order; the final response.completed carries every item as its .done event gave it.
void CheckResponsesShape(const std::vector<SseEvent>& events) {
  ASSERT_GE(events.size(), 3u);
  std::vector<json> done_items;
  json open;
  for (size_t k = 0; k < events.size(); ++k) {
    const json& d = events[k].data;
    EXPECT_EQ(d["type"], events[k].name);
    EXPECT_EQ(d["sequence_number"], k);
    const std::string& n = events[k].name;
    if (n == "response.output_item.added") {
      EXPECT_TRUE(open.is_null());
      EXPECT_EQ(d["output_index"], done_items.size());
      EXPECT_EQ(d["item"]["status"], "in_progress");
      open = d["item"];
    } else if (n == "response.output_item.done") {
      EXPECT_EQ(d["item"]["id"], open["id"]);
      EXPECT_EQ(d["item"]["status"], "completed");
      done_items.push_back(d["item"]);
      open = nullptr;
    } else if (d.contains("item_id")) {
      EXPECT_EQ(d["item_id"], open["id"]) << n;
      EXPECT_EQ(d["output_index"], done_items.size()) << n;
    }
  }
  EXPECT_TRUE(open.is_null());
  EXPECT_EQ(events[0].name, "response.created");
  EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(events[1].name, "response.in_progress");
  const json& final = events.back().data["response"];
  EXPECT_EQ(final["output"], json(done_items));
}

TEST(ResponsesStream, TextFollowsThePublishedSequence) {
  ResponseStore store(4);
  Drive d(ApiKind::kResponses, {{"model", "toy"}, {"input", "hi"}, {"stream", true}}, &store);
  const auto events = d.Run({"Hel", "lo"});
  EXPECT_EQ(Names(events),
            (std::vector<std::string>{"response.created", "response.in_progress",
                                      "response.output_item.added", "response.content_part.added",
                                      "response.output_text.delta", "response.output_text.delta",
                                      "response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.completed"}));
  CheckResponsesShape(events);
  EXPECT_EQ(events[6].data["text"], "Hello");
  const json& r = events.back().data["response"];
  EXPECT_EQ(r["id"], "resp_1");
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Hello");
  EXPECT_EQ(r["usage"]["output_tokens"], 2);
  // Stored (store defaults to true) with the answer as the conversation's last turn.
  auto entry = store.Get("resp_1");
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->response, r);
  EXPECT_EQ(entry->conversation.back(), json({{"role", "assistant"}, {"content", "Hello"}}));
}

TEST(ResponsesStream, ToolCallAndLengthLimit) {
  ResponseStore store(4);
  Drive d(ApiKind::kResponses,
          {{"model", "toy"},
           {"input", "Weather?"},
           {"stream", true},
           {"store", false},
           {"tools",
            {{{"type", "function"},
              {"name", "get_weather"},
              {"parameters", kWeatherTool["input_schema"]}}}}},
          &store);
  const auto events = d.Run({"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
                             "{\"city\": \"Paris\"}}\n</tool_call>"});
  CheckResponsesShape(events);
  std::string args;
  for (const auto& e : events) {
    if (e.name == "response.function_call_arguments.delta") args += e.data["delta"];
    if (e.name == "response.function_call_arguments.done") {
      EXPECT_EQ(e.data["arguments"], args);
    }
  }
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}}));
  const json& item = events.back().data["response"]["output"][0];
  EXPECT_EQ(item["type"], "function_call");
  EXPECT_EQ(item["name"], "get_weather");
  EXPECT_EQ(item["arguments"], args);
  EXPECT_FALSE(store.Get("resp_1").has_value());  // store: false

  Drive cut(ApiKind::kResponses, {{"model", "toy"}, {"input", "hi"}, {"stream", true}});
  const auto cut_events = cut.Run({"a", "b"}, engine::FinishReason::kLength);
  CheckResponsesShape(cut_events);
  EXPECT_EQ(cut_events.back().name, "response.incomplete");
  EXPECT_EQ(cut_events.back().data["response"]["incomplete_details"]["reason"],
            "max_output_tokens");
}

// A model that reasons (qwen3's <think>): its reasoning is a thinking block before the text,
// streamed as thinking_delta and closed with a signature_delta; a Responses reasoning item
// before the message.
TEST(AnthropicStream, ReasoningAsAThinkingBlock) {
  Drive d(ApiKind::kMessages,
          {{"model", "toy"},
           {"max_tokens", 64},
           {"stream", true},
           {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
           {"messages", {{{"role", "user"}, {"content", "hi"}}}}},
          nullptr, "qwen3");
  const auto events = d.Run({"<think>", "Let me ", "think.", "</think>", "\n\nHello"});
  CheckAnthropicShape(events);
  std::string thinking, text;
  std::vector<std::string> blocks;
  bool signed_block = false;
  for (const auto& e : events) {
    if (e.name == "content_block_start") blocks.push_back(e.data["content_block"]["type"]);
    if (e.name != "content_block_delta") continue;
    const json& delta = e.data["delta"];
    if (delta["type"] == "thinking_delta") thinking += delta["thinking"];
    if (delta["type"] == "text_delta") text += delta["text"];
    if (delta["type"] == "signature_delta") signed_block = true;
  }
  EXPECT_EQ(blocks, (std::vector<std::string>{"thinking", "text"}));
  EXPECT_EQ(thinking, "Let me think.");
  EXPECT_EQ(text, "Hello");
  EXPECT_TRUE(signed_block);
  const json msg = d.job.writer->Final(d.job);
  ASSERT_EQ(msg["content"].size(), 2u) << msg.dump();
  EXPECT_EQ(msg["content"][0]["type"], "thinking");
  EXPECT_EQ(msg["content"][0]["thinking"], "Let me think.");
  EXPECT_EQ(msg["content"][1]["text"], "Hello");
}

TEST(ResponsesStream, ReasoningAsAReasoningItem) {
  Drive d(ApiKind::kResponses, {{"model", "toy"}, {"input", "hi"}, {"stream", true}}, nullptr,
          "qwen3");
  const auto events = d.Run({"<think>", "Let me ", "think.", "</think>", "\n\nHello"});
  CheckResponsesShape(events);
  std::string reasoning;
  for (const auto& e : events) {
    if (e.name == "response.reasoning_text.delta") reasoning += e.data["delta"];
    if (e.name == "response.reasoning_text.done") EXPECT_EQ(e.data["text"], reasoning);
  }
  EXPECT_EQ(reasoning, "Let me think.");
  const json& output = events.back().data["response"]["output"];
  ASSERT_EQ(output.size(), 2u) << output.dump();
  EXPECT_EQ(output[0]["type"], "reasoning");
  EXPECT_EQ(output[0]["content"][0], json({{"type", "reasoning_text"}, {"text", "Let me think."}}));
  EXPECT_EQ(output[1]["type"], "message");
  EXPECT_EQ(output[1]["content"][0]["text"], "Hello");
  const json final = d.job.writer->Final(d.job);
  EXPECT_EQ(final["output"][0]["content"], output[0]["content"]);
}

}  // namespace
}  // namespace polychip::server
