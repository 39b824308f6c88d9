#include "streams_tuner.h"

#include <string>

namespace polychip::cpu {

int StreamsTuner::Pick(const void* weights) {
  if (!exploring_) return best_;
  const auto it = matrices_.find(weights);
  const int64_t visits = it == matrices_.end() ? 0 : it->second.visits;
  return static_cast<int>(visits % kCandidates);
}

void StreamsTuner::Record(const void* weights, int candidate, int64_t ns) {
  ++launches_;
  if (!exploring_) {
    if (launches_ >= exploit_launches_) {  // explore again: the host may have changed
      exploring_ = true;
      launches_ = 0;
      matrices_.clear();
    }
    return;
  }
  if (candidate < 0 || candidate >= kCandidates) return;
  // A model has a few hundred matrices; more means stale pointers (a model was unloaded) or
  // something that is not a decode loop: start over rather than grow.
  if (matrices_.size() >= 8192) {
    matrices_.clear();
    launches_ = 0;
  }
  Matrix& m = matrices_[weights];
  ++m.visits;
  m.ns[candidate] += ns;
  ++m.launches[candidate];
  if (launches_ >= static_cast<int64_t>(kRoundsPerCandidate) * kCandidates *
                       static_cast<int64_t>(matrices_.size())) {
    Decide();
  }
}

void StreamsTuner::Decide() {
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
  best_ = best;
  ++decisions_;
  exploring_ = false;
  exploit_launches_ = static_cast<int64_t>(kExploitRounds) * compared;
  launches_ = 0;
  if (on_decision_) {
    const WeightRead r = Candidate(best_);
    std::string msg = "decode weight reads: " + std::to_string(r.streams) + " stream(s)" +
                      (r.prefetch ? " with" : " without") + " prefetch (" +
                      std::to_string(compared) + " matrices; us per pass";
    for (int c = 0; c < kCandidates; ++c) {
      const WeightRead o = Candidate(c);
      msg += (c ? ", " : ": ") + std::to_string(o.streams) + (o.prefetch ? "+pf " : " ") +
             std::to_string(static_cast<int64_t>(step_ns[c] / 1e3));
    }
    on_decision_(msg + ")");
  }
}

}  // namespace polychip::cpu
