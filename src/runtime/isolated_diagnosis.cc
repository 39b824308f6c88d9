#include "runtime/isolated_diagnosis.h"

#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "polychip/plugin/pc_backend.h"
#include "polychip/plugin/pc_comm.h"

namespace polychip::runtime {
namespace {

using nlohmann::json;

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// In the child: say which step comes next (one line each), then the report as JSON.
[[noreturn]] void ChildMain(int fd, const std::string& path, PluginKind kind) {
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
  _exit(0);
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
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

LoadReport DiagnosePluginInChild(const std::string& path, PluginKind kind,
                                          double timeout_s) {
  LoadReport report;
  report.path = path;
  report.kind = kind;
  int fds[2];
  if (pipe(fds) != 0) return DiagnosePlugin(path, kind);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return DiagnosePlugin(path, kind);
  }
  if (pid == 0) {
    close(fds[0]);
    ChildMain(fds[1], path, kind);
  }
  close(fds[1]);
  std::string out;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  bool eof = false, timed_out = false;
  while (!eof) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) {
      eof = true;
    } else {
      out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);

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
  if (timed_out) {
    report.reason = fmt::format("{} did not return in {} s", stage, timeout_s);
  } else if (WIFSIGNALED(status)) {
    report.reason = fmt::format("crashed in {}: {}", stage, SignalName(WTERMSIG(status)));
  } else {
    report.reason = fmt::format("the inspecting process exited with status {} in {}",
                                WIFEXITED(status) ? WEXITSTATUS(status) : -1, stage);
  }
  return report;
}

}  // namespace polychip::runtime
