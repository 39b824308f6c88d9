#include "cli/launch_flags.h"

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

namespace polychip::cli {

using launch::Option;

void AddLaunchOptions(CLI::App& app, uint32_t scope, GivenFlags* given) {
  const launch::LaunchSpec defaults;
  for (const Option& o : launch::Options()) {
    if ((o.scope & scope) == 0) continue;
    std::string names = "--" + o.name;
    for (const std::string& a : o.aliases) names += "," + a;
    std::string help = o.help;
    if (o.kind != Option::Kind::kSwitch) {
      const std::string d = o.get(defaults);
      help += " (default: " + (d.empty() ? std::string("none") : d) + ")";
    }
    const std::string name = o.name;
    if (o.kind == Option::Kind::kSwitch) {
      // `--flag` turns it on, `--flag=false` off (CLI11 counts a false value as -1); the
      // callback also runs, with 0, when the flag is absent.
      app.add_flag_function(
          names,
          [given, name](int64_t n) {
            if (n != 0) given->emplace_back(name, n > 0 ? "true" : "false");
          },
          help + " (default: " + o.get(defaults) + ")");
      continue;
    }
    const char* type = o.kind == Option::Kind::kInt      ? "INT"
                       : o.kind == Option::Kind::kNumber ? "NUMBER"
                                                         : "TEXT";
    if (o.repeated) {
      app.add_option_function<std::vector<std::string>>(
             names,
             [given, name](const std::vector<std::string>& v) {
               for (const std::string& x : v) given->emplace_back(name, x);
             },
             help)
          ->type_name(type)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
          ->expected(1);
      continue;
    }
    app.add_option_function<std::string>(
           names, [given, name](const std::string& v) { given->emplace_back(name, v); }, help)
        ->type_name(type);
  }
}

StatusOr<launch::LaunchSpec> BuildSpec(const GlobalOptions& globals, uint32_t scope,
                                       const GivenFlags& given, launch::Sources* sources) {
  launch::LaunchSpec spec;
  launch::Sources own;
  if (sources == nullptr) sources = &own;
  spec.config_path = globals.config_path;
  spec.op_fallback = globals.op_fallback;
  if (const char* level = std::getenv("POLYCHIP_LOG_LEVEL"); level && *level) {
    spec.log_level = level;
    (*sources)["log-level"] = "env POLYCHIP_LOG_LEVEL";
  }
  std::vector<std::string> skip;
  for (const auto& [name, value] : given) skip.push_back(name);
  if (!globals.device.empty()) skip.push_back("device");
  PC_RETURN_IF_ERROR(launch::ApplyConfigFile(globals.config_path, scope, skip, &spec, sources));
  if (!globals.device.empty()) {
    spec.device = globals.device;
    (*sources)["device"] = "flag";
  }
  for (const auto& [name, value] : given) {
    const Option* o = launch::FindOption(name);
    if (Status s = o->set(spec, value); !s.ok()) {
      return InvalidArgument("--" + name + ": " + s.message());
    }
    (*sources)[name] = "flag";
  }
  spdlog::set_level(spdlog::level::from_str(spec.log_level));
  PC_RETURN_IF_ERROR(launch::Validate(spec));
  return spec;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace polychip::cli
