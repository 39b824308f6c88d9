#include "cli/model_options.h"

#include <CLI/CLI.hpp>

namespace polychip::cli {

void AddParallelOptions(CLI::App& app, int* tp_size, int* pp_size) {
  app.add_option("--tp-size", *tp_size,
                 "tensor-parallel ranks, one process each (--device emu:0,1: a device per rank)")
      ->check(CLI::Range(1, 64));
  app.add_option("--pp-size", *pp_size,
                 "pipeline stages (layers split), one process per rank; ranks = tp x pp")
      ->check(CLI::Range(1, 64));
}

StatusOr<DType> ParseKvCacheType(const std::string& name) {
  auto type = DTypeFromName(name);
  if (!type) return InvalidArgument("unknown KV cache type " + name);
  return *type;
}

}  // namespace polychip::cli
