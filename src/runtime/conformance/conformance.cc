// The conformance runner: loads the plugin raw (no C++ wrappers), walks the stages (table,
// initialized, device open), runs each selected check and collects the table.
#include "runtime/conformance/conformance.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <regex>

#include "runtime/abi_internal.h"
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

StatusOr<Report> Run(const Options& options) {
  std::regex filter;
  try {
    filter = std::regex(options.filter.empty() ? ".*" : options.filter, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidArgument("bad --filter regex '" + options.filter + "': " + e.what());
  }
  auto selected = [&](const std::string& name) { return std::regex_search(name, filter); };

  Report report;
  report.plugin_path = options.plugin_path;
  // The setup steps are rows too, always shown: everything after them depends on them.
  auto step = [&](const char* name, Verdict v) {
    report.checks.push_back({name, v.outcome, std::move(v.detail), 0});
    return v.outcome == Outcome::kPass;
  };

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
      RunCommChecks(options, report);
      return report;
    }
    if (!backend) {
      report.kind = "unknown";
      step("load", Fail("exports neither " PC_BACKEND_GET_API_SYMBOL " nor " PC_COMM_GET_API_SYMBOL));
      return report;
    }
    report.kind = "backend";
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
  step("load", loaded.ok() ? Pass("ABI " + std::to_string(raw.table->abi_major) + "." +
                                  std::to_string(raw.table->abi_minor))
                           : Fail(loaded.message()));

  const std::vector<Check> checks = AllBackendChecks();
  Harness h(raw.table, raw.get_api, options.device, options.seed);
  h.probe = raw.probe;
  auto run_stage = [&](Stage stage, const std::string& unreachable) {
    for (const Check& c : checks) {
      if (c.stage != stage || !selected(c.name)) continue;
      if (!unreachable.empty()) {
        report.checks.push_back({c.name, Outcome::kSkip, unreachable, 0});
      } else {
        report.checks.push_back(RunOne(c, h));
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

  // Stage 2: initialize, with an unknown key that the plugin must ignore (with a warning).
  std::vector<pc_param_t> params;
  for (const auto& [k, v] : options.params) params.push_back({k.c_str(), v.c_str()});
  params.push_back({"conformance_unknown_key", "1"});
  const Status init = h.Take(raw.table->initialize(params.data(), params.size()), "initialize");
  if (!step("lifetime.initialize", init.ok() ? Pass("unknown parameter ignored")
                                             : Fail(init.ToString()))) {
    run_stage(Stage::kInitialized, "initialize failed");
    run_stage(Stage::kDevice, "initialize failed");
    return report;
  }
  run_stage(Stage::kInitialized, "");

  // Stage 3: the device under test, its props and a default stream.
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
