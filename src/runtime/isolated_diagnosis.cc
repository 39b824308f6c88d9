#include "runtime/isolated_diagnosis.h"

#include <dlfcn.h>

#include <cstdlib>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "polychip/plugin/pc_backend.h"
#include "polychip/plugin/pc_comm.h"
#include "runtime/child_process.h"

namespace polychip::runtime {
namespace {

using nlohmann::json;

// In the child: say which step comes next (one line each), then the report as JSON.
void ChildMain(int fd, const std::string& path, PluginKind kind) {
  const bool backend = kind == PluginKind::kBackend;
  WriteAll(fd, "stage dlopen\n");
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib != nullptr) {
    // Probe first on its own, so that a crash there is attributed to the probe.
    void* probe = dlsym(lib, backend ? PC_BACKEND_PROBE_SYMBOL : PC_COMM_PROBE_SYMBOL);
    if (probe != nullptr) {
      WriteAll(fd, "stage probe\n");
      pc_probe_result_t result{};
      result.struct_size = sizeof(result);
      reinterpret_cast<pc_backend_probe_fn>(probe)(&result);
    }
  }
  WriteAll(fd, "stage get_api\n");
  const LoadReport r = DiagnosePlugin(path, kind);
  const json j = {{"name", r.name},       {"usable", r.usable},
                  {"stage", r.stage},     {"reason", r.reason},
                  {"probe_score", r.probe_score}, {"probe_reason", r.probe_reason},
                  {"version", r.version}, {"abi_major", r.abi_major},
                  {"abi_minor", r.abi_minor}, {"missing", r.missing_libraries}};
  WriteAll(fd, "report " + j.dump() + "\n");
}

// The report of the child that inspected `path`, from what it wrote and how it ended.
LoadReport ReportFromChild(const std::string& path, PluginKind kind, const ChildOutcome& child,
                           double timeout_s) {
  if (!child.started) return DiagnosePlugin(path, kind);
  LoadReport report;
  report.path = path;
  report.kind = kind;
  const std::string& out = child.output;
  std::string stage = "dlopen";
  json parsed;
  for (size_t at = 0; at < out.size();) {
    size_t nl = out.find('\n', at);
    if (nl == std::string::npos) nl = out.size();
    const std::string line = out.substr(at, nl - at);
    if (line.rfind("stage ", 0) == 0) stage = line.substr(6);
    if (line.rfind("report ", 0) == 0) parsed = json::parse(line.substr(7), nullptr, false);
    at = nl + 1;
  }
  if (parsed.is_object()) {
    report.name = parsed.value("name", "");
    report.usable = parsed.value("usable", false);
    report.stage = parsed.value("stage", "");
    report.reason = parsed.value("reason", "");
    report.probe_score = parsed.value("probe_score", -1);
    report.probe_reason = parsed.value("probe_reason", "");
    report.version = parsed.value("version", "");
    report.abi_major = parsed.value("abi_major", 0u);
    report.abi_minor = parsed.value("abi_minor", 0u);
    report.missing_libraries = parsed.value("missing", std::vector<std::string>{});
    return report;
  }
  report.usable = false;
  report.stage = stage;
  if (child.timed_out) {
    report.reason = fmt::format("{} did not return in {} s", stage, timeout_s);
  } else if (child.signal != 0) {
    report.reason = fmt::format("crashed in {}: {}", stage, SignalName(child.signal));
  } else {
    report.reason =
        fmt::format("the inspecting process exited with status {} in {}", child.exit_status, stage);
  }
  return report;
}

}  // namespace

double ProbeTimeoutSeconds() {
  const char* env = std::getenv("POLYCHIP_PROBE_TIMEOUT_S");
  if (env != nullptr && *env) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    if (*end == '\0' && v > 0) return v;
  }
  return 5;
}

LoadReport DiagnosePluginInChild(const std::string& path, PluginKind kind, double timeout_s) {
  const ChildOutcome child = RunInChild([&](int fd) { ChildMain(fd, path, kind); }, timeout_s);
  return ReportFromChild(path, kind, child, timeout_s);
}

std::vector<LoadReport> DiagnosePluginsInChildren(const std::vector<PluginFile>& files,
                                                  double timeout_s) {
  std::vector<std::unique_ptr<ChildProcess>> children;
  for (const PluginFile& f : files) {
    children.push_back(std::make_unique<ChildProcess>(
        [&](int fd) { ChildMain(fd, f.path, f.kind); }));
  }
  const auto deadline = DeadlineIn(timeout_s);
  std::vector<LoadReport> reports;
  for (size_t i = 0; i < files.size(); ++i) {
    reports.push_back(
        ReportFromChild(files[i].path, files[i].kind, children[i]->Wait(deadline), timeout_s));
  }
  return reports;
}

}  // namespace polychip::runtime
