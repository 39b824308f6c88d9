// `polychip quantize IN OUT TYPE`: convert a model's weights (policy in model/quantize.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "model/quantize.h"

namespace polychip::cli {
namespace {

struct QuantizeArgs {
  std::string in, out, type;
  int threads = 0;
  bool quiet = false;
};

int RunQuantize(const QuantizeArgs& a) {
  auto scheme = model::ParseQuantScheme(a.type);
  if (!scheme.ok()) {
    std::fprintf(stderr, "polychip: error: %s\n", scheme.status().message().c_str());
    return 1;
  }
  model::QuantizeOptions opts;
  opts.type = scheme->type;
  opts.mix = scheme->mix;
  opts.threads = a.threads;
  opts.progress = !a.quiet;
  Status s = model::QuantizeFile(a.in, a.out, opts);
  if (!s.ok()) {
    std::fprintf(stderr, "polychip: error: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

std::function<int()> SetupQuantize(CLI::App& app, const GlobalOptions&) {
  auto a = std::make_shared<QuantizeArgs>();
  app.add_option("input", a->in, "input GGUF")->required();
  app.add_option("output", a->out, "output GGUF")->required();
  app.add_option("type", a->type, "target type: " + model::QuantSchemeNames())->required();
  app.add_option("--threads", a->threads, "worker threads (0: all cores)");
  app.add_flag("-q,--quiet", a->quiet, "no progress output");
  return [a]() { return RunQuantize(*a); };
}

const bool kRegistered =
    RegisterCommand({"quantize", "convert a GGUF model's weights to another type", SetupQuantize});

}  // namespace
}  // namespace polychip::cli
