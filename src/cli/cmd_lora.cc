// `polychip lora merge BASE ADAPTER OUT [--scale S]`: a model with a LoRA adapter merged into
// its matrices (W + s B A, each matrix keeping its type), which gives the adapter's outputs
// without the adapter (model/lora.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "model/lora.h"

namespace polychip::cli {
namespace {

struct MergeArgs {
  std::string base, adapter, out;
  float scale = 1;
};

int RunMerge(const MergeArgs& a) {
  if (Status s = model::MergeLora(a.base, a.adapter, a.scale, a.out); !s.ok()) {
    std::fprintf(stderr, "polychip: error: %s\n", s.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "merged %s (scale %g) into %s -> %s\n", a.adapter.c_str(), a.scale,
               a.base.c_str(), a.out.c_str());
  return 0;
}

std::function<int()> SetupLora(CLI::App& app, const GlobalOptions&) {
  auto a = std::make_shared<MergeArgs>();
  app.require_subcommand(1);
  CLI::App* merge = app.add_subcommand("merge", "merge a LoRA adapter into its base model");
  merge->add_option("base", a->base, "base model GGUF")->required();
  merge->add_option("adapter", a->adapter, "LoRA adapter GGUF (llama.cpp's layout)")->required();
  merge->add_option("output", a->out, "output GGUF")->required();
  merge->add_option("--scale", a->scale, "the adapter's scale (default 1)");
  return [a]() { return RunMerge(*a); };
}

const bool kRegistered =
    RegisterCommand({"lora", "LoRA adapter tools (merge into the base model)", SetupLora});

}  // namespace
}  // namespace polychip::cli
