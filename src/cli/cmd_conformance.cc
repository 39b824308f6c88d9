// `polychip conformance --plugin <path.so> [--json] [--filter REGEX] [--device N] [--ranks N]
// [--check-timeout S] [--in-process]`: runs the plugin ABI contract (src/runtime/conformance)
// against one plugin file and prints a table of checks. Each check runs in a child process of its
// own, so a check that crashes or hangs the plugin is a failed row ("crashed: SIGSEGV", "did not
// finish in S s") and the others still run; --in-process runs them all in this process (for a
// debugger). A comm plugin is checked with --ranks ranks (threads of this process); started
// by mpirun (`mpirun -np N polychip conformance --plugin ...`), each process is one of the N ranks
// (so a plugin that can start once per process, such as mpi, can be checked) and rank 0 prints
// the table of every rank's verdicts.
// Exit codes: 0 every selected check passed (SKIPs allowed), 1 a check failed, 2 usage error,
// 3 a plugin kind the kit cannot check.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include "cli/command.h"
#include "runtime/conformance/conformance.h"

namespace polychip::cli {
namespace {

namespace conf = runtime::conformance;

struct ConformanceFlags {
  std::string plugin;
  std::string filter;
  std::vector<std::string> params;  // key=value
  uint32_t seed = 1234;
  bool json = false;
  bool list = false;
  int32_t ranks = 2;
  double check_timeout_s = 60;
  bool in_process = false;
};

// The global --device flag names the ordinal under test: "N" or "backend:N".
bool ParseOrdinal(const std::string& flag, int32_t* ordinal) {
  const std::string digits = flag.substr(flag.find(':') == std::string::npos ? 0 : flag.find(':') + 1);
  if (digits.empty()) return true;  // "emu:" or nothing: default 0
  char* end = nullptr;
  const long v = std::strtol(digits.c_str(), &end, 10);
  if (*end != '\0' || v < 0) return false;
  *ordinal = static_cast<int32_t>(v);
  return true;
}

int RunConformance(const ConformanceFlags& f, const GlobalOptions& globals) {
  if (f.list) {
    for (const std::string& name : conf::BackendCheckNames()) std::printf("%s\n", name.c_str());
    for (const std::string& name : conf::CommCheckNames()) std::printf("comm: %s\n", name.c_str());
    return 0;
  }
  conf::Options options;
  options.plugin_path = f.plugin;
  options.filter = f.filter;
  options.seed = f.seed;
  options.ranks = f.ranks;
  options.isolate = !f.in_process;
  options.check_timeout_s = f.check_timeout_s;
  // Under mpirun (Open MPI's environment) the ranks are its processes, whatever --ranks says.
  // The exchange directory is named after the job and mpirun (our parent), so runs never meet.
  const char* mpi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* mpi_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (mpi_rank != nullptr && mpi_size != nullptr) {
    const char* job = std::getenv("OMPI_MCA_ess_base_jobid");
    options.process_rank = std::atoi(mpi_rank);
    options.ranks = std::atoi(mpi_size);
    options.kv_dir = std::string("/tmp/polychip-conformance-") + (job != nullptr ? job : "0") +
                     "-" + std::to_string(getppid());
  }
  if (!ParseOrdinal(globals.device, &options.device)) {
    std::fprintf(stderr, "polychip conformance: --device wants an ordinal N (or backend:N), got '%s'\n",
                 globals.device.c_str());
    return 2;
  }
  for (const std::string& kv : f.params) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "polychip conformance: --param wants key=value, got '%s'\n", kv.c_str());
      return 2;
    }
    options.params.push_back({kv.substr(0, eq), kv.substr(eq + 1)});
  }
  auto report = conf::Run(options);
  if (!report.ok()) {
    std::fprintf(stderr, "polychip conformance: %s\n", report.status().ToString().c_str());
    return report.status().code() == StatusCode::kUnimplemented ? 3 : 2;
  }
  const std::string text = f.json ? conf::FormatJson(*report) + "\n" : conf::FormatTable(*report);
  // Under mpirun rank 0 speaks for all: the others exit 0, since mpirun would end the job (rank 0
  // still gathering) as soon as one rank exits non-zero.
  if (options.process_rank > 0) return 0;
  std::fputs(text.c_str(), stdout);
  return report->Passed() ? 0 : 1;
}

std::function<int()> SetupConformance(CLI::App& app, const GlobalOptions& globals) {
  auto flags = std::make_shared<ConformanceFlags>();
  app.add_option("--plugin", flags->plugin, "path of the plugin .so to check");
  app.add_flag("--json", flags->json, "print the results as JSON");
  app.add_option("--filter", flags->filter, "run only checks whose name matches this regex");
  app.add_option("--param", flags->params, "key=value passed to the plugin's initialize()");
  app.add_option("--seed", flags->seed, "seed of the random inputs");
  app.add_flag("--list", flags->list, "list the checks and exit");
  app.add_option("--ranks", flags->ranks, "comm plugins: number of ranks (threads), default 2; under mpirun, its -np")
      ->check(CLI::Range(1, 64));
  app.add_option("--check-timeout", flags->check_timeout_s,
                 "seconds a check may take in its child process before it is killed and failed")
      ->check(CLI::PositiveNumber);
  app.add_flag("--in-process", flags->in_process,
               "run every check in this process (no child processes; for a debugger)");
  return [flags, &globals]() {
    if (flags->plugin.empty() && !flags->list) {
      std::fprintf(stderr, "polychip conformance: --plugin <path.so> is required\n");
      return 2;
    }
    return RunConformance(*flags, globals);
  };
}

const bool kRegistered = RegisterCommand(
    {"conformance", "check a plugin against the ABI contract (pass/fail table)", SetupConformance});

}  // namespace
}  // namespace polychip::cli
