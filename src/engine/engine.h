// The engine: one thread that drives ModelRunner::Forward over a continuously changing batch.
//
// Every step it (1) drops cancelled requests (their KV blocks freed at once), (2) gives each
// running sequence its next tokens: one for a decode, a chunk of at most
// --chunked-prefill-size prompt tokens for a prefill, so prefills and decodes share a step,
// (3) admits waiting requests in policy order (fcfs, lpm = longest cached prefix first,
// priority) while there are slots, prefill budget and KV blocks, reusing cached prefix blocks
// (a request whose prompt shares at least a block with a prefill still running waits for it
// to publish its blocks, so a system prompt sent by many clients at once is computed once),
// (4) runs the step and samples a token for every sequence that reached the end of its tokens.
// When a running sequence needs a KV block and none is left, the lowest-ranked running sequence
// is preempted by recompute: its full blocks go to the prefix cache, the rest are freed, and it
// goes back to the waiting queue with prompt + generated tokens, to be prefilled again (its
// sampler keeps its state, so the output is the same as without preemption). A request that
// fits the KV cache alone therefore always completes.
// With speculative decoding (EngineOptions::speculative, speculative.h), a decoding sequence's
// step carries its last token and up to k draft tokens, verified in the same batched step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/block_manager.h"
#include "engine/metrics.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/speculative.h"
#include "engine/step_cost.h"
#include "util/status.h"

namespace polychip::engine {

enum class SchedulePolicy { kFcfs, kLpm, kPriority };
StatusOr<SchedulePolicy> ParseSchedulePolicy(const std::string& name);

struct EngineOptions {
  int32_t max_running_requests = 256;
  int32_t max_queued_requests = 4096;  // Submit() beyond this: UNAVAILABLE
  int32_t chunked_prefill_size = 512;  // prompt tokens per step; <= 0: unlimited
  // > 0: while sequences are decoding, each step's prompt tokens are sized from the learned
  // step costs (step_cost.h) so that the step stays within this many milliseconds (the
  // running streams' inter-token latency); chunked_prefill_size stays the ceiling.
  double max_itl_ms = 0;
  int32_t context_length = 0;          // 0: the runner's
  bool enable_prefix_cache = true;
  SchedulePolicy policy = SchedulePolicy::kFcfs;
  // Speculative decoding (kDraft needs the draft runner given to the constructor).
  SpeculativeOptions speculative;
  // Distinct LoRA adapters one step may use (the runner's resident ones); sequences of other
  // adapters wait for a later step, the oldest running sequence's adapter always first.
  int32_t max_adapters_per_step = 8;
};

// A point-in-time view for /metrics and /get_server_info.
struct EngineStats {
  int32_t running = 0;
  int32_t queued = 0;
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_held = 0;    // by running sequences
  int32_t kv_blocks_cached = 0;  // in the prefix cache (held or not)
  int32_t window_blocks_total = 0;  // the sliding layers' window pool (0: none)
  int32_t window_blocks_free = 0;
  PrefixCacheStats prefix;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;      // prompt tokens of finished and running requests
  int64_t generation_tokens = 0;  // generated tokens
  int64_t requests_finished = 0;
  int64_t requests_aborted = 0;
  int64_t requests_failed = 0;
  int64_t steps = 0;
  // Speculative decoding: verification passes (a sequence's step that carried drafts), draft
  // tokens proposed, of which accepted, and tokens those passes emitted (accepted + 1 each,
  // unless the request ended inside).
  int64_t spec_verify_steps = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_emitted_tokens = 0;
  int64_t spec_skipped_steps = 0;  // steps left plain: more decodes than disable_batch_size
  // The LoRA adapters of the running and of the waiting requests, by name, each once.
  std::vector<std::string> running_adapters, waiting_adapters;
};

class Engine {
 public:
  // The bytes of one token (for streaming text and stop strings).
  using PieceFn = std::function<std::string(int32_t)>;

