#include "streams_tuner.h"

#include <algorithm>
#include <string>

namespace polychip::cpu {

int StreamsTuner::Pick(const void* weights) {
  if (!exploring_) return best_;
  const auto it = matrices_.find(weights);
  const int64_t visits = it == matrices_.end() ? 0 : it->second.visits;
  if (visits < kCandidates) return static_cast<int>(visits);     // the first round: every one
  int k = static_cast<int>((visits - kCandidates) % n_active_);  // then the active ones in turn
  for (int c = 0; c < kCandidates; ++c) {
    if (active_[c] && k-- == 0) return c;
  }
  return best_;
}

void StreamsTuner::StartExploring() {
  exploring_ = true;
  launches_ = 0;
  matrices_.clear();
  for (bool& a : active_) a = true;
  n_active_ = kCandidates;
  pruned_ = false;
}

void StreamsTuner::Record(const void* weights, int candidate, int64_t ns) {
  ++launches_;
  if (!exploring_) {
    if (launches_ >= exploit_launches_) StartExploring();  // the host may have changed
    return;
  }
  if (candidate < 0 || candidate >= kCandidates) return;
  // A model has a few hundred matrices; more means stale pointers (a model was unloaded) or
  // something that is not a decode loop: start over rather than grow.
  if (matrices_.size() >= 8192) StartExploring();
  Matrix& m = matrices_[weights];
  ++m.visits;
  m.ns[candidate] += ns;
  ++m.launches[candidate];
  const int64_t n = static_cast<int64_t>(matrices_.size());
  if (!pruned_ && launches_ >= kCandidates * n) Prune();
  if (pruned_ && launches_ >= (kCandidates + (kRoundsPerCandidate - 1) * n_active_) * n) Decide();
}

int64_t StreamsTuner::Score(double step_ns[kCandidates]) const {
  for (int c = 0; c < kCandidates; ++c) step_ns[c] = 0;
  int64_t compared = 0;
  for (const auto& [weights, m] : matrices_) {
    bool all = true;
    for (int c = 0; c < kCandidates; ++c) all = all && (!active_[c] || m.launches[c] > 0);
    if (!all) continue;
    ++compared;
    for (int c = 0; c < kCandidates; ++c) {
      if (active_[c])
        step_ns[c] += static_cast<double>(m.ns[c]) / static_cast<double>(m.launches[c]);
    }
  }
  return compared;
}

void StreamsTuner::Prune() {
  double step_ns[kCandidates];
  if (Score(step_ns) == 0) return;  // no matrix has met every candidate yet
  double best = step_ns[0];
  for (int c = 1; c < kCandidates; ++c) best = std::min(best, step_ns[c]);
  for (int c = 0; c < kCandidates; ++c) {
    if (step_ns[c] > kPruneRatio * best) {
      active_[c] = false;
      --n_active_;
    }
  }
  pruned_ = true;
}

void StreamsTuner::Decide() {
  double step_ns[kCandidates];
  const int64_t compared = Score(step_ns);
  if (compared == 0) return;  // keep exploring
  int best = -1;
  for (int c = 0; c < kCandidates; ++c) {
    if (active_[c] && (best < 0 || step_ns[c] < step_ns[best])) best = c;
  }
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
             (active_[c] ? std::to_string(static_cast<int64_t>(step_ns[c] / 1e3)) : "dropped");
    }
    on_decision_(msg + ")");
  }
}

}  // namespace polychip::cpu
