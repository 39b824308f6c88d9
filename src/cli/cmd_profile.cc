// `polychip profile`: where a step's time goes, op by op, from the device plugin's per-op
// counters (ABI 1.3): one prefill step of -p prompt tokens and the mean decode step over -n
// single-token steps after it, each as a table of calls, total time, % of the step's wall
// time, achieved GB/s and GFLOP/s, beside the device's figure: on a host-memory device the
// host's read bandwidth, measured here as `polychip bench --membw` does (the ABI reports no
// peak figures of a device). A warm-up prefill and decode run first and are not counted. With
// --lora, the first adapter applies to the sequence (as in `polychip run`): its terms' time is
// the LORA row (or the MATMUL and SCALE launches of a plugin that composes them).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "cli/launch_flags.h"
#include "cli/profiling.h"
#include "launch/launch.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/op_counters.h"

namespace polychip::cli {
namespace {

struct ProfileOptions {
  GivenFlags flags;  // the model and where it runs (launch/launch_options.h)
  int n_prompt = 128;
  int n_gen = 16;
  int membw_mib = 256;
};

using Clock = std::chrono::steady_clock;

int Run(const ProfileOptions& o, const GlobalOptions& globals) {
  auto spec = BuildSpec(globals, launch::kScopeModel, o.flags, nullptr);
  if (!spec.ok()) return Fail(spec.status());
  if (Status s = launch::RefuseSpeculation(*spec, "polychip profile",
                                           "it profiles the model's plain prefill and decode");
      !s.ok()) {
    return Fail(s);
  }
  if (spec->model_path.empty()) return Fail(InvalidArgument("--model-path is required"));
  if (o.n_prompt < 1 || o.n_gen < 1) return Fail(InvalidArgument("-p and -n must be >= 1"));
  if (Status s = launch::CheckModelPath(spec->model_path); !s.ok()) return Fail(s);
  auto mf = model::OpenModelFile(spec->model_path);
  if (!mf.ok()) return Fail(mf.status());
  // One sequence of n_prompt + n_gen positions.
  const int64_t bs = spec->page_size;
  spec->context_length = o.n_prompt + o.n_gen + 1;
  const int64_t blocks = (spec->context_length + bs - 1) / bs;
  spec->max_total_tokens = blocks * bs;
  spec->max_running_requests = 1;
  spec->max_tokens_per_step = o.n_prompt;
  spec->tp_size = spec->pp_size = 1;
  auto launch = launch::Resolve(*spec, *mf, nullptr);
  if (!launch.ok()) return Fail(launch.status());
  auto lora = launch::LoadOfflineLora(*spec, mf->config);
  if (!lora.ok()) return Fail(lora.status());
  auto runner = launch::CreateRunner(*launch, *mf, nullptr);
  if (!runner.ok()) return Fail(runner.status());
  model::TransformerRunner& r = static_cast<model::TransformerRunner&>(**runner);
  const runtime::Device& dev = r.device();
  if (!dev.backend()->ReadOpCounters(dev)) {
    return Fail(FailedPrecondition(
        "the " + dev.backend()->name() +
        " plugin has no per-op counters (op_counters_read: ABI 1.3), or they are switched off "
        "(parameter op_counters=off)"));
  }

  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>(b));
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(r.vocab_size() - 1));
  std::vector<int32_t> prompt(o.n_prompt);
  for (auto& t : prompt) t = tok(rng);
  std::vector<float> logits;
  auto step = [&](std::span<const int32_t> tokens, int32_t start) -> Status {
    engine::SequenceStep st;
    st.tokens = tokens;
    st.start_pos = start;
    st.block_table = table;
    lora->Apply(st);
    return r.Forward({&st, 1}, &logits);
  };
  struct Measured {
    std::vector<runtime::OpCounters> ops;
    double wall_s = 0;
  };
  // Runs `body`, returning the counters' difference and the wall time.
  auto measure = [&](const std::function<Status()>& body) -> StatusOr<Measured> {
    const auto before = dev.backend()->ReadOpCounters(dev);
    const auto t0 = Clock::now();
    PC_RETURN_IF_ERROR(body());
    Measured m;
    m.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto after = dev.backend()->ReadOpCounters(dev);
    if (before && after) m.ops = runtime::OpCountersDelta(*before, *after);
    return m;
  };
  auto decode = [&](int n) -> Status {
    for (int i = 0; i < n; ++i) {
      const int32_t t = tok(rng);
      PC_RETURN_IF_ERROR(step({&t, 1}, o.n_prompt + i));
    }
    return Status::Ok();
  };
  // Warm-up: first touches of weights and workspace, kernels' first-use setup.
  if (Status s = step(prompt, 0); !s.ok()) return Fail(s);
  if (Status s = decode(1); !s.ok()) return Fail(s);
  auto prefill = measure([&] { return step(prompt, 0); });
  if (!prefill.ok()) return Fail(prefill.status());
  auto decoded = measure([&] { return decode(o.n_gen); });
  if (!decoded.ok()) return Fail(decoded.status());

  std::optional<double> bandwidth;
  std::string figure =
      "none: the plugin's device is not host memory and the ABI reports no "
      "peak bandwidth or FLOP/s";
  if (dev.props().host_accessible) {
    const int threads = spec->threads > 0 ? spec->threads : int(std::thread::hardware_concurrency());
    bandwidth = MeasureReadBandwidth(threads, size_t(o.membw_mib) << 20);
    figure = fmt::format(
        "host read bandwidth {:.2f} GB/s ({} threads streaming {} MiB, best of "
        "7, as `polychip bench --membw`); no peak FLOP/s figure",
        *bandwidth / 1e9, threads, o.membw_mib);
  }
  std::printf("model: %s, %.1f MiB of weights\n", mf->config.Summary().c_str(),
              r.weight_bytes() / 1048576.0);
  if (lora->adapter) {
    std::printf("adapter: %s (scale %g)\n", spec->lora.front().c_str(), lora->scale);
  }
  std::printf("device: %s (backend %s %s, generation %llu)\n", dev.props().name.c_str(),
              dev.backend()->name().c_str(), dev.backend()->version().c_str(),
              static_cast<unsigned long long>(dev.backend()->generation()));
  std::printf("device figure: %s\n\n", figure.c_str());
  std::printf("## prefill step: %d tokens, %.3f ms wall\n\n", o.n_prompt, prefill->wall_s * 1e3);
  std::printf("%s\n", OpTable(prefill->ops, 1, prefill->wall_s, bandwidth).c_str());
  const double decode_wall = decoded->wall_s / o.n_gen;
  std::printf("## decode step: 1 token at position %d..%d, mean of %d steps, %.3f ms wall\n\n",
              o.n_prompt, o.n_prompt + o.n_gen - 1, o.n_gen, decode_wall * 1e3);
  std::printf("%s", OpTable(decoded->ops, o.n_gen, decode_wall, bandwidth).c_str());
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<ProfileOptions>();
  AddLaunchOptions(app, launch::kScopeModel, &o->flags);
  app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens of the prefill step (default 128)");
  app.add_option("-n,--n-gen", o->n_gen, "decode steps averaged (default 16)");
  app.add_option("--membw-mib", o->membw_mib, "buffer of the bandwidth probe (default 256)");
  return [o, &globals] { return Run(*o, globals); };
}

const bool kRegistered = RegisterCommand(
    {"profile", "per-op time, bytes and FLOPs of a prefill and a decode step", Setup});

}  // namespace
}  // namespace polychip::cli
