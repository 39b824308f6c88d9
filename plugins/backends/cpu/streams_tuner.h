// Picks how a decode matmul reads its weights (KernelTable::gemm_packed_streams): how many
// streams per thread, and whether the kernel prefetches in software. The best way is the
// host's, not the code's: on the Zen 5 VMs (65-72 GB/s) three streams with prefetch read
// fastest; on a Zen 4 VM with ~30 GB/s of memory one stream read 17% faster than three, and
// leaving the prefetches out was another 8-14% faster there (the hardware prefetcher follows one
// stream alone; decode_kernels, docs/performance.md, "Decode weight streams"). No choice made at
// build or load time is right on all of them, and the hosts' bandwidth moves within minutes, so
// the tuner explores, keeps the fastest for a while, then explores again.
//
// Comparisons are per weight matrix. While exploring, each matrix takes the candidates in turn
// on its own successive launches: in decode that is one launch per step, so consecutive steps
// alternate and the host's drift cancels (a step-wide rotation by launch count would give a
// matrix the same candidate every step whenever the step's launch count is a multiple of the
// candidates). A candidate's score is the sum over matrices of its mean time on each: the
// estimated step time if every matrix read that way, so a model's mix of large and small
// matrices weighs the same for every candidate. After the first round (each matrix once with
// each candidate), candidates over kPruneRatio times the best one's score sit out the other
// rounds: on a host where some way of reading is several times slower (prefetch off where the
// hardware prefetcher cannot follow), exploring costs one slow pass, not kRoundsPerCandidate.
//
// Not thread-safe: the plugin serialises launches.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

namespace polychip::cpu {

// How a decode matmul reads its weights.
struct WeightRead {
  int streams = 3;       // per thread, 1..kMaxWeightStreams
  bool prefetch = true;  // software prefetch ahead of each stream
};

class StreamsTuner {
 public:
  // Candidate i: 1 + i % kMaxStreams streams, with prefetch for i < kMaxStreams (4 streams
  // measured no better than 3 anywhere).
  static constexpr int kMaxStreams = 3;
  static constexpr int kCandidates = 2 * kMaxStreams;
  static WeightRead Candidate(int i) { return {1 + i % kMaxStreams, i < kMaxStreams}; }
  // Launches of each matrix per candidate while exploring (so at most 12 decode steps).
  static constexpr int kRoundsPerCandidate = 2;
  // A candidate this much slower than the best after the first round is not tried again.
  static constexpr double kPruneRatio = 1.25;
  // Launches of each matrix between explorations (2-4 s of decode on the small models).
  static constexpr int kExploitRounds = 256;

  // on_decision (optional) hears each decision, in words (the plugin logs it at debug level).
  explicit StreamsTuner(std::function<void(const std::string&)> on_decision = {})
      : on_decision_(std::move(on_decision)) {
    StartExploring();
  }

  // The candidate for this launch of the matrix whose weights start at `weights`.
  int Pick(const void* weights);
  // The launch took `ns` with candidate `candidate`.
  void Record(const void* weights, int candidate, int64_t ns);

  int best() const { return best_; }
  bool exploring() const { return exploring_; }
  int decisions() const { return decisions_; }
  // Whether candidate c is still tried in this exploration.
  bool active(int c) const { return active_[c]; }

 private:
  struct Matrix {
    int64_t visits = 0;
    int64_t ns[kCandidates] = {};
    int64_t launches[kCandidates] = {};
  };
  // Each candidate's estimated pass time (the sum over the matrices measured with every active
  // candidate of the mean time on each); returns how many matrices that is.
  int64_t Score(double step_ns[kCandidates]) const;
  void Prune();
  void Decide();
  void StartExploring();

  std::function<void(const std::string&)> on_decision_;
  std::unordered_map<const void*, Matrix> matrices_;  // this exploration's measurements
  bool exploring_ = true;
  int64_t launches_ = 0;          // launches recorded in this phase
  int64_t exploit_launches_ = 0;  // length of the current exploitation
  int best_ = 2;                  // until the first decision: three streams with prefetch
  int decisions_ = 0;
  bool active_[kCandidates];  // tried in this exploration's later rounds
  int n_active_ = kCandidates;
  bool pruned_ = false;  // this exploration's first round has been judged
};

}  // namespace polychip::cpu
