// polychip — entry point. Subcommands register themselves (see command.h).
#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/command.h"

namespace polychip::cli {

std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}

bool RegisterCommand(Command command) {
  Commands().push_back(std::move(command));
  return true;
}

}  // namespace polychip::cli

int main(int argc, char** argv) {
  using namespace polychip::cli;
  // Logs go to stderr: stdout carries only results (generated text, --json output).
  spdlog::set_default_logger(spdlog::stderr_color_mt("polychip"));
  // POLYCHIP_LOG_LEVEL=debug shows, among others, the plugins' debug messages (the cpu
  // plugin's decode weight-streams decisions); default info.
  if (const char* level = std::getenv("POLYCHIP_LOG_LEVEL"); level && *level) {
    const std::string name = level;
    const auto l = spdlog::level::from_str(name);
    if (l == spdlog::level::off && name != "off") {
      std::fprintf(stderr,
                   "error: POLYCHIP_LOG_LEVEL must be trace, debug, info, warn, error, critical "
                   "or off, got '%s'\n",
                   level);
      return 2;
    }
    spdlog::set_level(l);
  }
  CLI::App app{"polychip — LLM inference on any accelerator through plugins"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "polychip 0.1.0");
  auto& commands = Commands();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::vector<std::function<int()>> runners(commands.size());
  std::vector<CLI::App*> subs(commands.size());
  GlobalOptions globals;
  for (size_t i = 0; i < commands.size(); ++i) {
    subs[i] = app.add_subcommand(commands[i].name, commands[i].help);
    subs[i]->add_option("--device", globals.device,
                        "devices to use, backend:i[,j...] (logical i -> physical)");
    subs[i]->add_option("--config", globals.config_path, "YAML configuration file");
    subs[i]->add_option("--op-fallback", globals.op_fallback,
                        "run the ops the device lacks on this backend (e.g. cpu), operands "
                        "staged through host memory; 'none' turns a config's op_fallback off");
    runners[i] = commands[i].setup(*subs[i], globals);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Through the environment, so that tensor/pipeline-parallel ranks (child processes) see it.
  if (!globals.op_fallback.empty()) setenv("POLYCHIP_OP_FALLBACK", globals.op_fallback.c_str(), 1);
  for (size_t i = 0; i < commands.size(); ++i) {
    if (subs[i]->parsed()) return runners[i]();
  }
  return 2;
}
