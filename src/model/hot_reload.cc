#include "model/hot_reload.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "model/runner_setup.h"
#include "runtime/conformance/conformance.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"

namespace polychip::model {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// Prometheus label values: backslash, quote and newline escaped.
std::string LabelValue(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  return out;
}

// The file a plugin spec names: its path, or the first libpolychip_backend_<name>.so on the
// search path.
StatusOr<std::string> ResolvePath(const runtime::PluginSpec& spec,
                                  const runtime::RuntimeConfig& config) {
  if (!spec.path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(spec.path, ec)) {
      return NotFound(spec.path + ": no such file");
    }
    return spec.path;
  }
  if (spec.name.empty()) return InvalidArgument("the plugin has neither a name nor a path");
  const auto search = runtime::PluginSearchPath(config.extra_search_path);
  for (const runtime::PluginFile& f : runtime::DiscoverPlugins(search)) {
    if (f.kind == runtime::PluginKind::kBackend && f.name == spec.name && !f.shadowed) {
      return f.path;
    }
  }
  std::string dirs;
  for (const auto& d : search) dirs += (dirs.empty() ? "" : ":") + d;
  return NotFound("backend '" + spec.name + "' not found on the search path (" + dirs + ")");
}

// The first failed row of a conformance report, "check: detail".
std::string FirstFailure(const runtime::conformance::Report& report) {
  for (const auto& c : report.checks) {
    if (c.outcome == runtime::conformance::Outcome::kFail) return c.name + ": " + c.detail;
  }
  return "no check of the model's ops passed";
}

}  // namespace

std::string FileStamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_ino) + ":" +
         std::to_string(int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
}

std::string ConformanceFilter(const std::vector<OpUse>& uses) {
  std::vector<std::string> alternatives;
  for (const OpUse& u : uses) {
    std::string alt = runtime::OpName(u.op);
    if (!u.dtypes.empty()) alt += "\\." + Lower(DTypeName(u.dtypes.front()));
    if (std::find(alternatives.begin(), alternatives.end(), alt) == alternatives.end()) {
      alternatives.push_back(alt);
    }
  }
  std::string filter = "^op\\.(";
  for (size_t i = 0; i < alternatives.size(); ++i) filter += (i ? "|" : "") + alternatives[i];
  return filter + ")(\\.|$)";
}

StatusOr<std::unique_ptr<ReloadableRunner>> ReloadableRunner::Create(
    const GgufFile& file, const ModelConfig& config, runtime::RuntimeConfig runtime_config,
    std::shared_ptr<runtime::Backend> backend, const RunnerOptions& options) {
  runtime::PluginSpec spec;
  if (runtime_config.backend) spec = *runtime_config.backend;
  spec.name = backend->name();
  spec.path = backend->path();
  std::unique_ptr<ReloadableRunner> r(
      new ReloadableRunner(file, config, std::move(runtime_config), options));
  PC_ASSIGN_OR_RETURN(auto device, OpenFirstDevice(backend, r->runtime_config_));
  PC_ASSIGN_OR_RETURN(r->runner_, TransformerRunner::Create(file, config, device, options));
  r->backend_ = std::move(backend);
  r->file_stamp_ = FileStamp(spec.path);
  r->spec_ = std::move(spec);
  r->context_length_ = r->runner_->context_length();
  r->block_size_ = r->runner_->block_size();
  r->num_kv_blocks_ = r->runner_->num_kv_blocks();
  r->num_window_kv_blocks_ = r->runner_->num_window_kv_blocks();
  r->kv_blocks_per_pool_ = r->runner_->kv_blocks_per_pool();
  r->kv_window_ = r->runner_->kv_window();
  return r;
}

ReloadableRunner::~ReloadableRunner() = default;

Status ReloadableRunner::Forward(std::span<const engine::SequenceStep> batch,
                                 std::vector<float>* logits) {
  // runner_ changes only on the engine thread (Reload), which is the caller here: no lock.
  if (!runner_) {
    return Unavailable("no device: the last plugin reload failed and the old plugin could not be "
                       "loaded again; reload a working plugin (POST /admin/reload_plugin)");
  }
  return runner_->Forward(batch, logits);
}

