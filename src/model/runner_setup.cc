#include "model/runner_setup.h"

#include <spdlog/spdlog.h>

#include "runtime/config.h"
#include "runtime/plugin_loader.h"

namespace polychip::model {

runtime::PluginParams ThreadsParams(int threads) {
  if (threads <= 0) return {};
  return {{kThreadsParam, std::to_string(threads)}};
}

StatusOr<std::shared_ptr<runtime::Device>> OpenDevice(const std::string& config_path,
                                                      const std::string& device_flag,
                                                      int threads) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config,
                      runtime::ResolveRuntimeConfig(config_path, device_flag));
  const runtime::PluginParams params = ThreadsParams(threads);
  if (config.backend) {
    config.backend->params.insert(config.backend->params.end(), params.begin(), params.end());
  }
  // Without a backend named, only the chosen one is loaded: a hot reload to another discovered
  // plugin must find it unloaded (issue 38).
  PC_ASSIGN_OR_RETURN(runtime::Selection selection,
                      runtime::SelectPlugins(config, runtime::Discovery::kBest, params));
  if (!selection.backend) {
    return NotFound("no device backend found (set --device, e.g. --device cpu:0)");
  }
  return OpenFirstDevice(selection.backend, config);
}

StatusOr<std::shared_ptr<runtime::Device>> OpenFirstDevice(
    const std::shared_ptr<runtime::Backend>& backend, const runtime::RuntimeConfig& config) {
  PC_ASSIGN_OR_RETURN(auto devices, runtime::OpenDevices(backend, config.devices));
  if (devices.empty()) {
    return NotFound("backend " + backend->name() + " has no visible device");
  }
  if (!config.op_fallback.empty()) {
    PC_ASSIGN_OR_RETURN(auto fallback, OpenFallbackDevice(config));
    if (fallback->backend() != backend) devices.front()->SetOpFallback(fallback);
  }
  return devices.front();
}

StatusOr<std::shared_ptr<runtime::Device>> OpenFallbackDevice(
    const runtime::RuntimeConfig& config) {
  std::vector<runtime::LoadReport> reports;
  auto backend = runtime::PluginRegistry::Global().LoadBackend(
      config.op_fallback, runtime::PluginSearchPath(config.extra_search_path), {}, &reports);
  if (!backend.ok()) {
    return Status(backend.status().code(), "op fallback '" + config.op_fallback + "' (" +
                                               config.op_fallback_source +
                                               "): " + backend.status().message());
  }
  PC_ASSIGN_OR_RETURN(auto devices, runtime::OpenDevices(*backend, {0}));
  spdlog::info("op fallback: ops the device lacks run on {}:0 ({})", (*backend)->name(),
               config.op_fallback_source);
  return devices.front();
}

StatusOr<ModelFile> OpenModelFile(const std::string& path) {
  ModelFile m;
  PC_ASSIGN_OR_RETURN(m.file, GgufFile::Open(path));
  PC_ASSIGN_OR_RETURN(m.config, ModelConfig::FromGguf(*m.file));
  PC_ASSIGN_OR_RETURN(m.tokenizer, Tokenizer::FromGguf(*m.file));
  if (m.tokenizer->n_vocab() != m.config.n_vocab) {
    return InvalidArgument(path + ": the tokenizer has " + std::to_string(m.tokenizer->n_vocab()) +
                           " tokens but the model's vocabulary is " +
                           std::to_string(m.config.n_vocab));
  }
  // The tokenizer copied the vocabulary and merges: their pages need not stay resident.
  m.file->ReleaseMetadataPages();
  return m;
}

}  // namespace polychip::model
