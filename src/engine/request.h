// What the HTTP side hands the engine (GenerateInput) and what flows back (StreamEvent) through
// a thread-safe channel (RequestStream): the engine thread pushes, one HTTP thread pops.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "util/status.h"

namespace polychip::engine {

// How an embedding request turns the final hidden states of its prompt into one vector.
enum class Pooling {
  kNone,  // not an embedding request: a generation
  kMean,  // the mean over every prompt token
  kLast,  // the last prompt token's (what a causal model has seen the whole prompt in)
};

struct GenerateInput {
  std::string rid;                // request id, for logs and /generate's meta_info
  std::vector<int32_t> prompt;    // token ids, not empty
  SamplingParams params;          // params.max_tokens: generated tokens at most
  int32_t priority = 0;           // larger runs first under --schedule-policy priority
  // Not kNone: an embedding request. The prompt is prefilled (its KV blocks freed after, never
  // cached: pooling needs every token's hidden state), nothing is sampled, `params` is unused,
  // and the final event carries the embedding.
  Pooling embed = Pooling::kNone;
  // false: this request never speculates, whatever the server's --speculative-* options.
  bool speculative = true;
  // A LoRA adapter (null: the base model) at `adapter_scale`; held until the request ends.
  std::shared_ptr<const Adapter> adapter;
  float adapter_scale = 1;
};

// One or more generated tokens, or the end of the request.
struct StreamEvent {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                         // one per token
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // one list per token (may be empty)
  std::string text;                                    // new text (valid UTF-8, stops cut)
  // An embedding request's final event: the pooled final hidden states, L2-normalised
  // (hidden_size() floats).
  std::vector<float> embedding;

  bool finished = false;
  FinishReason finish = FinishReason::kNone;  // kNone with finished: aborted or failed
  std::string stop_matched;                   // the stop string that ended it, if any
  int32_t stop_token = -1;
  Status error;  // not OK: the request failed (finished is true)

  // Usage, filled on the final event.
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens found in the prefix cache
  // Speculative decoding: draft tokens proposed for this request and how many were kept.
  int32_t spec_draft_tokens = 0;
  int32_t spec_accepted_tokens = 0;
};

// The channel between the engine thread and the thread that serves one request.
class RequestStream {
 public:
  explicit RequestStream(std::string rid) : rid_(std::move(rid)) {}
  const std::string& rid() const { return rid_; }

  void Push(StreamEvent event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(event));
    }
    cv_.notify_one();
  }

  // Waits up to `timeout` for events and returns all that are queued (possibly none).
  std::vector<StreamEvent> Pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<StreamEvent> out(std::make_move_iterator(events_.begin()),
                                 std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

  // Set by the consumer (client gone); the engine frees the request at its next step.
  void Cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::string rid_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace polychip::engine
