// Tool calls and reasoning on /v1/chat/completions (internal to the server module): the
// request's `tools` and `tool_choice`; for the hand-written chat families, the tools rendered
// into the prompt as the family's template would (Hermes <tool_call> blocks in ChatML, the
// JSON form of llama-3.x); the grammar that forces a call in the model's format (tool_choice
// "required" or a named function: the arguments always satisfy the function's JSON Schema);
// and the parser of the model's answer into reasoning, content and calls (tool_format.h names
// the formats; tool_parsers.cc and tool_grammars.cc hold each format's parser and grammar).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"
#include "server/tool_format.h"

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

// Reads tools / tool_choice / parallel_tool_calls. `ordered_body`, the same body parsed with
// its keys in order (an object), gives the schemas' key order.
std::optional<ApiError> ParseTools(const nlohmann::json& body,
                                   const nlohmann::ordered_json& ordered_body, ToolRequest* out);

// Rewrites `messages` (the request's, as JSON) into plain {role, content} messages for the
// chat template: the tool list joins the system prompt, an assistant's tool_calls become the
// text the model would have written, `tool` results the family's tool-response turn.
nlohmann::json RenderToolMessages(std::string_view chat_format, const ToolRequest& tools,
                                  const nlohmann::json& messages);

// The format of a name given by the caller: a tool format (ToolFormatName) or a hand-written
// chat family (model::ChatFormatName).
OutputFormat OutputFormatByName(std::string_view name);

// The EBNF that forces a call (tool_choice required or named) in the format; nullopt when none
// is forced. `starts_in_reasoning`: the prompt opened the reasoning block, the grammar closes it.
StatusOr<std::optional<std::string>> ToolCallGrammar(const OutputFormat& format,
                                                     const ToolRequest& tools,
                                                     bool starts_in_reasoning = false);
inline StatusOr<std::optional<std::string>> ToolCallGrammar(std::string_view format,
                                                            const ToolRequest& tools) {
  return ToolCallGrammar(OutputFormatByName(format), tools);
}

// An answer split into its parts. Calls have no ids yet.
struct ParsedAnswer {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> calls;
  bool last_call_open = false;  // partial: the last call's arguments are still growing
};

// Parses a finished answer, or the beginning of one (`partial`): then what may still turn out
// to be part of a marker or of a call is left out, so that each partial result is a prefix of
// the next (content, reasoning and each call's arguments only grow). Calls need `tools` active;
// a call whose name is not among them, or whose arguments are not JSON, stays content.
// `starts_in_reasoning`: the prompt opened the reasoning block (its "<think>" is not written).
// Content that is only whitespace around calls is empty.
ParsedAnswer ParseAnswer(const OutputFormat& format, bool starts_in_reasoning,
                         const ToolRequest* tools, std::string_view text, bool partial);

// Finds the calls in a finished answer; `content` receives the text outside them (empty when
// it is only whitespace around calls).
std::vector<ToolCall> ParseToolCalls(std::string_view format, const ToolRequest& tools,
                                     std::string_view text, std::string* content);

// One streamed piece of a call (OpenAI's delta.tool_calls entry): the first of a call carries
// its id and name (`first`), the later ones fragments of its arguments as they are generated.
struct ToolCallDelta {
  size_t index = 0;  // of the call in the answer
  bool first = false;
  std::string id, name;
  std::string arguments;
};

// The incremental parser of an answer: fed the answer as it grows, it tells what is new in its
// reasoning, its content and its calls. It parses the whole answer again at each step, so the
// streamed pieces add up to what ParseAnswer finds in the finished answer.
class AnswerStreamer {
 public:
  AnswerStreamer(const OutputFormat& format, bool starts_in_reasoning, const ToolRequest* tools);

  // `text`: the bytes generated since the last call; `finished`: the answer is complete.
  void Feed(std::string_view text, bool finished, std::string* reasoning, std::string* content,
            std::vector<ToolCallDelta>* deltas);

  // Once finished: the answer as ParseAnswer parses it, the calls with the ids streamed.
  const ParsedAnswer& final() const { return final_; }
  bool any_call_started() const { return !started_.empty(); }

 private:
  struct Started {
    std::string id, name, arguments;  // arguments sent so far
  };
  OutputFormat format_;
  bool starts_in_reasoning_;
  const ToolRequest* tools_;
  std::string buf_;
  std::string reasoning_sent_, content_sent_;
  std::vector<Started> started_;
  ParsedAnswer final_;
};

// AnswerStreamer for tool calls alone, the format by name (OutputFormatByName).
class ToolCallStreamer {
 public:
  ToolCallStreamer(std::string_view format, const ToolRequest& tools)
      : streamer_(OutputFormatByName(format), false, &tools) {}
  void Feed(std::string_view text, bool finished, std::string* content,
            std::vector<ToolCallDelta>* deltas) {
    std::string reasoning;
    streamer_.Feed(text, finished, &reasoning, content, deltas);
  }
  const std::vector<ToolCall>& calls() const { return streamer_.final().calls; }
  const std::string& content() const { return streamer_.final().content; }
  bool any_call_started() const { return streamer_.any_call_started(); }

 private:
  AnswerStreamer streamer_;
};

}  // namespace polychip::server
