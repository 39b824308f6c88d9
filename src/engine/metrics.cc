#include "engine/metrics.h"

#include <fmt/format.h>

namespace polychip::engine {

void Histogram::Render(const std::string& name, const std::string& help, std::string* out,
                       const std::string& labels) const {
  *out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string more = labels.empty() ? "" : "," + labels;
  const std::string only = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += fmt::format("{}_bucket{{le=\"{}\"{}}} {}\n", name, bounds_[i], more, cumulative);
  }
  cumulative += counts_.back();
  *out += fmt::format("{}_bucket{{le=\"+Inf\"{}}} {}\n", name, more, cumulative);
  *out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, only, sum_, name, only, count_);
}

std::string PromLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace polychip::engine