void ReloadableRunner::RenderMetrics(std::string* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (runner_) runner_->RenderMetrics(out);
  *out += "# HELP polychip_backend_info The device plugin serving (generation: its load number).\n"
          "# TYPE polychip_backend_info gauge\n";
  if (backend_) {
    *out += "polychip_backend_info{backend=\"" + LabelValue(backend_->name()) + "\",version=\"" +
            LabelValue(backend_->version()) + "\",generation=\"" +
            std::to_string(backend_->generation()) + "\"} 1\n";
  }
  *out += "# HELP polychip_plugin_reloads_total Plugin hot reloads, by result.\n"
          "# TYPE polychip_plugin_reloads_total counter\n"
          "polychip_plugin_reloads_total{result=\"ok\"} " + std::to_string(reloads_ok_) + "\n"
          "polychip_plugin_reloads_total{result=\"failed\"} " +
          std::to_string(reloads_failed_) + "\n";
}

BackendInfo ReloadableRunner::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  BackendInfo info;
  if (!backend_) return info;
  info.name = backend_->name();
  info.path = backend_->path();
  info.version = backend_->version();
  info.abi = std::to_string(backend_->abi_major()) + "." + std::to_string(backend_->abi_minor());
  info.generation = backend_->generation();
  info.file_stamp = file_stamp_;
  return info;
}

runtime::PluginSpec ReloadableRunner::CurrentSpec() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spec_;
}

std::shared_ptr<runtime::Device> ReloadableRunner::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!runner_) return nullptr;
  return runner_->device().shared_from_this();
}

bool ReloadableRunner::ReleaseCurrent() {
  std::unique_ptr<TransformerRunner> runner;
  std::shared_ptr<runtime::Backend> backend;
  {
    std::lock_guard<std::mutex> lock(mu_);
    runner = std::move(runner_);
    backend = std::move(backend_);
  }
  if (!backend) return true;
  std::weak_ptr<runtime::Backend> weak = backend;
  runner.reset();  // weights, KV cache, workspace, stream, and with them the Device
  runtime::PluginRegistry::Global().Release(backend);
  backend.reset();
  if (!weak.expired()) {
    spdlog::warn("hot reload: the old backend is still referenced ({} owners): not unloaded",
                 weak.use_count());
    return false;
  }
  return true;
}

Status ReloadableRunner::Build(const std::string& path, const runtime::PluginSpec& spec,
                               std::string* stage) {
  *stage = "load";
  runtime::LoadReport report;
  PC_ASSIGN_OR_RETURN(auto backend, runtime::LoadBackendFromPath(path, spec.params, &report));
  // What this build loaded goes again if a later step fails.
  struct Undo {
    std::shared_ptr<runtime::Backend>* backend;
    ~Undo() {
      if (*backend) runtime::PluginRegistry::Global().Release(*backend);
    }
  } undo{&backend};
  if (!spec.name.empty() && backend->name() != spec.name) {
    return FailedPrecondition(path + " is backend '" + backend->name() + "', but '" + spec.name +
                              "' was asked for");
  }
  *stage = "device";
  PC_ASSIGN_OR_RETURN(auto device, OpenFirstDevice(backend, runtime_config_));
  *stage = "runner";
  PC_ASSIGN_OR_RETURN(auto runner, TransformerRunner::Create(file_, config_, device, options_));
  if (runner->num_kv_blocks() != num_kv_blocks_ || runner->block_size() != block_size_ ||
      runner->context_length() != context_length_ ||
      runner->num_window_kv_blocks() != num_window_kv_blocks_ ||
      runner->kv_blocks_per_pool() != kv_blocks_per_pool_) {
    // Pools (a device's max single allocation) count too: the block manager keeps a
    // sequence's blocks within the pools it was made with.
    auto pools = [](int64_t per_pool) {
      return per_pool > 0 ? ", in pools of " + std::to_string(per_pool) : std::string();
    };
    return FailedPrecondition(
        "the new runner's KV cache is " + std::to_string(runner->num_kv_blocks()) +
        " blocks of " + std::to_string(runner->block_size()) + " tokens" +
        pools(runner->kv_blocks_per_pool()) + " (context " +
        std::to_string(runner->context_length()) + "), the engine's " +
        std::to_string(num_kv_blocks_) + " of " + std::to_string(block_size_) +
        pools(kv_blocks_per_pool_) + " (context " + std::to_string(context_length_) + ")");
  }
  runtime::PluginSpec loaded = spec;
  loaded.name = backend->name();
  loaded.path = path;
  const std::string stamp = FileStamp(path);
  std::lock_guard<std::mutex> lock(mu_);
  file_stamp_ = stamp;
  runner_ = std::move(runner);
  backend_ = std::move(backend);  // Undo sees null: nothing to release
  spec_ = std::move(loaded);
  return Status::Ok();
}

