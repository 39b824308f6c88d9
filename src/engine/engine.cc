#include "engine/engine.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <iterator>
#include <map>

#include <spdlog/spdlog.h>

namespace polychip::engine {

struct Engine::Sequence {
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;
  int32_t max_total = 0;     // tokens.size() at which generation ends (length)
  int32_t num_computed = 0;  // tokens whose KV is in `blocks`
  std::vector<int32_t> blocks;
  std::vector<int32_t> window_table;  // the window pool's blocks of `blocks` (RunPlan)
  int32_t priority = 0;
  int64_t arrival = 0;  // submission order; kept across preemption
  int32_t cached_tokens = 0;
  bool matched = false;   // prefix lookup done since the last (re)admission
  bool admitted = false;  // admitted at least once (statistics count the first time only)
  std::unique_ptr<Sampler> sampler;  // null for an embedding request
  std::unique_ptr<StopChecker> stop;  // null for an embedding request
  Pooling embed = Pooling::kNone;
  std::vector<double> pooled;  // embedding: the sum (mean) or the last row of hidden states
  Clock::time_point arrive_time;
  Clock::time_point last_token_time;
  bool got_first_token = false;
  // Speculative decoding.
  bool speculative = false;  // the request allows it (and the engine has a proposer)
  int32_t spec_k = 0;        // draft tokens to ask for next (adaptive)
  std::vector<int32_t> draft;    // this step's drafts (empty: a plain step)
  std::vector<float> draft_q;    // their draft distributions, or empty (one-hot)
  std::vector<int32_t> verify;   // this step's tokens: the last token, then the drafts
  int32_t spec_passes = 0, spec_drafted = 0, spec_accepted = 0, spec_emitted = 0;
  std::shared_ptr<const Adapter> adapter;  // LoRA (null: the base model)
  float adapter_scale = 1;
  uint64_t salt = 0;  // the prefix cache's key of adapter and scale (BlockManager)
};

StatusOr<SchedulePolicy> ParseSchedulePolicy(const std::string& name) {
  if (name == "fcfs") return SchedulePolicy::kFcfs;
  if (name == "lpm") return SchedulePolicy::kLpm;
  if (name == "priority") return SchedulePolicy::kPriority;
  return InvalidArgument("unknown schedule policy '" + name + "' (fcfs, lpm, priority)");
}

Engine::Engine(ModelRunner* runner, EngineOptions options, PieceFn piece,
               std::vector<int32_t> eog_tokens, ModelRunner* draft)
    : runner_(runner),
      options_(options),
      piece_(std::move(piece)),
      eog_tokens_(std::move(eog_tokens)),
      context_length_(options.context_length > 0
                          ? std::min<int64_t>(options.context_length, runner->context_length())
                          : runner->context_length()),
      max_seq_tokens_(std::min<int64_t>(context_length_,
                                        runner->num_kv_blocks() * runner->block_size())),
      vocab_size_(runner->vocab_size()),
      blocks_(static_cast<int32_t>(runner->num_kv_blocks()),
              static_cast<int32_t>(runner->block_size()), options.enable_prefix_cache,
              WindowPool{static_cast<int32_t>(runner->num_window_kv_blocks()),
                         static_cast<int32_t>(runner->kv_window())},
              static_cast<int32_t>(runner->kv_blocks_per_pool())) {
  stats_.kv_blocks_total = blocks_.num_blocks();
  const SpeculativeOptions& spec = options_.speculative;
  if (spec.algorithm == SpecAlgorithm::kNgram) {
    proposer_ = MakeNgramProposer(spec.ngram_min, spec.ngram_max);
  } else if (spec.algorithm == SpecAlgorithm::kDraft) {
    PC_CHECK(draft != nullptr);
    proposer_ = MakeDraftModelProposer(draft, vocab_size_);
  }
  if (proposer_ && spec.num_draft_tokens < 1) proposer_.reset();
}

Engine::~Engine() { Stop(); }

void Engine::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Whatever is left gets a final event, so no HTTP thread waits forever.
  TakeInbox();
  for (auto* list : {&running_, &waiting_}) {
    while (!list->empty()) {
      Sequence* s = list->front().get();
      StreamEvent ev;
      ev.error = Cancelled("server shutting down");
      Finish(s, std::move(ev));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : flush_requests_) p.set_value(false);
  flush_requests_.clear();
  for (auto& t : kv_dropped_tasks_) t.preempted.set_value(-1);
  kv_dropped_tasks_.clear();
}

void Engine::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(GenerateInput input) {
  const int64_t n_prompt = static_cast<int64_t>(input.prompt.size());
  const bool embed = input.embed != Pooling::kNone;
  if (n_prompt == 0) return InvalidArgument("the prompt is empty");
  if (embed && runner_->hidden_size() <= 0) {
    return Unimplemented("this model runner cannot return hidden states (embeddings)");
  }
  if (embed && n_prompt > max_seq_tokens_) {
    return InvalidArgument("the input has " + std::to_string(n_prompt) +
                           " tokens; this server's maximum context length is " +
                           std::to_string(max_seq_tokens_) + " tokens");
  }
  if (!embed && n_prompt >= max_seq_tokens_) {
    return InvalidArgument("the prompt has " + std::to_string(n_prompt) +
                           " tokens; this server's maximum context length is " +
                           std::to_string(max_seq_tokens_) +
                           " tokens (prompt plus at least one generated token)");
  }
  for (int32_t t : input.prompt) {
    if (t < 0 || t >= vocab_size_) {
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_size_) + ")");
    }
  }
  if (input.params.max_tokens < 0) return InvalidArgument("max_tokens must be >= 0");
  // Generation stops at the context length even when max_tokens asks for more.
  const int64_t room = max_seq_tokens_ - n_prompt;
  if (embed) {
    input.params.max_tokens = 0;
  } else if (input.params.max_tokens == 0 || input.params.max_tokens > room) {
    input.params.max_tokens = static_cast<int32_t>(room);
  }

  auto seq = std::make_unique<Sequence>();
  seq->stream = std::make_shared<RequestStream>(input.rid);
  seq->prompt_len = static_cast<int32_t>(n_prompt);
  seq->max_total = static_cast<int32_t>(n_prompt + input.params.max_tokens);
  seq->priority = input.priority;
  seq->arrive_time = Clock::now();
  seq->embed = input.embed;
  seq->speculative = proposer_ != nullptr && input.speculative && !embed;
  seq->spec_k = options_.speculative.num_draft_tokens;
  if (!embed) {
    seq->sampler =
        std::make_unique<Sampler>(input.params, vocab_size_, eog_tokens_, input.prompt);
    seq->stop = std::make_unique<StopChecker>(input.params, eog_tokens_);
  }
  seq->tokens = std::move(input.prompt);
  if (input.adapter) {
    seq->adapter = std::move(input.adapter);
    seq->adapter_scale = input.adapter_scale;
    uint32_t bits = 0;
    static_assert(sizeof(bits) == sizeof(seq->adapter_scale));
    std::memcpy(&bits, &seq->adapter_scale, sizeof(bits));
    seq->salt = (static_cast<uint64_t>(seq->adapter->id()) << 32) | bits;
  }
  auto stream = seq->stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && thread_.joinable()) return Unavailable("the server is shutting down");
    if (num_queued_ >= options_.max_queued_requests) {
      return Unavailable("the request queue is full (" +
                         std::to_string(options_.max_queued_requests) +
                         " waiting); retry later");
    }
    seq->arrival = next_arrival_++;
    ++num_queued_;
    inbox_.push_back(std::move(seq));
    wake_ = true;
  }
  cv_.notify_all();
  return stream;
}

