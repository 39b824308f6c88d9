// How one API dialect shapes a generation's responses (internal to the server module). The
// request flow (submit, wait or stream, abort) is the same for every dialect (server/job.h);
// only the JSON differs: OpenAI's completions and chat completions (openai_writer.cc), SGLang's
// /generate (sglang_writer.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/api.h"
#include "server/text_codec.h"

namespace polychip::server {

struct Job;  // server/job.h

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // The body of a non-streaming response, once every choice finished without error.
  virtual nlohmann::json Final(const Job& job) const = 0;
  // The SSE payload for event `ev` of choice `i`, already folded into the choice; `first` is
  // the index of the event's first token in the choice's tokens. May update the choice's
  // streaming state (a chat stream names the role once).
  virtual nlohmann::json Chunk(Job& job, size_t i, const engine::StreamEvent& ev,
                               size_t first) const = 0;
  // A payload sent after the last chunk and before [DONE], if the dialect has one.
  virtual std::optional<nlohmann::json> Trailer(const Job& job) const = 0;
};

// The writer for requests of `kind`. `codec` must outlive it.
std::unique_ptr<ResponseWriter> MakeResponseWriter(ApiKind kind, const TextCodec* codec,
                                                   std::string model_name);
std::unique_ptr<ResponseWriter> MakeOpenAiWriter(ApiKind kind, const TextCodec* codec,
                                                 std::string model_name);
std::unique_ptr<ResponseWriter> MakeSglangWriter();

// "stop", "length" or "abort" for a final event; nullptr before the end.
const char* FinishName(const engine::StreamEvent& ev);

}  // namespace polychip::server
