// The seam between the engine (scheduler, KV block manager, server) and a model executing on
// devices. The engine decides WHICH tokens run and WHERE their KV lives (block ids); the runner
// computes them. The runner owns the KV cache memory: num_kv_blocks() blocks of
// block_size() token slots per layer, allocated from the device memory pool.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace polychip::engine {

enum class LogitsMode {
  kNone,  // no logits (a prefill chunk that does not reach the end of the prompt)
  kLast,  // logits of the last token of this step (sampling)
  kAll,   // logits of every token of this step (perplexity, prompt logprobs)
  // The final hidden states (after the output norm, before the output projection) instead of
  // logits, hidden_size() floats per row: embeddings.
  kHiddenLast,  // of the last token of this step
  kHiddenAll,   // of every token of this step
};

inline bool IsHidden(LogitsMode m) {
  return m == LogitsMode::kHiddenLast || m == LogitsMode::kHiddenAll;
}

// A LoRA adapter (model/lora.h) as the engine sees it: an identity, never reused, that keys the
// prefix cache (KV computed under one adapter is never another's) and counts towards
// EngineOptions::max_adapters_per_step.
class Adapter {
 public:
  virtual ~Adapter() = default;
  virtual int64_t id() const = 0;
  // The name requests choose it by (/metrics lists the adapters running and waiting).
  virtual const std::string& name() const = 0;
};

// One sequence's share of a forward step.
struct SequenceStep {
  int64_t seq_id = 0;
  std::span<const int32_t> tokens;       // new tokens to process this step
  int32_t start_pos = 0;                 // position of tokens[0] = tokens already in the KV cache
  std::span<const int32_t> block_table;  // block ids covering positions [0, start_pos + n)
  LogitsMode logits = LogitsMode::kLast;
  // With a window pool (ModelRunner::num_window_kv_blocks() > 0): the sliding layers' blocks
  // for the same positions; num_window_kv_blocks() (a spare block) where released.
  std::span<const int32_t> window_block_table;
  // The LoRA adapter applied to this sequence (null: the base model) at `adapter_scale`.
  const Adapter* adapter = nullptr;
  float adapter_scale = 1;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_length() const = 0;  // max positions per sequence
  virtual int64_t block_size() const = 0;      // token slots per KV block
  virtual int64_t num_kv_blocks() const = 0;   // KV blocks available to the engine
  // The KV blocks in pools of this many (block b in pool b / kv_blocks_per_pool()), where a
  // layer's cache did not fit one allocation: a sequence's blocks must all be in one pool.
  // 0: one pool.
  virtual int64_t kv_blocks_per_pool() const { return 0; }
  // Sliding-window layers with KV blocks of their own, released once a sequence has moved
  // kv_window() positions past them: the size of that window pool (0: those layers use the main
  // blocks, nothing is released) and the window. See BlockManager's WindowPool.
  virtual int64_t num_window_kv_blocks() const { return 0; }
  virtual int64_t kv_window() const { return 0; }
  // Floats per hidden-state row (the model width); 0: this runner cannot return hidden states
  // (a step asking for them fails).
  virtual int64_t hidden_size() const { return 0; }

  // Runs one step over the batch. `logits` receives, in batch order, one row per requested
  // output (1 for kLast and kHiddenLast, tokens.size() for kAll and kHiddenAll, 0 for kNone):
  // vocab_size() floats for a logits row, hidden_size() floats for a hidden-state row.
  // RESOURCE_EXHAUSTED means the step did not fit on the device (the engine retries smaller).
  virtual Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) = 0;

  // Appends the runner's own Prometheus series to /metrics (e.g. op fallback launches).
  virtual void RenderMetrics(std::string* out) const {}

  // Device seconds of the last Forward's ops, as the plugin's per-op counters measured them;
  // nullopt when the plugin does not time its ops. The scheduler learns step costs from it.
  virtual std::optional<double> LastStepDeviceSeconds() const { return std::nullopt; }
};

}  // namespace polychip::engine