void Engine::Abort(const std::shared_ptr<RequestStream>& stream) {
  if (!stream) return;
  stream->Cancel();
  Wake();
}

bool Engine::FlushCache() {
  std::future<bool> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    flush_requests_.emplace_back();
    done = flush_requests_.back().get_future();
    wake_ = true;
  }
  cv_.notify_all();
  if (!thread_.joinable()) Step();  // tests without the engine thread
  if (done.wait_for(std::chrono::seconds(30)) != std::future_status::ready) return false;
  return done.get();
}

StatusOr<int32_t> Engine::RunWithKvDropped(std::function<void()> fn) {
  std::future<int32_t> done;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) {
      lock.unlock();
      return DropKvAndRun(fn);
    }
    if (stop_) return Unavailable("the server is shutting down");
    kv_dropped_tasks_.push_back({std::move(fn), {}});
    done = kv_dropped_tasks_.back().preempted.get_future();
    wake_ = true;
  }
  cv_.notify_all();
  const int32_t preempted = done.get();
  if (preempted < 0) return Unavailable("the server is shutting down");
  return preempted;
}

void Engine::RunKvDroppedTasks() {
  std::vector<KvDroppedTask> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks.swap(kv_dropped_tasks_);
  }
  for (auto& t : tasks) t.preempted.set_value(DropKvAndRun(t.fn));
}

int32_t Engine::DropKvAndRun(const std::function<void()>& fn) {
  TakeInbox();
  DropCancelled();
  const int32_t preempted = static_cast<int32_t>(running_.size());
  while (!running_.empty()) Preempt(running_.back().get());
  for (auto& s : waiting_) {  // a prefix match held since the last admission pass
    if (s->blocks.empty()) continue;
    blocks_.Release(s->blocks);
    s->blocks.clear();
    s->num_computed = 0;
    s->matched = false;
  }
  blocks_.Flush();
  PublishStats();  // what `fn` (and /metrics meanwhile) see: nothing running, nothing cached
  fn();
  PublishStats();
  return preempted;
}

void Engine::TakeInbox() {
  std::vector<std::promise<bool>> flushes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = false;
    for (auto& s : inbox_) waiting_.push_back(std::move(s));
    inbox_.clear();
    flushes.swap(flush_requests_);
  }
  for (auto& p : flushes) {
    const bool idle = running_.empty() && waiting_.empty();
    if (idle) blocks_.Flush();
    p.set_value(idle);
  }
}

void Engine::DropCancelled() {
  for (auto* list : {&running_, &waiting_}) {
    for (auto it = list->begin(); it != list->end();) {
      Sequence* s = it->get();
      ++it;  // Finish erases s
      if (!s->stream->cancelled()) continue;
      StreamEvent ev;
      ev.error = Cancelled("request aborted");
      Finish(s, std::move(ev));
    }
  }
}

