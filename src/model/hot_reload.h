// Hot reload of the device plugin under a live model: ReloadableRunner is the ModelRunner a
// single-rank server runs, a TransformerRunner on a plugin that Reload() replaces while the
// process keeps serving.
//
// Reload() runs between two engine steps with no KV in use (Engine::RunWithKvDropped): it
// checks the new file's handshake (dlopen, symbols, ABI, table, probe: a file that is no plugin
// is refused before anything stops), frees the runner (weights, KV cache, workspace) and the
// old plugin's device, releases the old plugin (shut down and dlclose'd as its last reference
// goes), runs the conformance kit on the new file for the ops this model launches (initialize,
// device open, then op.<name>.<dtype>.* of every op in RequiredOps), loads it, opens its device
// and builds the runner again (op coverage, weight upload, KV cache). A failure after the
// release frees what the new plugin got and loads the old one again from its path, so the
// server keeps serving on it; the outcome names the stage and the reason.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/op_coverage.h"
#include "model/runner.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::model {

// The backend a runner is on, as /get_server_info and /admin/reload_plugin report it.
struct BackendInfo {
  std::string name;
  std::string path;
  std::string version;
  std::string abi;          // "1.3"
  uint64_t generation = 0;  // runtime::Backend::generation()
  std::string file_stamp;   // "<inode>:<mtime ns>" of the file when it was loaded
};

struct ReloadOutcome {
  bool ok = false;
  // Where a failed reload stopped: "resolve", "conformance", "load", "device", "runner"
  // (coverage, weight upload, KV allocation), "restore" (the old plugin could not be loaded
  // again: the server has no device until the next successful reload).
  std::string stage;
  std::string reason;
  BackendInfo previous;
  BackendInfo current;          // what serves now (the old plugin again after a failure)
  bool old_unloaded = false;    // the old library's last reference went (dlclose)
  int32_t conformance_checks = 0;  // checks run by the smoke (passed or skipped)
  double seconds = 0;           // release + checks + load + upload
};

class ReloadableRunner : public engine::ModelRunner {
 public:
  // Opens `backend`'s first device of config.devices and builds the runner on it. `file` must
  // outlive the runner (weights are uploaded again from it on every reload).
  static StatusOr<std::unique_ptr<ReloadableRunner>> Create(
      const GgufFile& file, const ModelConfig& config, runtime::RuntimeConfig runtime_config,
      std::shared_ptr<runtime::Backend> backend, const RunnerOptions& options);
  ~ReloadableRunner() override;

  int64_t vocab_size() const override { return config_.n_vocab; }
  int64_t context_length() const override { return context_length_; }
  int64_t block_size() const override { return block_size_; }
  int64_t num_kv_blocks() const override { return num_kv_blocks_; }
  int64_t num_window_kv_blocks() const override { return num_window_kv_blocks_; }
  int64_t kv_blocks_per_pool() const override { return kv_blocks_per_pool_; }
  int64_t kv_window() const override { return kv_window_; }
  int64_t hidden_size() const override { return config_.n_embd; }
  Status Forward(std::span<const engine::SequenceStep> batch,
                 std::vector<float>* logits) override;
  // The runner's series, then polychip_backend_info{backend, version, path, generation} and
  // polychip_plugin_reloads_total{result}.
  void RenderMetrics(std::string* out) const override;
  // The serving runner's (engine thread, like Forward: no lock).
  std::optional<double> LastStepDeviceSeconds() const override {
    return runner_ ? runner_->LastStepDeviceSeconds() : std::nullopt;
  }

  // Replaces the plugin by `spec` (a name found on the search path, or a path; its params go
  // to initialize). Only between steps with no KV in use: see Engine::RunWithKvDropped.
  ReloadOutcome Reload(const runtime::PluginSpec& spec);

  BackendInfo Current() const;
  // How the serving plugin was loaded (name, path, params).
  runtime::PluginSpec CurrentSpec() const;
  // The device now serving (null between release and load, or after a failed restore).
  std::shared_ptr<runtime::Device> device() const;

 private:
  ReloadableRunner(const GgufFile& file, const ModelConfig& config,
                   runtime::RuntimeConfig runtime_config, RunnerOptions options)
      : file_(file), config_(config), runtime_config_(std::move(runtime_config)),
        options_(options) {}
  // Loads the plugin of `spec` from `path` and builds the runner on it; on failure *stage says
  // which step failed.
  Status Build(const std::string& path, const runtime::PluginSpec& spec, std::string* stage);
  // Frees the runner and the device and releases the plugin; true when its library unloaded.
  bool ReleaseCurrent();

  const GgufFile& file_;
  const ModelConfig config_;
  runtime::RuntimeConfig runtime_config_;
  const RunnerOptions options_;
  // The geometry of the first build: the engine's block manager is sized by it, so every
  // later runner must have the same.
  int64_t context_length_ = 0;
  int64_t block_size_ = 0;
  int64_t num_kv_blocks_ = 0;
  int64_t num_window_kv_blocks_ = 0;
  int64_t kv_blocks_per_pool_ = 0;
  int64_t kv_window_ = 0;

  mutable std::mutex mu_;  // guards the three below against /metrics and device() readers
  std::unique_ptr<TransformerRunner> runner_;
  std::shared_ptr<runtime::Backend> backend_;
  runtime::PluginSpec spec_;  // how backend_ was loaded
  std::string file_stamp_;    // of backend_'s file at load time
  int64_t reloads_ok_ = 0;
  int64_t reloads_failed_ = 0;
};

// "<inode>:<mtime ns>" of a file, empty if it cannot be read: tells a file replaced in place.
std::string FileStamp(const std::string& path);

// The conformance kit's check-name filter (an ECMAScript regex) that selects the checks of the
// ops in `uses`: op.<name>.<dtype>... for an op with a dtype, op.<name>... for one without.
std::string ConformanceFilter(const std::vector<OpUse>& uses);

}  // namespace polychip::model
