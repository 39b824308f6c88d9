// Picks how many weight streams per thread a decode matmul reads (KernelTable::
// gemm_packed_streams) by measuring the matmuls the plugin runs anyway. The best count is the
// host's, not the code's: on one Zen 5 VM (65-72 GB/s) three streams read ~8% faster than two
// and ~10% faster than one; on another of the same kind with ~30 GB/s of memory, one stream read
// 17% faster than three (decode_kernels matmul-streams, docs/performance.md, session 11). No
// count chosen at build or load time is right on both, and the hosts' bandwidth moves within
// minutes, so the tuner explores, keeps the fastest for a while, then explores again.
//
// Comparisons are per weight matrix. While exploring, each matrix takes the candidates in turn
// on its own successive launches: in decode that is one launch per step, so consecutive steps
// alternate and the host's drift cancels (a step-wide rotation by launch count would give a
// matrix the same candidate every step whenever the step's launch count is a multiple of the
// candidates). A candidate's score is the sum over matrices of its mean time on each: the
// estimated step time if every matrix read that way, so a model's mix of large and small
// matrices weighs the same for every candidate.
//
// Not thread-safe: the plugin serialises launches.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

namespace polychip::cpu {

class StreamsTuner {
 public:
  static constexpr int kCandidates = 3;  // 1, 2 or 3 streams (4 measured no better than 3)
  // Launches of each matrix per candidate while exploring (so 9 decode steps).
  static constexpr int kRoundsPerCandidate = 3;
  // Launches of each matrix between explorations (about a second of decode on the small models).
  static constexpr int kExploitRounds = 128;

  // on_decision (optional) hears each decision, in words (the plugin logs it at debug level).
  explicit StreamsTuner(std::function<void(const std::string&)> on_decision = {})
      : on_decision_(std::move(on_decision)) {}

  // Streams for this launch of the matrix whose weights start at `weights` (1..kCandidates).
  int Pick(const void* weights);
  // The launch took `ns` with `streams` streams.
  void Record(const void* weights, int streams, int64_t ns);

  int best() const { return best_; }
  bool exploring() const { return exploring_; }
  int decisions() const { return decisions_; }

 private:
  struct Matrix {
    int64_t visits = 0;
    int64_t ns[kCandidates] = {};
    int64_t launches[kCandidates] = {};
  };
  void Decide();

  std::function<void(const std::string&)> on_decision_;
  std::unordered_map<const void*, Matrix> matrices_;  // this exploration's measurements
  bool exploring_ = true;
  int64_t launches_ = 0;          // launches recorded in this phase
  int64_t exploit_launches_ = 0;  // length of the current exploitation
  int best_ = kCandidates;        // until the first decision: the old fixed default
  int decisions_ = 0;
};

}  // namespace polychip::cpu