void Engine::SortRunning() {
  if (options_.policy == SchedulePolicy::kPriority) {
    running_.sort([](const auto& a, const auto& b) {
      return a->priority != b->priority ? a->priority > b->priority : a->arrival < b->arrival;
    });
  } else {
    running_.sort([](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  }
}

void Engine::SortWaiting() {
  switch (options_.policy) {
    case SchedulePolicy::kFcfs:
      waiting_.sort([](const auto& a, const auto& b) { return a->arrival < b->arrival; });
      break;
    case SchedulePolicy::kPriority:
      waiting_.sort([](const auto& a, const auto& b) {
        return a->priority != b->priority ? a->priority > b->priority : a->arrival < b->arrival;
      });
      break;
    case SchedulePolicy::kLpm: {
      // Matching every waiting prompt against the tree costs O(queue * prompt); beyond a few
      // hundred waiting requests the order matters less than the cost, as in SGLang.
      if (waiting_.size() > 128 || !blocks_.prefix_cache_enabled()) {
        waiting_.sort([](const auto& a, const auto& b) { return a->arrival < b->arrival; });
        break;
      }
      std::map<const Sequence*, int32_t> match;
      for (const auto& s : waiting_) {
        match[s.get()] =
            blocks_.PeekPrefix(s->tokens, static_cast<int32_t>(s->tokens.size()) - 1, s->salt);
      }
      waiting_.sort([&](const auto& a, const auto& b) {
        const int32_t ma = match[a.get()], mb = match[b.get()];
        return ma != mb ? ma > mb : a->arrival < b->arrival;
      });
      break;
    }
  }
}

bool Engine::GrowBlocks(Sequence* seq, int32_t n_tokens) {
  const int64_t bs = blocks_.block_size();
  const int64_t needed = (seq->num_computed + n_tokens + bs - 1) / bs;
  const int32_t missing = static_cast<int32_t>(needed - static_cast<int64_t>(seq->blocks.size()));
  blocks_.SlideWindow(seq->blocks, seq->num_computed);  // window shares it no longer needs
  return blocks_.Allocate(missing, &seq->blocks);
}

void Engine::FreeBlocks(Sequence* seq, bool cache_prefix) {
  if (proposer_) proposer_->Release(seq->arrival);
  if (cache_prefix) {
    blocks_.InsertPrefix(std::span<const int32_t>(seq->tokens).first(seq->num_computed),
                         &seq->blocks, seq->salt);
  }
  blocks_.Release(seq->blocks);
  seq->blocks.clear();
  seq->num_computed = 0;
  seq->matched = false;
}

void Engine::Preempt(Sequence* seq) {
  // An embedding starts over (its pooling needs every row again); it never caches its blocks.
  FreeBlocks(seq, /*cache_prefix=*/seq->embed == Pooling::kNone);
  seq->pooled.clear();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->get() == seq) {
      waiting_.push_back(std::move(*it));
      running_.erase(it);
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++num_queued_;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.preemptions;
}

bool Engine::TakeAdapter(const Sequence& s) {
  if (!s.adapter) return true;
  const int64_t id = s.adapter->id();
  if (std::find(step_adapters_.begin(), step_adapters_.end(), id) != step_adapters_.end()) {
    return true;
  }
  if (static_cast<int32_t>(step_adapters_.size()) >= std::max(1, options_.max_adapters_per_step)) {
    return false;
  }
  step_adapters_.push_back(id);
  return true;
}

bool Engine::PlanRunning(std::vector<Planned>* plan, int32_t* budget) {
  bool preempted = false;
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence* s = it->get();
    if (!TakeAdapter(*s)) {  // its adapter waits for a step with room
      ++it;
      continue;
    }
    const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
    const int32_t n =
        remaining == 1 ? 1 : std::min({remaining, *budget, blocks_.MaxStepTokens()});
    if (n <= 0) {
      ++it;
      continue;
    }
    // Out of blocks: preempt from the back (the lowest-ranked) until this one fits; with the
    // KV in several pools, only those whose blocks are in this one's pool.
    bool fits = GrowBlocks(s, n);
    while (!fits) {
      Sequence* victim = nullptr;
      for (auto r = running_.rbegin(); r != running_.rend() && r->get() != s; ++r) {
        if (blocks_.SamePool((*r)->blocks, s->blocks)) {
          victim = r->get();
          break;
        }
      }
      if (victim == nullptr) break;
      Preempt(victim);
      preempted = true;
      fits = GrowBlocks(s, n);
    }
    if (!fits) {  // s is the lowest-ranked left of its pool: it waits for the others
      const auto next = std::next(it);  // other pools' sequences after it still run
      Preempt(s);
      preempted = true;
      it = next;
      continue;
    }
    plan->push_back({s, n});
    if (remaining > 1) *budget -= n;
    ++it;
  }
  return preempted;
}

bool Engine::WaitsForSharedPrefill(const Sequence& s) const {
  if (!blocks_.prefix_cache_enabled()) return false;
  const int32_t bs = blocks_.block_size();
  const size_t limit = s.tokens.size() - 1;  // the last prompt token is always computed
  for (const auto& r : running_) {
    if (r->num_computed >= r->prompt_len) continue;  // not prefilling
    if (r->embed != Pooling::kNone) continue;        // publishes nothing
    if (r->salt != s.salt) continue;                 // another adapter's KV
    const size_t n = std::min<size_t>(limit, r->prompt_len);
    size_t common = 0;
    while (common < n && s.tokens[common] == r->tokens[common]) ++common;
    if (static_cast<int64_t>(common) >= s.num_computed + bs) return true;
  }
  return false;
}

void Engine::AdmitWaiting(std::vector<Planned>* plan, int32_t* budget) {
  SortWaiting();
  // Keep a block per running sequence for its decode to grow into, so that admitting a prefill
  // does not immediately force a preemption.
  const int32_t reserve = static_cast<int32_t>(running_.size());
  const int64_t bs = blocks_.block_size();
  for (auto it = waiting_.begin(); it != waiting_.end() && *budget > 0 &&
                                   static_cast<int32_t>(running_.size()) <
                                       options_.max_running_requests;) {
    Sequence* s = it->get();
    if (!TakeAdapter(*s)) {
      ++it;
      continue;
    }
    if (!s->matched) {
      // An embedding needs the hidden state of every prompt token: none comes from the cache.
      if (s->embed == Pooling::kNone) {
        s->num_computed = blocks_.MatchPrefix(
            s->tokens, static_cast<int32_t>(s->tokens.size()) - 1, &s->blocks, s->salt);
        blocks_.SlideWindow(s->blocks, s->num_computed);
      }
      s->matched = true;
    }
    auto unmatch = [&] {  // give the matched blocks back so they stay evictable
      blocks_.Release(s->blocks);
      s->blocks.clear();
      s->num_computed = 0;
      s->matched = false;
    };
    // Requests that arrive together with a shared system prompt would each compute it; the
    // later ones wait until the first one's prefill has published those blocks.
    if (s->embed == Pooling::kNone && WaitsForSharedPrefill(*s)) {
      unmatch();
      ++it;
      continue;
    }
    const int32_t remaining = static_cast<int32_t>(s->tokens.size()) - s->num_computed;
    const int32_t n = std::min({remaining, *budget, blocks_.MaxStepTokens()});
    const int64_t missing = (s->num_computed + n + bs - 1) / bs - static_cast<int64_t>(s->blocks.size());
    const int32_t usable = blocks_.NumAvailable(s->blocks) - (running_.empty() ? 0 : reserve);
    if (missing > usable) {
      unmatch();
      break;
    }
    PC_CHECK(GrowBlocks(s, n));
    if (!s->admitted) {
      s->admitted = true;
      s->cached_tokens = s->num_computed;
      blocks_.RecordLookup(s->prompt_len, s->num_computed);
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.prompt_tokens += s->prompt_len;
      queue_time_.Observe(std::chrono::duration<double>(Clock::now() - s->arrive_time).count());
    }
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --num_queued_;
    }
    plan->push_back({s, n});
    *budget -= n;
  }
}

