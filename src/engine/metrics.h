// Prometheus-style histograms for the engine's latency metrics. Not thread-safe on its own; the
// engine guards its histograms with its stats mutex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace polychip::engine {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

  // Default bounds for latencies in seconds (1 ms .. 60 s).
  static Histogram Latency() {
    return Histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                      30, 60});
  }

  void Observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++count_;
  }

  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

  // Appends the `_bucket`, `_sum` and `_count` lines of metric `name`; `labels` (e.g.
  // `model_name="m"`, already escaped) go on every line.
  void Render(const std::string& name, const std::string& help, std::string* out,
              const std::string& labels = "") const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// A Prometheus label value: backslash, double quote and newline escaped.
std::string PromLabelValue(const std::string& value);

}  // namespace polychip::engine
