#include "cli/profiling.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "runtime/ops.h"

namespace polychip::cli {

// Sums the buffer in 32-byte vectors (GCC vector extensions: plain C++ that compiles to
// whatever SIMD the baseline target has; the sum keeps the reads from being optimised away).
double MeasureReadBandwidth(int threads, size_t bytes) {
  using Clock = std::chrono::steady_clock;
  typedef uint64_t V4 __attribute__((vector_size(32)));
  const size_t n = bytes / sizeof(V4);
  std::unique_ptr<V4[]> buf(new V4[n]);
  for (size_t i = 0; i < n; ++i) buf[i] = V4{i, i + 1, i + 2, i + 3};  // touch every page
  double best = 0;
  std::vector<uint64_t> sums(threads * 8);
  for (int pass = 0; pass < 7; ++pass) {
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const size_t b = n * t / threads, e = n * (t + 1) / threads;
        V4 s0 = {}, s1 = {}, s2 = {}, s3 = {};
        for (size_t i = b; i + 4 <= e; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        const V4 s = s0 + s1 + s2 + s3;
        sums[t * 8] = s[0] + s[1] + s[2] + s[3];
      });
    }
    for (auto& t : ts) t.join();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, bytes / s);
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  if (total == 42) std::fprintf(stderr, " ");  // keeps `total` alive
  return best;
}

namespace {
std::string Name(int32_t op) { return runtime::OpName(static_cast<runtime::Op>(op)); }
}  // namespace

nlohmann::json OpRecordsJson(const std::vector<runtime::OpCounters>& ops, int steps) {
  const double k = 1.0 / std::max(steps, 1);
  nlohmann::json out = nlohmann::json::array();
  for (const runtime::OpCounters& c : ops) {
    nlohmann::json r = {{"op", Name(c.op)}, {"calls", c.launches * k}};
    r["device_ns"] = c.has_time ? nlohmann::json(c.device_ns * k) : nlohmann::json();
    r["bytes_read"] = c.has_bytes ? nlohmann::json(c.bytes_read * k) : nlohmann::json();
    r["bytes_written"] = c.has_bytes ? nlohmann::json(c.bytes_written * k) : nlohmann::json();
    r["flops"] = c.has_flops ? nlohmann::json(c.flops * k) : nlohmann::json();
    out.push_back(std::move(r));
  }
  return out;
}

std::string OpTable(const std::vector<runtime::OpCounters>& ops_in, int steps, double step_wall_s,
                    std::optional<double> bandwidth_bps) {
  std::vector<runtime::OpCounters> ops = ops_in;
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
    return a.device_ns != b.device_ns ? a.device_ns > b.device_ns : a.launches > b.launches;
  });
  const double k = 1.0 / std::max(steps, 1);
  std::string out = fmt::format("| op | calls | time ms | % step | GB/s |{} GFLOP/s |\n",
                                bandwidth_bps ? " % of bw |" : "");
  out +=
      fmt::format("| --- | ---: | ---: | ---: | ---: |{} ---: |\n", bandwidth_bps ? " ---: |" : "");
  double total_ns = 0;
  for (const runtime::OpCounters& c : ops) {
    const double ns = c.device_ns * k;
    total_ns += ns;
    const double s = ns * 1e-9;
    const double bytes = (c.bytes_read + c.bytes_written) * k;
    auto cell = [](bool ok, double v, const char* f) {
      return ok ? fmt::format(fmt::runtime(f), v) : std::string("-");
    };
    const bool timed = c.has_time && s > 0;
    std::string row =
        fmt::format("| {} | {:g} | {} | {} | {} |", Name(c.op), c.launches * k,
                    // Three decimals, or three significant digits for ops under a microsecond
                    // (a tiny model's kv_store), which would otherwise read 0.000.
                    cell(c.has_time, ns / 1e6, ns >= 1000 ? "{:.3f}" : "{:.3g}"),
                    cell(c.has_time && step_wall_s > 0, 100 * s / step_wall_s, "{:.1f}"),
                    cell(timed && c.has_bytes, bytes / s / 1e9, "{:.2f}"));
    if (bandwidth_bps) {
      row += fmt::format(" {} |",
                         cell(timed && c.has_bytes, 100 * bytes / s / *bandwidth_bps, "{:.0f}"));
    }
    row += fmt::format(" {} |\n", cell(timed && c.has_flops, c.flops * k / s / 1e9, "{:.2f}"));
    out += row;
  }
  out += fmt::format("| **all ops** | | {:.3f} | {:.1f} | | {}\n", total_ns / 1e6,
                     step_wall_s > 0 ? 100 * total_ns * 1e-9 / step_wall_s : 0.0,
                     bandwidth_bps ? "| |" : "|");
  return out;
}

}  // namespace polychip::cli