Status Engine::RunForward(std::span<const SequenceStep> steps, std::vector<float>* logits) {
  logits->clear();
  Status status = runner_->Forward(steps, logits);
  if (status.code() != StatusCode::kResourceExhausted || steps.size() < 2) return status;
  // The step did not fit on the device: run it in two halves.
  const size_t half = steps.size() / 2;
  std::vector<float> second;
  PC_RETURN_IF_ERROR(RunForward(steps.first(half), logits));
  PC_RETURN_IF_ERROR(RunForward(steps.subspan(half), &second));
  logits->insert(logits->end(), second.begin(), second.end());
  return Status::Ok();
}

void Engine::Finish(Sequence* seq, StreamEvent event) {
  event.finished = true;
  event.prompt_tokens = seq->prompt_len;
  event.completion_tokens = static_cast<int32_t>(seq->tokens.size()) - seq->prompt_len;
  event.cached_tokens = seq->cached_tokens;
  event.spec_draft_tokens = seq->spec_drafted;
  event.spec_accepted_tokens = seq->spec_accepted;
  FreeBlocks(seq, /*cache_prefix=*/seq->embed == Pooling::kNone &&
                      (event.error.ok() || event.error.code() == StatusCode::kCancelled));
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (seq->spec_passes > 0) {
      spec_accept_len_.Observe(static_cast<double>(seq->spec_emitted) / seq->spec_passes);
    }
    if (event.error.ok()) {
      ++stats_.requests_finished;
      e2e_.Observe(std::chrono::duration<double>(Clock::now() - seq->arrive_time).count());
    } else if (event.error.code() == StatusCode::kCancelled) {
      ++stats_.requests_aborted;
    } else {
      ++stats_.requests_failed;
    }
    // The KV figures too, before the client can see its final event: a /metrics read right
    // after the response must not find this request's blocks still held.
    PublishKvStatsLocked();
  }
  seq->stream->Push(std::move(event));
  for (auto* list : {&running_, &waiting_}) {
    for (auto it = list->begin(); it != list->end(); ++it) {
      if (it->get() != seq) continue;
      if (list == &waiting_) {
        std::lock_guard<std::mutex> lock(mu_);
        --num_queued_;
      }
      list->erase(it);
      return;
    }
  }
}

bool Engine::Step() {
  std::vector<Planned> plan = Schedule();
  if (plan.empty()) {
    PublishStats();
    return false;
  }
  // The rows of one adapter (and scale) next to each other, the base model's first: a step's
  // rows of an adapter then form one run, and what is launched per run (an adapter's expert
  // feed-forward, a MOE launch of its own; the low-rank products composed of MATMULs where
  // the plugin lacks LORA) is launched once per adapter rather than once per row. The order
  // decided nothing yet: who runs was scheduled above, and results follow the plan.
  std::stable_sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) {
    return a.seq->salt < b.seq->salt;
  });
  std::vector<SequenceStep> steps;
  const auto start = Clock::now();
  if (proposer_) Speculate(plan);
  const Status status = RunPlan(plan, &steps);
  if (status.ok()) {
    int64_t decode_seqs = 0, prefill_tokens = 0;
    for (const Planned& p : plan) {
      // A sequence's one new token is a decode; anything longer is prompt (or recompute).
      (p.n_tokens == 1 && p.seq->num_computed >= p.seq->prompt_len ? decode_seqs
                                                                   : prefill_tokens) +=
          p.n_tokens;
      prefill_tokens += static_cast<int64_t>(p.seq->draft.size());  // verified positions
    }
    step_cost_.Observe(decode_seqs, prefill_tokens,
                       std::chrono::duration<double>(Clock::now() - start).count(),
                       runner_->LastStepDeviceSeconds());
    ProcessResults(plan, steps);
  } else {
    FailPlan(plan, status);
  }
  PublishStats();
  return true;
}