  // `runner` must outlive the engine. `eog_tokens`: the vocabulary's end-of-generation tokens.
  // `draft`: the draft model of options.speculative kDraft (same vocabulary; it must outlive
  // the engine), else null.
  Engine(ModelRunner* runner, EngineOptions options, PieceFn piece,
         std::vector<int32_t> eog_tokens, ModelRunner* draft = nullptr);
  ~Engine();  // stops the thread; requests still in flight get a CANCELLED error event

  void Start();  // starts the engine thread
  void Stop();   // finishes the current step, cancels everything left, joins

  // Queues a request. INVALID_ARGUMENT when it can never run (empty, longer than the context or
  // the whole KV cache), UNAVAILABLE when the queue is full. max_tokens is clipped so that
  // prompt + output fits the context.
  StatusOr<std::shared_ptr<RequestStream>> Submit(GenerateInput input);
  // Cancels a request (client gone); its blocks are freed at the engine's next step.
  void Abort(const std::shared_ptr<RequestStream>& stream);
  // Evicts the unreferenced prefix cache. Returns false when requests are in flight (like
  // SGLang, which only flushes an idle cache).
  bool FlushCache();

  // Runs `fn` on the engine thread between two steps with no KV in use, and blocks until it
  // ran: every running request is preempted first (its tokens and sampler state kept; its KV is
  // recomputed by prefill when it runs again, so greedy output is unchanged) and the prefix
  // cache is emptied, since `fn` may replace the memory the cache lives in (a plugin hot
  // reload, model/hot_reload.h). Requests submitted meanwhile wait in the queue. Returns how
  // many requests were preempted; UNAVAILABLE when the engine stopped before running `fn`.
  // Without Start() (tests) `fn` runs on the calling thread.
  StatusOr<int32_t> RunWithKvDropped(std::function<void()> fn);

  // Runs one step on the calling thread (tests drive the engine without Start()). Returns
  // false when there was nothing to do.
  bool Step();
  // Steps until every request finished (tests). At most `max_steps`.
  void RunUntilIdle(int64_t max_steps = 1000000);

  EngineStats Stats() const;
  // Appends the engine's Prometheus lines (histograms and counters) to `out`.
  void RenderMetrics(std::string* out) const;
  // The same figures under vLLM's names (vllm:num_requests_running, vllm:kv_cache_usage_perc,
  // vllm:time_to_first_token_seconds, ...), labelled model_name="<model_name>", as the
  // dashboards and routers written for vLLM read them (docs/metrics.md).
  void RenderVllmMetrics(const std::string& model_name, std::string* out) const;

