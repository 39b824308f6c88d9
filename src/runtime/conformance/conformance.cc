// The conformance runner: loads the plugin raw (no C++ wrappers), walks the stages (table,
// initialized, device open), runs each selected check and collects the table. Isolated
// (Options::isolate), the same runner runs in child processes: one for the setup steps, then one
// per check that opens the plugin and the device again and runs that check alone, its rows sent
// back over a pipe, so that a check that crashes or hangs is one failed row.
#include "runtime/conformance/conformance.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <regex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/abi_internal.h"
#include "runtime/child_process.h"
#include "runtime/conformance/harness.h"

namespace polychip::runtime::conformance {

const char* OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPass: return "PASS";
    case Outcome::kFail: return "FAIL";
    case Outcome::kSkip: return "SKIP";
  }
  return "?";
}

bool Report::Passed() const {
  bool any_ran = false;
  for (const CheckResult& c : checks) {
    if (c.outcome == Outcome::kFail) return false;
    any_ran |= c.outcome == Outcome::kPass;
  }
  return any_ran;
}

const CheckResult* Report::Find(const std::string& name) const {
  for (const CheckResult& c : checks) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

namespace {

std::vector<Check> AllBackendChecks() {
  std::vector<Check> checks;
  AddApiChecks(checks);
  AddMemoryChecks(checks);
  AddOpChecks(checks);
  AddCounterChecks(checks);
  return checks;
}

// Runs one check, turning an exception (the kit's own, e.g. bad_alloc) into a failure.
CheckResult RunOne(const Check& check, Harness& h) {
  CheckResult r;
  r.name = check.name;
  const auto start = std::chrono::steady_clock::now();
  Verdict v;
  try {
    v = check.run(h);
  } catch (const std::exception& e) {
    v = Fail(std::string("exception: ") + e.what());
  }
  Status freed = h.FreeAll();
  if (v.outcome == Outcome::kPass && !freed.ok()) v = Fail(freed.ToString());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.outcome = v.outcome;
  r.detail = std::move(v.detail);
  return r;
}

}  // namespace

std::vector<std::string> BackendCheckNames() {
  std::vector<std::string> names = {"load", "lifetime.initialize", "device.open"};
  for (const Check& c : AllBackendChecks()) names.push_back(c.name);
  return names;
}

namespace {

// What an isolated run asks of the in-process runner inside its child.
struct RunControl {
  int progress_fd = -1;          // "start <name>", "row <json>", "plugin <json>" lines go here
  bool stop_after_selected = false;  // stop after the stage of the last selected check
  bool comm_kind_only = false;       // a comm plugin: say its kind, run none of its checks
};

nlohmann::json RowJson(const CheckResult& c) {
  return {{"name", c.name}, {"result", OutcomeName(c.outcome)}, {"detail", c.detail},
          {"seconds", c.seconds}};
}

Report RunInProcess(const Options& options, const std::function<bool(const std::string&)>& selected,
                    const RunControl& control) {
  Report report;
  report.plugin_path = options.plugin_path;
  auto say = [&](const std::string& line) {
    if (control.progress_fd >= 0) WriteAll(control.progress_fd, line + "\n");
  };
  auto add_row = [&](CheckResult row) {
    say("row " + RowJson(row).dump());
    report.checks.push_back(std::move(row));
  };
  auto announce = [&] {
    say("plugin " + nlohmann::json{{"kind", report.kind},
                                   {"name", report.plugin_name},
                                   {"version", report.plugin_version}}
                        .dump());
  };
  // The setup steps are rows too, always shown: everything after them depends on them.
  auto step = [&](const char* name, Verdict v) {
    add_row({name, v.outcome, std::move(v.detail), 0});
    return v.outcome == Outcome::kPass;
  };
  say("start load");

  // The kind, from the exported symbols.
  {
    LoadReport lr;
    auto lib = PluginLibrary::Open(options.plugin_path, &lr);
    if (!lib.ok()) {
      report.kind = "unknown";
      step("load", Fail(lib.status().message()));
      return report;
    }
    const bool backend = (*lib)->Symbol(PC_BACKEND_GET_API_SYMBOL) != nullptr;
    const bool comm = (*lib)->Symbol(PC_COMM_GET_API_SYMBOL) != nullptr;
    if (!backend && comm) {
      report.kind = "comm";
      announce();
      if (control.comm_kind_only) return report;
      RunCommChecks(options, report);
      for (const CheckResult& c : report.checks) say("row " + RowJson(c).dump());
      return report;
    }
    if (!backend) {
      report.kind = "unknown";
      step("load", Fail("exports neither " PC_BACKEND_GET_API_SYMBOL " nor " PC_COMM_GET_API_SYMBOL));
      return report;
    }
    report.kind = "backend";
    announce();
  }

  RawBackend raw;
  LoadReport lr;
  const Status loaded = OpenRawBackend(options.plugin_path, &raw, &lr);
  if (raw.table == nullptr) {
    step("load", Fail(loaded.message()));
    return report;
  }
  if (loaded.ok()) {
    report.plugin_name = raw.table->name;
    report.plugin_version = raw.table->version;
  }
  announce();
  step("load", loaded.ok() ? Pass("ABI " + std::to_string(raw.table->abi_major) + "." +
                                  std::to_string(raw.table->abi_minor))
                           : Fail(loaded.message()));

  const std::vector<Check> checks = AllBackendChecks();
  // With stop_after_selected, the stages after the last selected check's are not entered.
  Stage last_needed = Stage::kDevice;
  if (control.stop_after_selected) {
    last_needed = Stage::kTable;
    for (const Check& c : checks) {
      if (selected(c.name)) last_needed = std::max(last_needed, c.stage);
    }
  }
  Harness h(raw.table, raw.get_api, options.device, options.seed);
  h.probe = raw.probe;
  auto run_stage = [&](Stage stage, const std::string& unreachable) {
    for (const Check& c : checks) {
      if (c.stage != stage || !selected(c.name)) continue;
      if (!unreachable.empty()) {
        add_row({c.name, Outcome::kSkip, unreachable, 0});
      } else {
        say("start " + c.name);
        add_row(RunOne(c, h));
      }
    }
  };

  // Stage 1: the table alone. An invalid table is still inspected, but never called further.
  run_stage(Stage::kTable, "");
  if (!loaded.ok()) {
    run_stage(Stage::kInitialized, "table rejected by the loader");
    run_stage(Stage::kDevice, "table rejected by the loader");
    return report;
  }
  if (last_needed == Stage::kTable) return report;

  // Stage 2: initialize, with an unknown key that the plugin must ignore (with a warning).
  std::vector<pc_param_t> params;
  for (const auto& [k, v] : options.params) params.push_back({k.c_str(), v.c_str()});
  params.push_back({"conformance_unknown_key", "1"});
  say("start lifetime.initialize");
  const Status init = h.Take(raw.table->initialize(params.data(), params.size()), "initialize");
  if (!step("lifetime.initialize", init.ok() ? Pass("unknown parameter ignored")
                                             : Fail(init.ToString()))) {
    run_stage(Stage::kInitialized, "initialize failed");
    run_stage(Stage::kDevice, "initialize failed");
    return report;
  }
  run_stage(Stage::kInitialized, "");
  if (last_needed == Stage::kInitialized) {
    raw.table->shutdown();
    return report;
  }

  // Stage 3: the device under test, its props and a default stream.
  say("start device.open");
  h.props.struct_size = sizeof(h.props);
  Status open = h.Take(raw.table->device_get_props(options.device, &h.props), "device_get_props");
  if (open.ok()) open = h.Take(raw.table->device_open(options.device, &h.device), "device_open");
  if (open.ok() && h.device == nullptr) open = Internal("device_open returned no device");
  if (open.ok() && (h.props.alignment == 0 || h.props.max_alloc_size == 0)) {
    open = FailedPrecondition("props have zero alignment or max_alloc_size");
  }
  if (open.ok()) {
    open = h.Take(raw.table->stream_create(h.device, h.props.priority_low, &h.stream),
                  "stream_create");
  }
  const std::string dev = "device " + std::to_string(options.device);
  if (step("device.open", open.ok() ? Pass(dev + ": " + h.props.name) : Fail(open.ToString()))) {
    run_stage(Stage::kDevice, "");
  } else {
    run_stage(Stage::kDevice, dev + " did not open");
  }

  (void)h.FreeAll();
  if (h.stream) raw.table->stream_destroy(h.stream);
  if (h.device) raw.table->device_close(h.device);
  h.stream = nullptr;
  h.device = nullptr;
  raw.table->shutdown();
  return report;
}

// ---- isolated: each check in a child process -----------------------------------------------

// What one child of an isolated run said before it ended, and how it ended.
struct ChildRun {
  ChildOutcome outcome;
  std::vector<CheckResult> rows;
  std::string running;  // the step or check that had started and not given its row
  std::string kind = "unknown", name, version;
  double seconds = 0;  // how long the child ran
};

std::optional<Outcome> ParseOutcome(const std::string& s) {
  for (Outcome o : {Outcome::kPass, Outcome::kFail, Outcome::kSkip}) {
    if (s == OutcomeName(o)) return o;
  }
  return std::nullopt;
}

ChildRun RunChild(const Options& options, const std::function<bool(const std::string&)>& selected,
                  RunControl control, double timeout_s) {
  ChildRun run;
  const auto start = std::chrono::steady_clock::now();
  run.outcome = RunInChild(
      [&](int fd) {
        control.progress_fd = fd;
        (void)RunInProcess(options, selected, control);
      },
      timeout_s);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string& out = run.outcome.output;
  for (size_t at = 0; at < out.size();) {
    size_t nl = out.find('\n', at);
    if (nl == std::string::npos) break;  // a line cut short by the child's end
    const std::string line = out.substr(at, nl - at);
    at = nl + 1;
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string tag = line.substr(0, space), rest = line.substr(space + 1);
    if (tag == "start") {
      run.running = rest;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(rest, nullptr, false);
    if (!j.is_object()) continue;
    if (tag == "plugin") {
      run.kind = j.value("kind", "unknown");
      run.name = j.value("name", "");
      run.version = j.value("version", "");
    } else if (tag == "row") {
      const std::optional<Outcome> o = ParseOutcome(j.value("result", ""));
      if (!o) continue;
      run.rows.push_back({j.value("name", ""), *o, j.value("detail", ""), j.value("seconds", 0.0)});
      if (run.rows.back().name == run.running) run.running.clear();
    }
  }
  return run;
}

// How a child ended that did not end cleanly: "crashed: SIGSEGV", "did not finish in 60 s".
std::string HowItEnded(const ChildRun& run, double timeout_s) {
  if (!run.outcome.started) return "could not start a child process";
  if (run.outcome.timed_out) return fmt::format("did not finish in {} s", timeout_s);
  if (run.outcome.signal != 0) return "crashed: " + SignalName(run.outcome.signal);
  if (run.outcome.exit_status != 0) {
    return fmt::format("exited with status {}", run.outcome.exit_status);
  }
  return "ended without a result";
}

const CheckResult* FindRow(const std::vector<CheckResult>& rows, const std::string& name) {
  for (const CheckResult& r : rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

Report RunIsolated(const Options& options, const std::function<bool(const std::string&)>& selected) {
  const double timeout = options.check_timeout_s;
  Report report;
  report.plugin_path = options.plugin_path;

  // The setup steps (load, initialize, device open) alone first: they decide what can run.
  RunControl setup_only;
  setup_only.comm_kind_only = true;
  ChildRun setup =
      RunChild(options, [](const std::string&) { return false; }, setup_only, timeout);
  report.kind = setup.kind;
  report.plugin_name = setup.name;
  report.plugin_version = setup.version;
  if (setup.kind == "comm") {  // its checks need each other's ranks: one child for all
    const double comm_timeout = timeout * static_cast<double>(CommCheckNames().size());
    ChildRun comm = RunChild(options, selected, RunControl{}, comm_timeout);
    report.checks = comm.rows;
    if (!comm.outcome.Clean() || comm.rows.empty()) {
      report.checks.push_back({comm.running.empty() ? "comm" : comm.running, Outcome::kFail,
                               HowItEnded(comm, comm_timeout) + " (comm checks run in one child)",
                               0});
    }
    return report;
  }
  // A step that crashed or hung is its own failed row; the stages after it cannot be reached.
  std::string unreachable_from;  // "", or the step that did not finish
  if (!setup.outcome.Clean() && !setup.running.empty()) {
    setup.rows.push_back(
        {setup.running, Outcome::kFail, HowItEnded(setup, timeout), setup.seconds});
    unreachable_from = setup.running;
  } else if (!setup.outcome.Clean() || setup.rows.empty()) {
    setup.rows.push_back({"load", Outcome::kFail, HowItEnded(setup, timeout), setup.seconds});
    unreachable_from = "load";
  }
  if (report.kind != "backend" && unreachable_from.empty()) {
    report.checks = setup.rows;
    return report;
  }
  auto reachable = [&](Stage stage) {
    if (unreachable_from.empty()) return true;
    if (unreachable_from == "load") return false;
    if (unreachable_from == "lifetime.initialize") return stage == Stage::kTable;
    return stage != Stage::kDevice;
  };
  const std::string unreachable_reason =
      unreachable_from + (setup.outcome.timed_out ? " did not finish" : " crashed");

  // The rows in the order of an in-process run: each step, then the checks of its stage.
  const std::vector<Check> checks = AllBackendChecks();
  auto add_step = [&](const char* name) {
    if (const CheckResult* r = FindRow(setup.rows, name)) report.checks.push_back(*r);
  };
  auto run_stage = [&](Stage stage) {
    for (const Check& c : checks) {
      if (c.stage != stage || !selected(c.name)) continue;
      if (!reachable(stage)) {
        report.checks.push_back({c.name, Outcome::kSkip, unreachable_reason, 0});
        continue;
      }
      const std::string name = c.name;
      RunControl just_this;
      just_this.stop_after_selected = true;
      ChildRun one =
          RunChild(options, [&](const std::string& n) { return n == name; }, just_this, timeout);
      if (const CheckResult* r = FindRow(one.rows, name)) {
        report.checks.push_back(*r);
      } else if (!one.outcome.Clean()) {
        // Ended in its own check, or (a plugin that does not behave the same twice) in a step.
        const std::string where = one.running.empty() || one.running == name
                                      ? ""
                                      : " (in " + one.running + ")";
        report.checks.push_back(
            {name, Outcome::kFail, HowItEnded(one, timeout) + where, one.seconds});
      }
    }
  };
  add_step("load");
  run_stage(Stage::kTable);
  add_step("lifetime.initialize");
  run_stage(Stage::kInitialized);
  add_step("device.open");
  run_stage(Stage::kDevice);
  return report;
}

}  // namespace

StatusOr<Report> Run(const Options& options) {
  std::regex filter;
  try {
    filter = std::regex(options.filter.empty() ? ".*" : options.filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidArgument("bad --filter regex '" + options.filter + "': " + e.what());
  }
  auto selected = [&](const std::string& name) { return std::regex_search(name, filter); };
  if (options.isolate && options.process_rank < 0) return RunIsolated(options, selected);
  return RunInProcess(options, selected, RunControl{});
}

std::string FormatTable(const Report& report) {
  size_t width = 5;
  for (const CheckResult& c : report.checks) width = std::max(width, c.name.size());
  std::string out = "polychip conformance: " + report.plugin_path;
  if (!report.plugin_name.empty()) {
    out += " (" + report.kind + " '" + report.plugin_name + "' " + report.plugin_version + ")";
  }
  out += "\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-*s  %-6s %9s  %s\n", int(width), "CHECK", "RESULT",
                "TIME", "DETAIL");
  out += line;
  int n_pass = 0, n_fail = 0, n_skip = 0;
  std::string failed;
  for (const CheckResult& c : report.checks) {
    std::snprintf(line, sizeof(line), "%-*s  %-6s %7.1fms  %s\n", int(width), c.name.c_str(),
                  OutcomeName(c.outcome), c.seconds * 1e3, c.detail.c_str());
    out += line;
    if (c.outcome == Outcome::kPass) ++n_pass;
    if (c.outcome == Outcome::kSkip) ++n_skip;
    if (c.outcome == Outcome::kFail) {
      ++n_fail;
      failed += (failed.empty() ? "" : ", ") + c.name;
    }
  }
  out += "\n" + std::to_string(n_pass) + " passed, " + std::to_string(n_fail) + " failed, " +
         std::to_string(n_skip) + " skipped: " + (report.Passed() ? "CONFORMS" : "DOES NOT CONFORM") +
         "\n";
  if (!failed.empty()) out += "failed: " + failed + "\n";
  return out;
}

std::string FormatJson(const Report& report) {
  nlohmann::json j;
  j["plugin_path"] = report.plugin_path;
  j["kind"] = report.kind;
  j["plugin_name"] = report.plugin_name;
  j["plugin_version"] = report.plugin_version;
  j["passed"] = report.Passed();
  nlohmann::json checks = nlohmann::json::array();
  for (const CheckResult& c : report.checks) {
    checks.push_back({{"name", c.name},
                      {"result", OutcomeName(c.outcome)},
                      {"detail", c.detail},
                      {"seconds", c.seconds}});
  }
  j["checks"] = std::move(checks);
  return j.dump(2);
}

}  // namespace polychip::runtime::conformance
