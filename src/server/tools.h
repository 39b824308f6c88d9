// Tool calls on /v1/chat/completions (internal to the server module): the request's `tools`
// and `tool_choice`, rendered into the prompt the way the model family's chat template does
// (Hermes <tool_call> blocks in ChatML for qwen2-family models, the JSON form of llama-3.x),
// the grammar that forces a call (tool_choice "required" or a named function: the arguments
// always satisfy the function's JSON Schema), and the parser of the model's answer.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"

namespace polychip::server {

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON Schema (keys in their declared order)
};

struct ToolRequest {
  enum class Choice { kAuto, kNone, kRequired, kNamed };
  std::vector<ToolSpec> tools;
  Choice choice = Choice::kAuto;
  std::string named;  // kNamed: the function
  bool parallel = true;
  bool active() const { return !tools.empty() && choice != Choice::kNone; }
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// Reads tools / tool_choice / parallel_tool_calls. `raw_body` keeps the schemas' key order.
std::optional<ApiError> ParseTools(const nlohmann::json& body, std::string_view raw_body,
                                   ToolRequest* out);

// Rewrites `messages` (the request's, as JSON) into plain {role, content} messages for the
// chat template: the tool list joins the system prompt, an assistant's tool_calls become the
// text the model would have written, `tool` results the family's tool-response turn.
nlohmann::json RenderToolMessages(std::string_view chat_format, const ToolRequest& tools,
                                  const nlohmann::json& messages);

// The EBNF that forces a call (tool_choice required or named); nullopt when none is forced.
StatusOr<std::optional<std::string>> ToolCallGrammar(std::string_view chat_format,
                                                     const ToolRequest& tools);

// Finds the calls in a finished answer; `content` receives the text outside them (empty when
// it is only whitespace around calls). A call whose body is not `{"name": <a known tool>,
// "arguments" (or "parameters"): <JSON>}` stays in the content. Runs ToolCallStreamer over
// the whole text, so a streamed answer reassembles to the same calls and content.
std::vector<ToolCall> ParseToolCalls(std::string_view chat_format, const ToolRequest& tools,
                                     std::string_view text, std::string* content);

// One streamed piece of a call (OpenAI's delta.tool_calls entry): the first of a call carries
// its id and name (`first`), the later ones fragments of its arguments as they are generated.
struct ToolCallDelta {
  size_t index = 0;  // of the call in the answer
  bool first = false;
  std::string id, name;
  std::string arguments;
};

// The incremental parser of an answer with tool calls: fed the answer as it grows, it tells
// what is new, content text and call deltas. Text that may still turn out to be a call (a
// prefix of "<tool_call>", whitespace before a call) is held back until it is known.
class ToolCallStreamer {
 public:
  ToolCallStreamer(std::string_view chat_format, const ToolRequest& tools);

  // `text`: the bytes generated since the last call; `finished`: the answer is complete.
  void Feed(std::string_view text, bool finished, std::string* content,
            std::vector<ToolCallDelta>* deltas);

  // Once finished: the calls that parsed completely and validly (a streamed call that turned
  // out malformed at its end is not among them), and all of the content fed out.
  const std::vector<ToolCall>& calls() const { return calls_; }
  const std::string& content() const { return content_; }
  bool any_call_started() const { return started_ > 0; }

 private:
  enum class State { kStart, kText, kHead, kBadCall, kArgs, kTail, kPlainText };
  enum class Head { kNeedMore, kBad, kOk };
  Head ParseHead(size_t* value_begin, std::string* name) const;
  void Step(bool finished, std::string* content, std::vector<ToolCallDelta>* deltas);
  void EmitContent(std::string_view text, std::string* content);
  void EndCall(bool valid);

  bool llama3_;
  const ToolRequest* tools_;
  std::string buf_;  // the answer so far
  size_t pos_ = 0;   // scanned up to here
  State state_;
  size_t call_begin_ = 0;  // where the current call's text begins (content if it is bad)
  size_t args_begin_ = 0;  // its arguments value
  char args_kind_ = 0;     // '{' / '[' nested, '"' string, 's' scalar
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  std::string held_ws_;        // trailing whitespace of the content, not yet sent
  bool content_seen_ = false;  // non-whitespace content sent
  size_t started_ = 0;         // calls whose first delta went out
  ToolCall current_;
  std::vector<ToolCall> calls_;
  std::string content_;
};

}  // namespace polychip::server
