// `polychip doctor`: diagnoses plugin discovery. Prints the search path, every candidate file
// and why it is or is not usable (dlopen error, unresolved dependencies as ldd would show them,
// missing symbol, ABI pair, probe reason), then tries the backend that was asked for, if any.
// Exit 1 when a requested backend cannot be loaded, or when no backend is usable at all.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "runtime/dtype.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/op_coverage.h"
#include "model/runner_setup.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/isolated_diagnosis.h"
#include "runtime/op_fallback.h"
#include "runtime/plugin_loader.h"

namespace polychip::cli {
namespace {

using runtime::PluginKind;

struct DoctorOptions {
  std::string model_path;
  std::string kv_type = "f16";
};

// The model's op coverage on the selected device: op, dtype, supported / fallback / missing.
int PrintModelCoverage(std::ostream& out, const DoctorOptions& o,
                       const GlobalOptions& globals) {
  out << "\nop coverage of " << o.model_path << ":\n";
  const std::optional<DType> kv_type = DTypeFromName(o.kv_type);
  const StatusOr<DType> kv =
      kv_type ? StatusOr<DType>(*kv_type)
              : StatusOr<DType>(InvalidArgument("unknown KV cache type " + o.kv_type));
  auto device = model::OpenDevice(globals.config_path, globals.device);
  auto file = model::GgufFile::Open(o.model_path);
  if (!kv.ok() || !device.ok() || !file.ok()) {
    out << "  FAILED: "
        << (!kv.ok() ? kv.status() : !device.ok() ? device.status() : file.status()).ToString()
        << "\n";
    return 1;
  }
  auto config = model::ModelConfig::FromGguf(**file);
  if (!config.ok()) {
    out << "  FAILED: " << config.status().ToString() << "\n";
    return 1;
  }
  const runtime::Device& d = **device;
  out << "  device " << d.backend()->name() << ":" << d.physical_id() << " (" << d.props().name
      << ")";
  if (d.op_fallback() != nullptr) {
    out << ", fallback " << d.op_fallback()->device().backend()->name() << ":"
        << d.op_fallback()->device().physical_id();
  }
  out << "\n\n";
  const auto rows = model::CheckCoverage(d, model::RequiredOps(**file, *config, {*kv, *kv}));
  std::istringstream table(model::FormatCoverage(rows));
  for (std::string line; std::getline(table, line);) out << "  " << line << "\n";
  const Status status = model::CoverageStatus(d, rows);
  out << "\n" << (status.ok() ? "  every op is covered" : "  " + status.message()) << "\n";
  for (const model::WeightSplit& split :
       model::PlanWeightSplits(**file, d.props().max_alloc_size)) {
    out << "  split: " << split.tensor << " (" << split.bytes << " bytes) into " << split.pieces
        << " allocations by rows (max single allocation " << d.props().max_alloc_size << ")\n";
  }
  return status.ok() ? 0 : 1;
}

int RunDoctor(const DoctorOptions& o, const GlobalOptions& globals) {
  std::ostream& out = std::cout;
  const char* env_backend = std::getenv("POLYCHIP_DEVICE_BACKEND");
  const char* env_path = std::getenv("POLYCHIP_PLUGIN_PATH");
  out << "POLYCHIP_DEVICE_BACKEND=" << (env_backend ? env_backend : "(unset)") << "\n"
      << "POLYCHIP_PLUGIN_PATH=" << (env_path ? env_path : "(unset)") << "\n";
  auto config = runtime::ResolveRuntimeConfig(globals.config_path, globals.device);
  if (!config.ok()) {
    out << "configuration: " << config.status().ToString() << "\n";
    return 1;
  }

  const auto search = runtime::PluginSearchPath(config->extra_search_path);
  out << "\nsearch path:\n";
  for (const auto& dir : search) {
    std::error_code ec;
    out << "  " << dir << (std::filesystem::is_directory(dir, ec) ? "" : "  (does not exist)")
        << "\n";
  }

  out << "\ncandidates:\n";
  const auto files = runtime::DiscoverPlugins(search);
  if (files.empty()) out << "  none (no libpolychip_backend_*.so or libpolychip_comm_*.so)\n";
  int usable_backends = 0;
  for (const auto& f : files) {
    out << "  " << runtime::PluginKindName(f.kind) << " " << f.name << ": " << f.path << "\n";
    if (f.shadowed) {
      out << "    shadowed by an earlier directory of the search path\n";
      continue;
    }
    // In a child process: a plugin that crashes or hangs there is reported, not fatal.
    runtime::LoadReport r =
        runtime::DiagnosePluginInChild(f.path, f.kind, runtime::ProbeTimeoutSeconds());
    if (r.usable) {
      if (f.kind == PluginKind::kBackend) ++usable_backends;
      out << "    usable: " << r.name << " " << r.version << ", ABI " << r.abi_major << "."
          << r.abi_minor;
      if (r.probe_score >= 0) out << ", probe score " << r.probe_score;
      out << "\n";
    } else {
      out << "    NOT usable (" << r.stage << "): " << r.reason << "\n";
    }
    // ldd-like: every direct dependency, and any missing one further down.
    const auto missing = runtime::MissingLibraries(f.path);
    for (const auto& lib : runtime::NeededLibraries(f.path)) {
      const bool lost = std::find(missing.begin(), missing.end(), lib) != missing.end();
      out << "      " << lib << (lost ? " => not found" : " => found") << "\n";
    }
    for (const auto& lib : missing) {
      const auto direct = runtime::NeededLibraries(f.path);
      if (std::find(direct.begin(), direct.end(), lib) == direct.end()) {
        out << "      " << lib << " => not found (indirect dependency)\n";
      }
    }
  }

  int rc = 0;
  if (config->backend) {
    out << "\nrequested backend: "
        << (config->backend->name.empty() ? config->backend->path : config->backend->name)
        << " (selected by " << config->backend_source << ")\n";
    auto sel = runtime::SelectPlugins(*config);
    if (sel.ok()) {
      out << "  loaded " << sel->backend->name() << " " << sel->backend->version() << " from "
          << sel->backend->path() << "\n";
      auto count = sel->backend->DeviceCount();
      out << "  devices visible: " << (count.ok() ? std::to_string(*count) : count.status().ToString())
          << "\n";
    } else {
      out << "  FAILED: " << sel.status().ToString() << "\n";
      rc = 1;
    }
  } else if (usable_backends == 0) {
    out << "\nno usable device backend found\n";
    rc = 1;
  }
  if (!o.model_path.empty() && PrintModelCoverage(out, o, globals) != 0) rc = 1;
  return rc;
}

std::function<int()> SetupDoctor(CLI::App& app, const GlobalOptions& globals) {
  auto o = std::make_shared<DoctorOptions>();
  app.add_option("--model-path,-m", o->model_path,
                 "also print this model's op coverage on the device (--device, --op-fallback)");
  app.add_option("--kv-type,--kv-cache-dtype", o->kv_type,
                 "KV cache type of the coverage (f16; bf16, f32, q8_0, q4_0, fp8_e4m3)");
  return [o, &globals] { return RunDoctor(*o, globals); };
}

const bool kRegistered =
    RegisterCommand({"doctor", "diagnose plugin discovery and loading", SetupDoctor});

}  // namespace
}  // namespace polychip::cli
