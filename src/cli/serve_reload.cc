#include "cli/serve_reload.h"

#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "runtime/config.h"

namespace polychip::cli {
namespace {

using nlohmann::json;

json InfoJson(const model::BackendInfo& b) {
  return {{"name", b.name}, {"path", b.path}, {"version", b.version}, {"abi", b.abi},
          {"generation", b.generation}};
}

// An OpenAI-shaped error ({"error": {...}}) with more fields beside it.
std::pair<int, json> Refuse(int status, const std::string& message, json extra = json::object()) {
  json reply = std::move(extra);
  reply["ok"] = false;
  reply["error"] = {{"message", message},
                    {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                    {"param", nullptr},
                    {"code", status}};
  return {status, reply};
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

}  // namespace

std::pair<int, json> ServeReloader::Handle(const json& body) {
  auto text = [&](const char* key, std::string* out) {
    if (!body.contains(key) || body[key].is_null()) return true;
    if (!body[key].is_string()) return false;
    *out = body[key].get<std::string>();
    return true;
  };
  std::string kind = "backend";
  runtime::PluginSpec spec;
  if (!text("kind", &kind) || !text("name", &spec.name) || !text("path", &spec.path)) {
    return Refuse(400, "'kind', 'name' and 'path' must be strings");
  }
  if (kind != "backend" && kind != "comm") {
    return Refuse(400, "unknown plugin kind '" + kind + "' (backend or comm)");
  }
  if (spec.name.empty() && spec.path.empty()) {
    return Refuse(400, "give the plugin's 'name' (found on the search path) or its 'path'");
  }
  if (body.contains("params")) {
    if (!body["params"].is_object()) return Refuse(400, "'params' must be an object");
    for (const auto& [k, v] : body["params"].items()) {
      spec.params.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  if (kind == "comm") {
    if (ranks_ == 1) {
      return Refuse(409, "this server runs a single rank: it has no communicator, so there is "
                         "no comm plugin to replace; nothing was changed");
    }
    return Refuse(409, "comm plugin reload on a server of " + std::to_string(ranks_) +
                           " ranks is not supported: every rank would have to swap its "
                           "communicator in step; restart the server with the new plugin");
  }
  return Reload(std::move(spec));
}

std::pair<int, json> ServeReloader::Reload(runtime::PluginSpec spec) {
  if (runner_ == nullptr) {
    return Refuse(409, "hot reload on a server of " + std::to_string(ranks_) +
                           " ranks (tp x pp) is not supported: every rank would have to swap its "
                           "plugin in step, and only rank 0 hears this request; restart the "
                           "server with the new plugin");
  }
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return Refuse(409, "a plugin reload is already in progress");
  for (auto& p : model::ThreadsParams(threads_)) spec.params.push_back(p);

  model::ReloadOutcome outcome;
  const auto start = std::chrono::steady_clock::now();
  auto preempted = engine_->RunWithKvDropped([&] { outcome = runner_->Reload(spec); });
  const double swap_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!preempted.ok()) return Refuse(503, preempted.status().message());

  json reply = {{"kind", "backend"},
                {"backend", InfoJson(outcome.current)},
                {"previous", InfoJson(outcome.previous)},
                {"preempted_requests", *preempted},
                {"old_unloaded", outcome.old_unloaded},
                {"conformance_checks", outcome.conformance_checks},
                {"swap_ms", swap_ms}};
  no_backend_.store(!outcome.ok && outcome.stage == "restore");
  if (outcome.ok) {
    reply["ok"] = true;
    spdlog::info("hot reload: {} generation {} serving, swap {:.1f} ms, {} requests resumed",
                 outcome.current.name, outcome.current.generation, swap_ms, *preempted);
    return {200, reply};
  }
  reply["stage"] = outcome.stage;
  reply["reason"] = outcome.reason;
  if (outcome.stage == "restore") {
    reply["restored"] = false;
    return Refuse(500, "plugin reload failed and the old plugin could not be loaded again: " +
                           outcome.reason + "; requests fail until a reload succeeds",
                  reply);
  }
  // Before the handshake passed nothing was stopped; after it, the old plugin was loaded again.
  const bool untouched = outcome.stage == "resolve" || outcome.stage == "handshake";
  reply["restored"] = !untouched;
  return Refuse(422,
                "plugin reload refused at " + outcome.stage + ": " + outcome.reason +
                    "; backend '" + outcome.current.name + "' (generation " +
                    std::to_string(outcome.current.generation) + ") " +
                    (untouched ? "kept serving, never stopped" : "was loaded again and serves"),
                reply);
}

void ServeReloader::ReloadFromConfig() {
  if (config_path_.empty()) {
    spdlog::warn("SIGHUP: no --config to re-read; nothing reloaded");
    return;
  }
  auto config = runtime::LoadConfigFile(config_path_);
  if (!config.ok()) {
    spdlog::error("SIGHUP: {}; nothing reloaded", config.status().ToString());
    return;
  }
  if (config->comm && ranks_ == 1) {
    spdlog::info("SIGHUP: the config's comm plugin is not used by a single-rank server");
  }
  if (!config->backend) {
    spdlog::info("SIGHUP: {} names no backend; nothing reloaded", config_path_);
    return;
  }
  runtime::PluginSpec want = *config->backend;
  if (runner_ != nullptr) {
    const runtime::PluginSpec have = runner_->CurrentSpec();
    runtime::PluginParams have_params;  // less the threads parameter the server adds
    for (const auto& p : have.params) {
      if (!(threads_ > 0 && p.first == model::kThreadsParam)) have_params.push_back(p);
    }
    const bool same_plugin = (want.name.empty() || want.name == have.name) &&
                             (want.path.empty() || Canonical(want.path) == Canonical(have.path));
    if (same_plugin && want.params == have_params &&
        model::FileStamp(have.path) == runner_->Current().file_stamp) {
      spdlog::info("SIGHUP: backend '{}' in {} is unchanged; nothing reloaded", have.name,
                   config_path_);
      return;
    }
  }
  auto [status, reply] = Reload(want);
  if (status == 200) {
    spdlog::info("SIGHUP: reloaded: {}", reply.dump());
  } else {
    spdlog::error("SIGHUP: reload failed ({}): {}", status, reply.dump());
  }
}

std::string ServeReloader::Unavailable() const {
  return no_backend_.load() ? "no backend: the last plugin reload failed and the old plugin could "
                              "not be loaded again; reload a working plugin "
                              "(POST /admin/reload_plugin)"
                            : "";
}

json ServeReloader::Info() const {
  if (runner_ == nullptr) return json::object();
  const model::BackendInfo b = runner_->Current();
  return {{"backend", b.name},
          {"backend_path", b.path},
          {"backend_version", b.version},
          {"backend_abi", b.abi},
          {"backend_generation", b.generation}};
}

}  // namespace polychip::cli
