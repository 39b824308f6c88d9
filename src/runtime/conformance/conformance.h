// The plugin conformance kit: runs the ABI contract against one plugin file and reports each
// named check as PASS, FAIL or SKIP. Driven by `polychip conformance --plugin <path.so>` and by
// the tests in tests/conformance.
//
// The kit talks to the raw C ABI (it lives in src/runtime for that reason) because its job is to
// check what the C++ wrappers take for granted. This header has no ABI types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config.h"
#include "util/status.h"

namespace polychip::runtime::conformance {

enum class Outcome { kPass, kFail, kSkip };
const char* OutcomeName(Outcome outcome);  // "PASS", "FAIL", "SKIP"

struct CheckResult {
  std::string name;  // dotted, e.g. "memory.round_trip", "op.matmul.q4_k.prefill"
  Outcome outcome = Outcome::kPass;
  std::string detail;  // why it failed or was skipped; a short measurement when it passed
  double seconds = 0;
};

struct Options {
  std::string plugin_path;
  int32_t device = 0;      // physical ordinal under test
  std::string filter;      // ECMAScript regex on check names; empty: every check
  PluginParams params;     // passed to the plugin's initialize()
  uint32_t seed = 1234;    // random inputs are reproducible
  int32_t ranks = 2;       // comm plugins: ranks (threads of this process) in the world
  // Comm plugins as processes (started by a launcher such as mpirun): this process is rank
  // process_rank of `ranks`; ids and verdicts are exchanged through files in kv_dir (one host),
  // and rank 0's report holds every rank's failures. -1: ranks are threads.
  int32_t process_rank = -1;
  std::string kv_dir;
  // Each check in a child process of its own (`polychip conformance` does this unless
  // --in-process): a check that crashes or hangs is its own FAIL row ("crashed: SIGSEGV", "did
  // not finish in N s") and every other check still runs. A comm plugin's checks run together in
  // one child; ranks as processes (process_rank >= 0) always run in this process.
  bool isolate = false;
  double check_timeout_s = 60;  // per check (and for the load/initialize/open steps together)
};

struct Report {
  std::string plugin_path;
  std::string kind;  // "backend" or "comm"
  std::string plugin_name;
  std::string plugin_version;
  std::vector<CheckResult> checks;
  // True when no check failed and at least one check ran (SKIPs are allowed: an op the plugin
  // does not claim is skipped, never failed).
  bool Passed() const;
  const CheckResult* Find(const std::string& name) const;
};

// Runs every check selected by the filter. A plugin that cannot be loaded at all still gives a
// report (its "load" check fails). Errors are returned only for a misuse of the kit itself (a
// bad filter). A comm plugin is checked with options.ranks ranks.
StatusOr<Report> Run(const Options& options);

// The names of every check the kit knows for a backend plugin (op checks included), in order.
std::vector<std::string> BackendCheckNames();
// The same for a comm plugin.
std::vector<std::string> CommCheckNames();

std::string FormatTable(const Report& report);
std::string FormatJson(const Report& report);

}  // namespace polychip::runtime::conformance