std::vector<Engine::Planned> Engine::Schedule() {
  TakeInbox();
  DropCancelled();
  std::vector<Planned> plan;
  if (running_.empty() && waiting_.empty()) return plan;
  step_adapters_.clear();
  SortRunning();
  int32_t budget = PrefillBudget();
  // After a preemption the cache is tight: let the survivors run before admitting more.
  if (!PlanRunning(&plan, &budget)) AdmitWaiting(&plan, &budget);
  return plan;
}

int32_t Engine::PrefillBudget() const {
  const int32_t ceiling =
      options_.chunked_prefill_size > 0 ? options_.chunked_prefill_size : INT_MAX;
  if (options_.max_itl_ms <= 0 || !step_cost_.ready()) return ceiling;
  int64_t decoding = 0;
  for (const auto& s : running_) {
    if (static_cast<int64_t>(s->tokens.size()) - s->num_computed == 1) ++decoding;
  }
  if (decoding == 0) return ceiling;  // no stream waits on this step
  const int32_t floor = std::min(kMinPrefillChunk, ceiling);
  return step_cost_.PrefillBudget(decoding, options_.max_itl_ms / 1000.0, floor, ceiling);
}

Status Engine::RunPlan(const std::vector<Planned>& plan, std::vector<SequenceStep>* steps) {
  steps->reserve(plan.size());
  for (const Planned& p : plan) {
    SequenceStep st;
    st.seq_id = p.seq->arrival;
    st.tokens = std::span<const int32_t>(p.seq->tokens).subspan(p.seq->num_computed, p.n_tokens);
    st.start_pos = p.seq->num_computed;
    st.block_table = p.seq->blocks;
    st.adapter = p.seq->adapter.get();
    st.adapter_scale = p.seq->adapter_scale;
    if (blocks_.has_window_pool()) {
      // Released shares read the pool's spare block (num_window_blocks()), which stays zero.
      p.seq->window_table.clear();
      for (int32_t b : p.seq->blocks) {
        const int32_t w = blocks_.WindowBlockOf(b);
        p.seq->window_table.push_back(w >= 0 ? w : blocks_.num_window_blocks());
      }
      st.window_block_table = p.seq->window_table;
    }
    const bool last = p.seq->num_computed + p.n_tokens == static_cast<int32_t>(p.seq->tokens.size());
    if (!p.seq->draft.empty()) {  // the last token and the drafts, logits at each
      st.tokens = p.seq->verify;
      st.logits = LogitsMode::kAll;
      steps->push_back(st);
      continue;
    }
    switch (p.seq->embed) {
      case Pooling::kNone:
        st.logits = last ? LogitsMode::kLast : LogitsMode::kNone;
        break;
      case Pooling::kMean:
        st.logits = LogitsMode::kHiddenAll;
        break;
      case Pooling::kLast:
        st.logits = last ? LogitsMode::kHiddenLast : LogitsMode::kNone;
        break;
    }
    steps->push_back(st);
  }
  PC_RETURN_IF_ERROR(RunForward(*steps, &step_logits_));
  size_t expected = 0;
  for (const auto& st : *steps) expected += OutputFloats(st);
  if (step_logits_.size() != expected) {
    return Internal("the model returned " + std::to_string(step_logits_.size()) +
                    " output floats, expected " + std::to_string(expected));
  }
  return Status::Ok();
}

size_t Engine::OutputFloats(const SequenceStep& st) const {
  const size_t hidden = static_cast<size_t>(runner_->hidden_size());
  switch (st.logits) {
    case LogitsMode::kNone:
      return 0;
    case LogitsMode::kLast:
      return static_cast<size_t>(vocab_size_);
    case LogitsMode::kAll:
      return st.tokens.size() * static_cast<size_t>(vocab_size_);
    case LogitsMode::kHiddenLast:
      return hidden;
    case LogitsMode::kHiddenAll:
      return st.tokens.size() * hidden;
  }
  return 0;
}

void Engine::PoolEmbedding(Sequence* s, const SequenceStep& st, const float* rows) {
  const size_t d = static_cast<size_t>(runner_->hidden_size());
  if (s->pooled.empty()) s->pooled.assign(d, 0.0);
  const size_t n_rows = OutputFloats(st) / d;
  for (size_t r = 0; r < n_rows; ++r) {
    for (size_t j = 0; j < d; ++j) {
      if (s->embed == Pooling::kMean) {
        s->pooled[j] += rows[r * d + j];
      } else {
        s->pooled[j] = rows[r * d + j];
      }
    }
  }
  if (s->num_computed < s->prompt_len) return;  // more chunks to come
  // The whole prompt is in: mean, then L2-normalised (cosine similarity is a dot product).
  const double scale = s->embed == Pooling::kMean ? 1.0 / s->prompt_len : 1.0;
  double norm2 = 0;
  for (double& v : s->pooled) {
    v *= scale;
    norm2 += v * v;
  }
  const double inv = norm2 > 0 ? 1.0 / std::sqrt(norm2) : 1.0;
  StreamEvent ev;
  ev.embedding.resize(d);
  for (size_t j = 0; j < d; ++j) ev.embedding[j] = static_cast<float>(s->pooled[j] * inv);
  ev.finish = FinishReason::kStop;
  Finish(s, std::move(ev));
}

