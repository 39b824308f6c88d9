#include "server/answer.h"

namespace polychip::server {

AnswerParts SplitAnswer(const ApiRequest& req, std::string_view text) {
  AnswerParts a;
  if (!req.tools) {
    a.text = std::string(text);
    return a;
  }
  a.calls = ParseToolCalls(req.chat_format, *req.tools, text, &a.text);
  if (a.calls.empty()) a.text = std::string(text);
  return a;
}

AnswerPartStreamer::AnswerPartStreamer(const ApiRequest& req) {
  if (req.tools) tools_ = std::make_unique<ToolCallStreamer>(req.chat_format, *req.tools);
}

void AnswerPartStreamer::Feed(std::string_view text, bool finished, std::vector<AnswerPart>* out) {
  if (!tools_) {
    if (!text.empty()) out->push_back({AnswerPart::Kind::kText, std::string(text), "", ""});
    return;
  }
  std::string content;
  std::vector<ToolCallDelta> deltas;
  tools_->Feed(text, finished, &content, &deltas);
  // Content comes before the calls it precedes: the streamer holds back text that may begin
  // a call, so what it releases in one Feed is earlier than the deltas of the same Feed.
  if (!content.empty()) out->push_back({AnswerPart::Kind::kText, std::move(content), "", ""});
  for (ToolCallDelta& d : deltas) {
    if (d.first) out->push_back({AnswerPart::Kind::kCallStart, "", d.id, d.name});
    if (!d.arguments.empty()) {
      out->push_back({AnswerPart::Kind::kCallArguments, std::move(d.arguments), "", ""});
    }
  }
}

}  // namespace polychip::server
