#include "server/response_writer.h"

#include <utility>

namespace polychip::server {

std::unique_ptr<ResponseWriter> MakeResponseWriter(ApiKind kind, const TextCodec* codec,
                                                   std::string model_name, ResponseStore* store) {
  if (kind == ApiKind::kGenerate) return MakeSglangWriter();
  if (kind == ApiKind::kMessages) return MakeAnthropicWriter(std::move(model_name));
  if (kind == ApiKind::kResponses) return MakeResponsesWriter(std::move(model_name), store);
  return MakeOpenAiWriter(kind, codec, std::move(model_name));
}

const char* FinishName(const engine::StreamEvent& ev) {
  if (!ev.finished) return nullptr;
  switch (ev.finish) {
    case engine::FinishReason::kStop: return "stop";
    case engine::FinishReason::kLength: return "length";
    default: return "abort";
  }
}

}  // namespace polychip::server
