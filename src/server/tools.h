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

// Finds the calls in a finished answer; `content` receives the text outside them.
std::vector<ToolCall> ParseToolCalls(std::string_view chat_format, const ToolRequest& tools,
                                     std::string_view text, std::string* content);

}  // namespace polychip::server
