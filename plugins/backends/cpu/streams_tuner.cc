#include "streams_tuner.h"

#include <cstdio>

namespace polychip::cpu {

int StreamsTuner::Pick(const void* weights) {
  if (!exploring_) return best_;
  const auto it = matrices_.find(weights);
  const int64_t visits = it == matrices_.end() ? 0 : it->second.visits;
  return 1 + static_cast<int>(visits % kCandidates);
}

void StreamsTuner::Record(const void* weights, int streams, int64_t ns) {
  ++launches_;
  if (!exploring_) {
    if (launches_ >= exploit_launches_) {  // explore again: the host may have changed
      exploring_ = true;
      launches_ = 0;
      matrices_.clear();
    }
    return;
  }
  if (streams < 1 || streams > kCandidates) return;
  // A model has a few hundred matrices; more means stale pointers (a model was unloaded) or
  // something that is not a decode loop: start over rather than grow.
  if (matrices_.size() >= 8192) {
    matrices_.clear();
    launches_ = 0;
  }
  Matrix& m = matrices_[weights];
  ++m.visits;
  m.ns[streams - 1] += ns;
  ++m.launches[streams - 1];
  if (launches_ >= static_cast<int64_t>(kRoundsPerCandidate) * kCandidates *
                       static_cast<int64_t>(matrices_.size())) {
    Decide();
  }
}

void StreamsTuner::Decide() {
  static_assert(kCandidates == 3, "the message below names three candidates");
  double step_ns[kCandidates] = {};
  int64_t compared = 0;  // matrices measured with every candidate
  for (const auto& [weights, m] : matrices_) {
    bool all = true;
    for (int c = 0; c < kCandidates; ++c) all = all && m.launches[c] > 0;
    if (!all) continue;
    ++compared;
    for (int c = 0; c < kCandidates; ++c)
      step_ns[c] += static_cast<double>(m.ns[c]) / static_cast<double>(m.launches[c]);
  }
  if (compared == 0) return;  // keep exploring
  int best = 0;
  for (int c = 1; c < kCandidates; ++c)
    if (step_ns[c] < step_ns[best]) best = c;
  best_ = best + 1;
  ++decisions_;
  exploring_ = false;
  exploit_launches_ = static_cast<int64_t>(kExploitRounds) * compared;
  launches_ = 0;
  if (on_decision_) {
    char msg[160];
    std::snprintf(msg, sizeof msg,
                  "decode weight streams: %d (%lld matrices, us per pass with 1/2/3 streams: "
                  "%.0f / %.0f / %.0f)",
                  best_, static_cast<long long>(compared), step_ns[0] / 1e3, step_ns[1] / 1e3,
                  step_ns[2] / 1e3);
    on_decision_(msg);
  }
}

}  // namespace polychip::cpu
