#include "engine/step_cost.h"

#include <algorithm>
#include <cmath>

namespace polychip::engine {

void StepCostModel::Observe(int64_t decode_seqs, int64_t prefill_tokens, double wall_s,
                            std::optional<double> device_s) {
  if (!(wall_s >= 0) || decode_seqs + prefill_tokens <= 0) return;
  double t = wall_s;
  if (device_s && *device_s > 0 && *device_s <= wall_s) {
    t = *device_s;
    const double host = wall_s - *device_s;
    host_s_ = has_host_ ? 0.9 * host_s_ + 0.1 * host : host;
    has_host_ = true;
  }
  const double x[3] = {1.0, static_cast<double>(decode_seqs), static_cast<double>(prefill_tokens)};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xtx_[i][j] = decay_ * xtx_[i][j] + x[i] * x[j];
    xty_[i] = decay_ * xty_[i] + x[i] * t;
  }
  ++steps_;
  if (prefill_tokens > 0) ++prefill_steps_;
  if (decode_seqs > 0) max_mixed_prefill_ = std::max(max_mixed_prefill_, prefill_tokens);
  coef_ = Solve();
}

// The normal equations with a little ridge (so that a load where every step decodes the same
// number of sequences, collinear with the constant, still solves), by Gaussian elimination.
std::array<double, 3> StepCostModel::Solve() const {
  double m[3][4];
  const double ridge = 1e-9 * (xtx_[0][0] + xtx_[1][1] + xtx_[2][2]) + 1e-12;
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m[i][j] = xtx_[i][j] + (i == j ? ridge : 0);
    m[i][3] = xty_[i];
  }
  for (int c = 0; c < 3; ++c) {
    int pivot = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::fabs(m[r][c]) > std::fabs(m[pivot][c])) pivot = r;
    std::swap(m[c], m[pivot]);
    if (std::fabs(m[c][c]) < 1e-300) return coef_;
    for (int r = 0; r < 3; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (int k = c; k < 4; ++k) m[r][k] -= f * m[c][k];
    }
  }
  return {m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]};
}

double StepCostModel::PrefillTokenSeconds() const { return std::max(0.0, coef_[2]); }

double StepCostModel::Predict(int64_t decode_seqs, int64_t prefill_tokens) const {
  // The fixed cost and the per-sequence cost are clamped together, not each: a load whose steps
  // all decode about the same number of sequences pins down a + b·decode_seqs well but splits it
  // between a and b at random, and clamping a negative b alone would add |b|·decode_seqs.
  const double decode = std::max(0.0, coef_[0] + coef_[1] * decode_seqs);
  return decode + PrefillTokenSeconds() * prefill_tokens + (has_host_ ? host_s_ : 0.0);
}

int32_t StepCostModel::PrefillBudget(int64_t decode_seqs, double target_s, int32_t min_tokens,
                                     int32_t max_tokens) const {
  max_tokens = std::max(min_tokens, static_cast<int32_t>(std::min<int64_t>(
                                        max_tokens, 2 * max_mixed_prefill_)));
  const double per_token = PrefillTokenSeconds();
  // No positive cost per prompt token learned (yet): noise in the first few steps, e.g. a slow
  // warm-up step with a short prompt, can fit a negative one. Taking the ceiling then could put a
  // whole long prompt into one step; the floor keeps the target, and its steps teach the cost.
  if (per_token <= 0) return min_tokens;
  const double left = target_s - Predict(decode_seqs, 0);
  if (left <= 0) return min_tokens;
  const double tokens = std::floor(left / per_token);
  if (tokens >= max_tokens) return max_tokens;
  return std::max(min_tokens, static_cast<int32_t>(tokens));
}

}  // namespace polychip::engine