void Engine::FailPlan(const std::vector<Planned>& plan, const Status& status) {
  spdlog::error("forward step failed: {}", status.ToString());
  for (const Planned& p : plan) {
    StreamEvent ev;
    ev.error = status;
    Finish(p.seq, std::move(ev));
  }
}

void Engine::ProcessResults(const std::vector<Planned>& plan,
                            std::span<const SequenceStep> steps) {
  const std::vector<float>& logits = step_logits_;
  const auto now = Clock::now();
  size_t offset = 0;  // into logits: rows of different widths (logits, hidden states)
  int64_t generated = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence* s = plan[i].seq;
    const float* out = logits.data() + offset;
    offset += OutputFloats(steps[i]);
    if (!s->draft.empty()) {
      generated += ProcessSpeculative(s, out, now);  // may finish s
      continue;
    }
    const bool prefill = s->num_computed < s->prompt_len;
    s->num_computed += plan[i].n_tokens;
    if (s->embed != Pooling::kNone) {
      PoolEmbedding(s, steps[i], out);
      continue;
    }
    if (prefill) {
      // A prefill chunk (the last one too): publish its full blocks now, so that concurrent
      // requests with the same prefix (a shared system prompt) reuse them.
      blocks_.InsertPrefix(std::span<const int32_t>(s->tokens).first(s->num_computed),
                           &s->blocks, s->salt);
    }
    if (steps[i].logits != LogitsMode::kLast) continue;
    std::span<const float> row_logits(out, vocab_size_);
    StreamEvent ev;
    const FinishReason finish = PushToken(s, s->sampler->Sample(row_logits), &ev);
    ++generated;
    Deliver(s, std::move(ev), finish, now);
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.generation_tokens += generated;
  ++stats_.steps;
}

FinishReason Engine::PushToken(Sequence* s, SampleResult r, StreamEvent* ev) {
  s->tokens.push_back(r.token);
  StopChecker::Step st = s->stop->Push(r.token, piece_(r.token));
  ev->tokens.push_back(r.token);
  ev->logprobs.push_back(r.logprob);
  ev->top_logprobs.push_back(std::move(r.top_logprobs));
  ev->text += st.text;
  FinishReason finish = st.finish;
  if (finish == FinishReason::kNone && s->sampler->matcher() && s->sampler->matcher()->Done()) {
    // A structured output is complete: nothing but the end token could follow.
    ev->text += s->stop->Flush();
    finish = FinishReason::kStop;
  }
  if (finish == FinishReason::kNone && static_cast<int32_t>(s->tokens.size()) >= s->max_total) {
    ev->text += s->stop->Flush();
    finish = FinishReason::kLength;
  }
  if (finish != FinishReason::kNone) {
    ev->stop_matched = std::move(st.stop_matched);
    ev->stop_token = st.stop_token;
  }
  return finish;
}

void Engine::Deliver(Sequence* s, StreamEvent ev, FinishReason finish, Clock::time_point now) {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    // Tokens that arrive together (a speculative step's) share the interval.
    const size_t n = ev.tokens.size();
    const double gap = std::chrono::duration<double>(now - s->last_token_time).count();
    for (size_t i = 0; i < n; ++i) {
      if (!s->got_first_token && i == 0) {
        ttft_.Observe(std::chrono::duration<double>(now - s->arrive_time).count());
      } else {
        itl_.Observe(s->got_first_token ? gap / n : 0.0);
      }
    }
  }
  s->got_first_token = true;
  s->last_token_time = now;
  if (finish == FinishReason::kNone) {
    s->stream->Push(std::move(ev));
    return;
  }
  ev.finish = finish;
  Finish(s, std::move(ev));
}

void Engine::Speculate(const std::vector<Planned>& plan) {
  std::vector<Sequence*> candidates;
  int32_t decoding = 0;
  for (const Planned& p : plan) {
    Sequence* s = p.seq;
    s->draft.clear();
    s->draft_q.clear();
    const bool decode = p.n_tokens == 1 && s->sampler && s->num_computed >= s->prompt_len &&
                        s->num_computed + 1 == static_cast<int32_t>(s->tokens.size());
    if (!decode) continue;
    ++decoding;
    if (s->speculative) candidates.push_back(s);
  }
  if (candidates.empty()) return;
  if (decoding > options_.speculative.disable_batch_size) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.spec_skipped_steps;
    return;
  }
  std::vector<DraftRequest> requests(candidates.size());
  std::vector<DraftRequest*> asked;
  for (size_t i = 0; i < candidates.size(); ++i) {
    Sequence* s = candidates[i];
    DraftRequest& r = requests[i];
    r.seq_id = s->arrival;
    r.tokens = s->tokens;
    // Never past the request's last token, nor past what one step may add (window pool).
    r.k = std::min({s->spec_k, s->max_total - static_cast<int32_t>(s->tokens.size()),
                    blocks_.MaxStepTokens() - 1});
    r.params = &s->sampler->params();
    r.seed = s->sampler->seed();
    // The step's adapters are within max_adapters_per_step, and so are the draft's (it runs
    // with the same --max-loras-per-batch).
    if (options_.speculative.draft_takes_adapters) {
      r.adapter = s->adapter.get();
      r.adapter_scale = s->adapter_scale;
    }
    if (r.k > 0) asked.push_back(&r);
  }
  if (asked.empty()) return;
  if (Status st = proposer_->Propose(asked); !st.ok()) {
    spdlog::warn("speculative proposal failed, decoding without it this step: {}",
                 st.ToString());
    return;
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    Sequence* s = candidates[i];
    DraftRequest& r = requests[i];
    const int32_t k = static_cast<int32_t>(r.draft.size());
    // The drafts need KV slots too; with none left, this sequence decodes plainly (speculation
    // never preempts anyone).
    if (k == 0 || !GrowBlocks(s, 1 + k)) continue;
    s->draft = std::move(r.draft);
    s->draft_q = std::move(r.q);
    s->verify.assign(1, s->tokens.back());
    s->verify.insert(s->verify.end(), s->draft.begin(), s->draft.end());
  }
}

