// How one API dialect shapes a generation's responses (internal to the server module). The
// request flow (submit, wait or stream, abort) is the same for every dialect (server/job.h);
// only the JSON differs: OpenAI's completions and chat completions (openai_writer.cc), SGLang's
// /generate (sglang_writer.cc), Anthropic's Messages (anthropic.cc), OpenAI's Responses
// (responses.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/api.h"
#include "server/text_codec.h"

namespace polychip::server {

struct Job;  // server/job.h

// One server-sent event: an `event:` line when `name` is not empty, then the `data:` line.
struct SseEvent {
  std::string name;
  nlohmann::json data;
};

// A dialect's per-choice streaming state (which content block is open, ...).
struct StreamState {
  virtual ~StreamState() = default;
};

class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // The body of a non-streaming response, once every choice finished without error.
  virtual nlohmann::json Final(const Job& job) const = 0;
  // The SSE payload for event `ev` of choice `i`, already folded into the choice; `first` is
  // the index of the event's first token in the choice's tokens. May update the choice's
  // streaming state (a chat stream names the role once).
  virtual nlohmann::json Chunk(Job&, size_t, const engine::StreamEvent&, size_t) const {
    return nullptr;
  }
  // A payload sent after the last chunk and before [DONE], if the dialect has one.
  virtual std::optional<nlohmann::json> Trailer(const Job&) const { return std::nullopt; }

  // The stream as events. The defaults are OpenAI's framing: one unnamed event per Chunk, the
  // Trailer, then "data: [DONE]"; Anthropic and Responses name their events and send several
  // per generated piece.
  // Before the first token (Anthropic's message_start, Responses' response.created).
  virtual void StreamStart(Job&, std::vector<SseEvent>*) const {}
  virtual void StreamEvents(Job& job, size_t i, const engine::StreamEvent& ev, size_t first,
                            std::vector<SseEvent>* out) const {
    out->push_back({"", Chunk(job, i, ev, first)});
  }
  // After every choice finished.
  virtual void StreamEnd(Job& job, std::vector<SseEvent>* out) const {
    if (auto t = Trailer(job)) out->push_back({"", std::move(*t)});
  }
  virtual bool EndsWithDone() const { return true; }
  // A failure in the middle of a stream.
  virtual SseEvent StreamError(Job&, const ApiError& e) const { return {"", e.ToJson()}; }
};

class ResponseStore;  // server/dialects.h

// The writer for requests of `kind`. `codec` must outlive it, and `store` (where Responses
// keeps what it is asked to store; may be null) too.
std::unique_ptr<ResponseWriter> MakeResponseWriter(ApiKind kind, const TextCodec* codec,
                                                   std::string model_name,
                                                   ResponseStore* store = nullptr);
std::unique_ptr<ResponseWriter> MakeOpenAiWriter(ApiKind kind, const TextCodec* codec,
                                                 std::string model_name);
std::unique_ptr<ResponseWriter> MakeSglangWriter();
std::unique_ptr<ResponseWriter> MakeAnthropicWriter(std::string model_name);
std::unique_ptr<ResponseWriter> MakeResponsesWriter(std::string model_name, ResponseStore* store);

// "stop", "length" or "abort" for a final event; nullptr before the end.
const char* FinishName(const engine::StreamEvent& ev);

}  // namespace polychip::server
