#include "server/answer.h"

#include "server/response_util.h"

namespace polychip::server {

AnswerParts SplitAnswer(const ApiRequest& req, std::string_view text) {
  AnswerParts a;
  if (!req.parse_answer()) {
    a.text = std::string(text);
    return a;
  }
  ParsedAnswer p =
      ParseAnswer(req.output_format, req.starts_in_reasoning, req.tools.get(), text, false);
  for (ToolCall& c : p.calls) c.id = RandomId("call_");
  a.reasoning = std::move(p.reasoning);
  a.text = std::move(p.content);
  a.calls = std::move(p.calls);
  return a;
}

AnswerPartStreamer::AnswerPartStreamer(const ApiRequest& req) {
  if (req.parse_answer()) {
    parser_ = std::make_unique<AnswerStreamer>(req.output_format, req.starts_in_reasoning,
                                               req.tools.get());
  }
}

void AnswerPartStreamer::Feed(std::string_view text, bool finished, std::vector<AnswerPart>* out) {
  if (!parser_) {
    if (!text.empty()) out->push_back({AnswerPart::Kind::kText, std::string(text), "", ""});
    return;
  }
  std::string reasoning, content;
  std::vector<ToolCallDelta> deltas;
  parser_->Feed(text, finished, &reasoning, &content, &deltas);
  // Reasoning comes first, and content before the calls it precedes: the parser holds back
  // text that may begin a call, so what it releases in one Feed is earlier than its deltas.
  if (!reasoning.empty()) {
    out->push_back({AnswerPart::Kind::kReasoning, std::move(reasoning), "", ""});
  }
  if (!content.empty()) out->push_back({AnswerPart::Kind::kText, std::move(content), "", ""});
  for (ToolCallDelta& d : deltas) {
    if (d.first) out->push_back({AnswerPart::Kind::kCallStart, "", d.id, d.name});
    if (!d.arguments.empty()) {
      out->push_back({AnswerPart::Kind::kCallArguments, std::move(d.arguments), "", ""});
    }
  }
}

}  // namespace polychip::server