int32_t Engine::ProcessSpeculative(Sequence* s, const float* rows, Clock::time_point now) {
  const size_t v = static_cast<size_t>(vocab_size_);
  const int32_t k = static_cast<int32_t>(s->draft.size());
  StreamEvent ev;
  FinishReason finish = FinishReason::kNone;
  int32_t accepted = 0;
  ++s->num_computed;  // the last token's KV
  for (int32_t i = 0; i <= k && finish == FinishReason::kNone; ++i) {
    const std::span<const float> row(rows + i * v, v);
    bool kept = false;
    SampleResult r;
    if (i < k) {
      const std::span<const float> q =
          s->draft_q.empty() ? std::span<const float>() : std::span<const float>(s->draft_q).subspan(i * v, v);
      r = s->sampler->SampleDraft(row, s->draft[i], q, &kept);
    } else {
      r = s->sampler->Sample(row);  // every draft kept: the target's next token comes free
    }
    finish = PushToken(s, std::move(r), &ev);
    if (!kept) break;
    ++accepted;
    ++s->num_computed;  // the draft's KV, written by this step, is the sequence's now
  }
  const int32_t emitted = static_cast<int32_t>(ev.tokens.size());
  ++s->spec_passes;
  s->spec_drafted += k;
  s->spec_accepted += accepted;
  s->spec_emitted += emitted;
  if (options_.speculative.adaptive) {
    if (accepted == k) {
      s->spec_k = std::min(s->spec_k + 1, options_.speculative.num_draft_tokens);
    } else if (accepted == 0) {
      s->spec_k = std::max(s->spec_k - 1, 1);
    }
  }
  s->draft.clear();
  s->draft_q.clear();
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.spec_verify_steps;
    stats_.spec_draft_tokens += k;
    stats_.spec_accepted_tokens += accepted;
    stats_.spec_emitted_tokens += emitted;
  }
  Deliver(s, std::move(ev), finish, now);
  return emitted;
}

void Engine::RunUntilIdle(int64_t max_steps) {
  for (int64_t i = 0; i < max_steps; ++i) {
    if (!Step()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (inbox_.empty() && flush_requests_.empty()) return;
    }
  }
}

void Engine::Loop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    RunKvDroppedTasks();
    if (Step()) continue;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_ || wake_; });
  }
}

void Engine::PublishStats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.running = static_cast<int32_t>(running_.size());
  {
    std::lock_guard<std::mutex> lock2(mu_);
    stats_.queued = num_queued_;
  }
  auto names = [](const auto& sequences, std::vector<std::string>* out) {
    out->clear();
    for (const auto& s : sequences) {
      if (s->adapter && std::find(out->begin(), out->end(), s->adapter->name()) == out->end()) {
        out->push_back(s->adapter->name());
      }
    }
  };
  names(running_, &stats_.running_adapters);
  names(waiting_, &stats_.waiting_adapters);
  PublishKvStatsLocked();
}

void Engine::PublishKvStatsLocked() {
  stats_.kv_blocks_held = blocks_.NumHeld();
  stats_.kv_blocks_cached = blocks_.NumCached();
  stats_.window_blocks_total = blocks_.num_window_blocks();
  stats_.window_blocks_free = blocks_.NumWindowFree();
  stats_.prefix = blocks_.stats();
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

namespace {

// One metric family of a single sample in Prometheus' text format; `labels` without braces.
void AppendMetric(const char* name, const char* type, const char* help, const std::string& labels,
                  double value, std::string* out) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
          name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(value) + "\n";
}

}  // namespace

