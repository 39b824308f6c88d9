// What a command needs before it can run a model: the device chosen by --device / --config /
// the environment, and the model file with its configuration and tokenizer. Shared by
// `polychip run`, `polychip perplexity` and the server.
#pragma once

#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::model {

// How a thread count reaches a plugin: threads > 0 becomes its "threads" parameter; 0 (auto)
// passes nothing and the plugin picks (the cpu plugin: one per core). Every entry point that
// loads a backend (OpenDevice, the launch builder, the C API, hot reload) adds it through here.
inline constexpr const char* kThreadsParam = "threads";
runtime::PluginParams ThreadsParams(int threads);

// Loads the configured backend (or, with none configured, the best one discovered) and opens
// its first selected device, with ThreadsParams(threads).
StatusOr<std::shared_ptr<runtime::Device>> OpenDevice(const std::string& config_path,
                                                      const std::string& device_flag,
                                                      int threads = 0);

// The first device of config.devices on `backend` (already loaded), with config.op_fallback
// set on it. OpenDevice's second half; hot reload opens the new plugin's device with it.
StatusOr<std::shared_ptr<runtime::Device>> OpenFirstDevice(
    const std::shared_ptr<runtime::Backend>& backend, const runtime::RuntimeConfig& config);

// The device of config.op_fallback (its first), for Device::SetOpFallback.
StatusOr<std::shared_ptr<runtime::Device>> OpenFallbackDevice(
    const runtime::RuntimeConfig& config);

struct ModelFile {
  std::unique_ptr<GgufFile> file;
  ModelConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
};
// Opens a GGUF model, reads and validates its configuration, builds its tokenizer.
StatusOr<ModelFile> OpenModelFile(const std::string& path);

}  // namespace polychip::model