ReloadOutcome ReloadableRunner::Reload(const runtime::PluginSpec& spec) {
  const auto start = std::chrono::steady_clock::now();
  ReloadOutcome out;
  out.previous = Current();
  runtime::PluginSpec old_spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old_spec = spec_;
  }
  auto finish = [&](bool ok, std::string stage, std::string reason) {
    out.ok = ok;
    out.stage = std::move(stage);
    out.reason = std::move(reason);
    out.current = Current();
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(mu_);
    ++(ok ? reloads_ok_ : reloads_failed_);
    return out;
  };

  // A path that does not resolve touches nothing: the old plugin was never stopped.
  auto path = ResolvePath(spec, runtime_config_);
  if (!path.ok()) return finish(false, "resolve", path.status().message());

  // The handshake (dlopen, entry symbols, ABI version, table, probe; no initialize) also comes
  // before anything stops: a file that is no plugin at all leaves the old one untouched.
  const runtime::LoadReport handshake =
      runtime::DiagnosePlugin(*path, runtime::PluginKind::kBackend);
  if (!handshake.usable) return finish(false, "handshake", handshake.ToString());
  if (!spec.name.empty() && handshake.name != spec.name) {
    return finish(false, "handshake",
                  *path + " is backend '" + handshake.name + "', but '" + spec.name +
                      "' was asked for");
  }

  const std::string old_canonical = Canonical(old_spec.path);
  out.old_unloaded = ReleaseCurrent();
  std::string stage;
  Status status;
  std::string in_use;  // a library that serves already (the old one, still referenced, or the
                       // op fallback): the kit and initialize would run on it again
  if (!out.old_unloaded && Canonical(*path) == old_canonical) in_use = old_spec.name;
  for (const auto& b : runtime::PluginRegistry::Global().Backends()) {
    if (Canonical(b->path()) == Canonical(*path)) in_use = b->name();
  }
  if (!in_use.empty()) {
    stage = "load";
    status = FailedPrecondition(*path + " is already loaded in this process (backend '" +
                                in_use + "'); load a copy at another path");
  } else {
    // The smoke: handshake, probe, initialize, device open and the checks of the model's ops,
    // on the raw library (the kit shuts it down and unloads it when done).
    runtime::conformance::Options co;
    co.plugin_path = *path;
    co.device = runtime_config_.devices.empty() ? 0 : runtime_config_.devices.front();
    co.params = spec.params;
    co.filter = ConformanceFilter(RequiredOps(file_, config_, options_.kv_dtypes));
    stage = "conformance";
    auto report = runtime::conformance::Run(co);
    if (!report.ok()) {
      status = report.status();
    } else {
      out.conformance_checks = static_cast<int32_t>(report->checks.size());
      if (!report->Passed()) status = FailedPrecondition(FirstFailure(*report));
    }
    if (status.ok()) status = Build(*path, spec, &stage);
  }
  if (status.ok()) {
    spdlog::info("hot reload: backend '{}' generation {} -> '{}' generation {} from {}",
                 out.previous.name, out.previous.generation, Current().name,
                 Current().generation, *path);
    return finish(true, "", "");
  }
  spdlog::error("hot reload to {} failed at {}: {}; restoring {}", *path, stage,
                status.message(), old_spec.path);
  std::string restore_stage;
  const Status restored = Build(old_spec.path, old_spec, &restore_stage);
  if (!restored.ok()) {
    spdlog::error("hot reload: restoring {} failed at {}: {}", old_spec.path, restore_stage,
                  restored.message());
    return finish(false, "restore",
                  stage + ": " + status.message() + "; restoring " + old_spec.path +
                      " failed too (" + restore_stage + ": " + restored.message() + ")");
  }
  return finish(false, stage, status.message());
}

}  // namespace polychip::model