void Engine::RenderMetrics(std::string* out) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  auto gauge = [&](const char* name, const char* type, const char* help, double value) {
    AppendMetric(name, type, help, "", value, out);
  };
  const EngineStats& s = stats_;
  gauge("polychip_num_running_reqs", "gauge", "Requests in the running batch.", s.running);
  gauge("polychip_num_queue_reqs", "gauge", "Requests waiting to run.", s.queued);
  gauge("polychip_kv_blocks_total", "gauge", "KV cache blocks.", s.kv_blocks_total);
  gauge("polychip_kv_blocks_used", "gauge", "KV blocks held by running requests.",
        s.kv_blocks_held);
  gauge("polychip_kv_blocks_cached", "gauge", "KV blocks in the prefix cache.",
        s.kv_blocks_cached);
  gauge("polychip_kv_cache_usage", "gauge", "Fraction of KV blocks held by running requests.",
        s.kv_blocks_total ? static_cast<double>(s.kv_blocks_held) / s.kv_blocks_total : 0.0);
  if (s.window_blocks_total > 0) {
    gauge("polychip_kv_window_blocks_total", "gauge",
          "KV blocks of the sliding-window layers' pool.", s.window_blocks_total);
    gauge("polychip_kv_window_blocks_free", "gauge",
          "Free blocks of the sliding-window layers' pool.", s.window_blocks_free);
  }
  gauge("polychip_prefix_cache_hit_rate", "gauge",
        "Prompt tokens found in the prefix cache / prompt tokens looked up.", s.prefix.hit_rate());
  gauge("polychip_prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from cache.",
        static_cast<double>(s.prefix.hit_tokens));
  gauge("polychip_num_preemptions_total", "counter", "Requests preempted (KV cache full).",
        static_cast<double>(s.preemptions));
  gauge("polychip_prompt_tokens_total", "counter", "Prompt tokens processed.",
        static_cast<double>(s.prompt_tokens));
  gauge("polychip_generation_tokens_total", "counter", "Tokens generated.",
        static_cast<double>(s.generation_tokens));
  gauge("polychip_requests_finished_total", "counter", "Requests finished.",
        static_cast<double>(s.requests_finished));
  gauge("polychip_requests_aborted_total", "counter", "Requests aborted (client gone).",
        static_cast<double>(s.requests_aborted));
  gauge("polychip_requests_failed_total", "counter", "Requests failed.",
        static_cast<double>(s.requests_failed));
  if (proposer_) {
    gauge("polychip_spec_verify_steps_total", "counter",
          "Speculative decoding: sequence steps that verified draft tokens.",
          static_cast<double>(s.spec_verify_steps));
    gauge("polychip_spec_draft_tokens_total", "counter", "Draft tokens proposed.",
          static_cast<double>(s.spec_draft_tokens));
    gauge("polychip_spec_accepted_tokens_total", "counter", "Draft tokens accepted.",
          static_cast<double>(s.spec_accepted_tokens));
    gauge("polychip_spec_skipped_steps_total", "counter",
          "Steps run without speculation: more decoding sequences than "
          "--speculative-disable-batch-size.",
          static_cast<double>(s.spec_skipped_steps));
    gauge("polychip_spec_acceptance_rate", "gauge", "Draft tokens accepted / proposed.",
          s.spec_draft_tokens ? double(s.spec_accepted_tokens) / s.spec_draft_tokens : 0.0);
    gauge("polychip_spec_accept_length", "gauge",
          "Tokens emitted per verification step (accepted drafts + 1).",
          s.spec_verify_steps ? double(s.spec_emitted_tokens) / s.spec_verify_steps : 0.0);
    spec_accept_len_.Render("polychip_spec_request_accept_length",
                            "Per finished request that speculated: tokens per verification step.",
                            out);
  }
  ttft_.Render("polychip_time_to_first_token_seconds", "Time to first token.", out);
  itl_.Render("polychip_inter_token_latency_seconds", "Time between generated tokens.", out);
  runner_->RenderMetrics(out);
  e2e_.Render("polychip_e2e_request_latency_seconds", "Request latency, arrival to end.", out);
  queue_time_.Render("polychip_queue_time_seconds", "Time from arrival to first scheduling.",
                     out);
}

void Engine::RenderVllmMetrics(const std::string& model_name, std::string* out) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  const std::string labels = "model_name=\"" + PromLabelValue(model_name) + "\"";
  auto one = [&](const char* name, const char* type, const char* help, double value) {
    AppendMetric(name, type, help, labels, value, out);
  };
  const EngineStats& s = stats_;
  const double usage =
      s.kv_blocks_total ? static_cast<double>(s.kv_blocks_held) / s.kv_blocks_total : 0.0;
  one("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
      s.running);
  one("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
      s.queued);
  one("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  // The name before vLLM 0.10, still read by older dashboards.
  one("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  one("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions.",
      static_cast<double>(s.preemptions));
  one("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
      static_cast<double>(s.prompt_tokens));
  one("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
      static_cast<double>(s.generation_tokens));
  one("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in number of tokens.",
      static_cast<double>(s.prefix.hit_tokens));
  one("vllm:request_success_total", "counter", "Count of successfully processed requests.",
      static_cast<double>(s.requests_finished));
  if (proposer_) {
    one("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.",
        static_cast<double>(s.spec_verify_steps));
    one("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.",
        static_cast<double>(s.spec_draft_tokens));
    one("vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.",
        static_cast<double>(s.spec_accepted_tokens));
  }
  // The adapters of the requests running and waiting, comma-separated, and how many one step
  // may hold, as vLLM's gauge (the Gateway API inference extension's endpoint picker reads it
  // to send a request where its adapter is already loaded).
  auto join = [](const std::vector<std::string>& names) {
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ",") + n;
    return PromLabelValue(list);
  };
  *out += "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
          "# TYPE vllm:lora_requests_info gauge\n"
          "vllm:lora_requests_info{max_lora=\"" +
          std::to_string(options_.max_adapters_per_step) + "\",running_lora_adapters=\"" +
          join(s.running_adapters) + "\",waiting_lora_adapters=\"" +
          join(s.waiting_adapters) + "\"} 1\n";
  ttft_.Render("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
               out, labels);
  itl_.Render("vllm:time_per_output_token_seconds",
              "Histogram of time per output token in seconds.", out, labels);
  itl_.Render("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
              out, labels);
  e2e_.Render("vllm:e2e_request_latency_seconds",
              "Histogram of end to end request latency in seconds.", out, labels);
  queue_time_.Render("vllm:request_queue_time_seconds",
                     "Histogram of time spent in WAITING phase for request.", out, labels);
}

}  // namespace polychip::engine
