// The cost of a forward step on this device and model, learned while serving, and the prefill
// chunk that keeps running streams within an inter-token latency target (--max-itl-ms).
//
// A step's time is modelled as  t = a + b·decode_seqs + c·prefill_tokens  (fixed cost, the
// cost of one decoding sequence, the cost of one prompt token), fitted by exponentially
// weighted least squares over recent steps, so the model follows a change of load or clock.
// The time observed is the device time the plugin's per-op counters measured for the step
// when it has them (not disturbed by the host), plus the host's share of the step (wall time
// minus device time) as a running mean; the step's wall time otherwise.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace polychip::engine {

// The fewest prompt tokens a step with a latency target carries, so that a prefill always moves
// on. Well under a KV block: a chunk may end inside a block (the prompt's last chunk always could;
// the runner writes each token's KV slot by position and only full blocks are published to the
// prefix cache), and one block of prompt can cost more than the target leaves.
inline constexpr int32_t kMinPrefillChunk = 4;

class StepCostModel {
 public:
  // `decay`: the weight an observation loses per later step (0.98: about the last 50 steps).
  explicit StepCostModel(double decay = 0.98) : decay_(decay) {}

  // One step: `decode_seqs` sequences decoding one token each, `prefill_tokens` prompt tokens,
  // `wall_s` the step as the engine timed it, `device_s` the device time of its ops when the
  // plugin counts it.
  void Observe(int64_t decode_seqs, int64_t prefill_tokens, double wall_s,
               std::optional<double> device_s);

  // A step with prompt tokens and a few more: enough to tell the costs apart (the fit refines
  // with every step; waiting for more would let the first long prompts through unsliced).
  bool ready() const { return prefill_steps_ >= 1 && steps_ >= kMinSteps; }
  // Predicted wall seconds of a step.
  double Predict(int64_t decode_seqs, int64_t prefill_tokens) const;
  // Seconds one prompt token adds to a step (>= 0).
  double PrefillTokenSeconds() const;
  // The most prompt tokens a step with `decode_seqs` decoding sequences may carry so that it
  // stays within `target_s`, clamped to [min_tokens, max_tokens]: min_tokens keeps a prefill
  // moving when even a decode-only step misses the target, and is the answer while no positive
  // cost per prompt token has been learned. The budget also at most doubles the largest prompt
  // chunk a step with decoding sequences has carried so far (a slow start): the fit is not
  // trusted far beyond the steps it has seen, where a cost learned from a few noisy startup
  // steps could otherwise let a whole long prompt into one step.
  int32_t PrefillBudget(int64_t decode_seqs, double target_s, int32_t min_tokens,
                        int32_t max_tokens) const;

 private:
  static constexpr int kMinSteps = 4;
  std::array<double, 3> Solve() const;  // {a, b, c}, cached in coef_

  double decay_;
  std::array<std::array<double, 3>, 3> xtx_{};  // weighted sum of x·xᵀ, x = {1, decode, prefill}
  std::array<double, 3> xty_{};                 // weighted sum of x·t
  std::array<double, 3> coef_{};
  double host_s_ = 0;  // running mean of wall - device
  bool has_host_ = false;
  int64_t steps_ = 0, prefill_steps_ = 0;
  int64_t max_mixed_prefill_ = 0;  // most prompt tokens of a step that also decoded
};

}  // namespace polychip::engine
