// Plugin hot reload in `polychip serve`: the single-rank runner that can be reloaded, the
// POST /admin/reload_plugin handler and the SIGHUP re-read of --config. The swap itself is
// model::ReloadableRunner::Reload run inside Engine::RunWithKvDropped (docs/hot-reload.md).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/hot_reload.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/device.h"
#include "util/status.h"

namespace polychip::cli {

class ServeReloader {
 public:
  // `runner` null: a multi-rank server (tp x pp = `ranks` > 1), whose reloads are refused.
  // `threads` > 0 is passed to every plugin loaded later, as at startup.
  ServeReloader(engine::Engine* engine, model::ReloadableRunner* runner, int ranks,
                std::string config_path, int threads)
      : engine_(engine), runner_(runner), ranks_(ranks), config_path_(std::move(config_path)),
        threads_(threads) {}

  // POST /admin/reload_plugin {"kind": "backend"|"comm", "name": ..., "path": ...,
  // "params": {...}} -> (HTTP status, JSON reply). 200 with the new backend and the swap time;
  // 400 for a bad body; 409 when this server cannot reload that kind (multi-rank, or comm on a
  // single rank, which has no communicator) or a reload is already running; 422 when the new
  // plugin failed a step (the old one serves again); 500 when even the old one could not be
  // loaded again.
  std::pair<int, nlohmann::json> Handle(const nlohmann::json& body);
  // SIGHUP: re-reads --config and reloads when its backend (name, path, params) differs from
  // the one serving, or its file changed since it was loaded. The outcome goes to the log.
  void ReloadFromConfig();
  // The /get_server_info fields: backend, backend_path, backend_version, backend_generation.
  nlohmann::json Info() const;
  // Why no backend serves (the last reload failed and the old plugin could not be loaded
  // again), "" while one does: /health's readiness. Never blocks.
  std::string Unavailable() const;

 private:
  std::pair<int, nlohmann::json> Reload(runtime::PluginSpec spec);

  engine::Engine* engine_;
  model::ReloadableRunner* runner_;
  int ranks_;
  std::string config_path_;
  int threads_;
  std::mutex mu_;  // one reload at a time
  std::atomic<bool> no_backend_{false};
};

}  // namespace polychip::cli