  int64_t context_length() const { return context_length_; }
  int64_t max_sequence_tokens() const { return max_seq_tokens_; }
  const EngineOptions& options() const { return options_; }
  ModelRunner& runner() { return *runner_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Sequence;
  struct Planned {
    Sequence* seq;
    int32_t n_tokens;
  };

  struct KvDroppedTask {
    std::function<void()> fn;
    std::promise<int32_t> preempted;  // -1: not run (the engine stopped)
  };

  void Loop();
  void RunKvDroppedTasks();
  int32_t DropKvAndRun(const std::function<void()>& fn);
  // One step is these three: which sequences run and with how many tokens (empty: nothing to
  // do); the forward pass over them; the sampling, streaming and finishing of every sequence
  // that reached the end of its tokens. FailPlan ends every planned sequence when the forward
  // pass failed.
  std::vector<Planned> Schedule();
  Status RunPlan(const std::vector<Planned>& plan, std::vector<SequenceStep>* steps);
  void ProcessResults(const std::vector<Planned>& plan, std::span<const SequenceStep> steps);
  void FailPlan(const std::vector<Planned>& plan, const Status& status);
  // Speculation: asks the proposer for drafts for the plan's decoding sequences and grows
  // their blocks for them (a sequence whose blocks cannot grow decodes plainly).
  void Speculate(const std::vector<Planned>& plan);
  // Verifies a sequence's drafts against its k + 1 rows of logits and emits what is kept
  // (Sampler::SampleDraft) plus the target's own next token. Returns the tokens emitted.
  int32_t ProcessSpeculative(Sequence* s, const float* rows, Clock::time_point now);
  // Samples nothing: records `r` as the sequence's next token into `ev` and says whether the
  // request ends with it (stop token or string, grammar complete, length).
  FinishReason PushToken(Sequence* s, SampleResult r, StreamEvent* ev);
  // Sends `ev` (the tokens of this step), or finishes the request with it.
  void Deliver(Sequence* s, StreamEvent ev, FinishReason finish, Clock::time_point now);
  // Floats the runner returns for one step (rows of logits or of hidden states).
  size_t OutputFloats(const SequenceStep& st) const;
  // Adds an embedding request's hidden-state rows of this step to its pooling; once the whole
  // prompt is in, finishes it with the embedding.
  void PoolEmbedding(Sequence* s, const SequenceStep& st, const float* rows);
  void TakeInbox();
  void DropCancelled();
  void SortRunning();
  void SortWaiting();
  // Whether s's adapter fits this step (EngineOptions::max_adapters_per_step), taking it.
  bool TakeAdapter(const Sequence& s);
  bool PlanRunning(std::vector<Planned>* plan, int32_t* budget);
  void AdmitWaiting(std::vector<Planned>* plan, int32_t* budget);
  bool WaitsForSharedPrefill(const Sequence& s) const;
  bool GrowBlocks(Sequence* seq, int32_t n_tokens);
  void Preempt(Sequence* seq);
  Status RunForward(std::span<const SequenceStep> steps, std::vector<float>* logits);
  void Finish(Sequence* seq, StreamEvent event);
  void FreeBlocks(Sequence* seq, bool cache_prefix);
  void PublishStats();
  // The block manager's figures into stats_ (the caller holds stats_mu_).
  void PublishKvStatsLocked();
  void Wake();
  // Prompt tokens this step may carry: --chunked-prefill-size, or with --max-itl-ms and
  // sequences decoding, what keeps the step within the target by the learned costs.
  int32_t PrefillBudget() const;

  ModelRunner* runner_;
  EngineOptions options_;
  PieceFn piece_;
  std::vector<int32_t> eog_tokens_;
  std::unique_ptr<Proposer> proposer_;  // null: no speculation
  int64_t context_length_;
  int64_t max_seq_tokens_;  // min(context, whole KV cache)
  int64_t vocab_size_;
  BlockManager blocks_;

  // Owned by the engine thread (or the caller of Step()).
  // The step's logits (one vocab row per sampled sequence, ~10 MB at 16 x 152k): kept across
  // steps so its pages are not mapped, faulted in and zeroed by the kernel every step.
  std::vector<float> step_logits_;
  StepCostModel step_cost_;
  std::list<std::unique_ptr<Sequence>> running_;
  std::list<std::unique_ptr<Sequence>> waiting_;
  int64_t next_arrival_ = 0;
  std::vector<int64_t> step_adapters_;  // the adapters of the step being planned

  // Shared with the submitting threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<std::promise<bool>> flush_requests_;
  std::vector<KvDroppedTask> kv_dropped_tasks_;
  int32_t num_queued_ = 0;  // inbox + waiting, for max_queued_requests
  bool stop_ = false;
  bool wake_ = false;
  std::thread thread_;

  mutable std::mutex stats_mu_;
  EngineStats stats_;
  Histogram ttft_ = Histogram::Latency();
  Histogram itl_ = Histogram::Latency();
  Histogram e2e_ = Histogram::Latency();
  Histogram queue_time_ = Histogram::Latency();
  // Per finished request that speculated: tokens per verification pass.
  Histogram spec_accept_len_ = Histogram({1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8});
};

}  // namespace polychip::engine
