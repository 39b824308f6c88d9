// A chat answer as parts, the way the Anthropic and Responses dialects show it: the model's
// reasoning, its text and its tool calls (as blocks or output items), whole or as it is
// generated. The OpenAI chat writer shows the same parts as message fields; this is where the
// other dialects read them, so that every dialect splits an answer the same way.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api.h"
#include "server/tools.h"

namespace polychip::server {

// A finished answer's parts.
struct AnswerParts {
  std::string reasoning;
  std::string text;  // outside the reasoning and the calls
  std::vector<ToolCall> calls;
};

AnswerParts SplitAnswer(const ApiRequest& req, std::string_view text);

// One new piece of an answer being generated.
struct AnswerPart {
  enum class Kind { kReasoning, kText, kCallStart, kCallArguments };
  Kind kind = Kind::kText;
  std::string text;           // kReasoning, kText: new text; kCallArguments: new argument bytes
  std::string call_id, name;  // kCallStart
};

class AnswerPartStreamer {
 public:
  explicit AnswerPartStreamer(const ApiRequest& req);
  // `text`: the bytes generated since the last call; `finished`: the answer is complete.
  void Feed(std::string_view text, bool finished, std::vector<AnswerPart>* out);
  bool any_call_started() const { return parser_ && parser_->any_call_started(); }

 private:
  std::unique_ptr<AnswerStreamer> parser_;  // null when the answer is not parsed
};

}  // namespace polychip::server
