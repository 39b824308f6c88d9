// One HTTP request's generation (internal to the server module): its choices as submitted to
// the engine, the output accumulated from their streams, and the SSE text of a streaming
// response. Shared by the handler and its streaming content provider.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/request.h"
#include "server/api.h"
#include "server/response_writer.h"
#include "server/tools.h"

namespace polychip::server {

// The accumulated output of one choice.
struct Choice {
  std::shared_ptr<engine::RequestStream> stream;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<engine::TokenLogprob>> top;
  bool finished = false;
  engine::StreamEvent final;
  bool sent_role = false;
  // A chat stream with tools or reasoning: parses the answer as it grows into reasoning,
  // content and call deltas.
  std::shared_ptr<AnswerStreamer> answer_stream;
  // The dialect's own streaming state (Anthropic's and Responses' open blocks).
  std::shared_ptr<StreamState> stream_state;
};

struct Job {
  using Clock = std::chrono::steady_clock;
  ApiRequest req;
  std::unique_ptr<ResponseWriter> writer;  // the request's dialect
  std::string id;
  int64_t created = 0;
  std::vector<Choice> choices;
  int64_t prompt_tokens = 0;  // of the first choice, known before it runs (message_start)
  Clock::time_point start = Clock::now();
  bool start_sent = false;
  bool done_sent = false;
  bool abort_sent = false;  // the server is stopping and has cancelled the job
};

bool AllFinished(const Job& job);
// Cancels every choice still running.
void AbortJob(engine::Engine& engine, Job& job);
// Pops pending events of every choice into its state, waiting up to `wait` on the first
// unfinished one; `out` (streaming) receives the SSE events to send.
void Collect(Job& job, std::chrono::milliseconds wait, std::vector<SseEvent>* out);
// The next piece of a streaming response: the dialect's opening events the first time, the
// events of what came within `wait`, and, once every choice finished, the dialect's closing
// events (then job.done_sent is set). Empty when nothing came.
std::string NextSseText(Job& job, std::chrono::milliseconds wait);

}  // namespace polychip::server
