// The `polychip` command line: each subcommand lives in its own cmd_<name>.cc and registers
// itself here, so adding a command never touches main.cc.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace polychip::cli {

// The options every subcommand has, filled by the parse; main() owns them and hands each
// command a reference (read when the command runs, after the parse).
struct GlobalOptions {
  std::string device;       // --device backend:i[,j...]
  std::string config_path;  // --config FILE.yaml
  std::string op_fallback;  // --op-fallback BACKEND
};

struct Command {
  std::string name;
  std::string help;
  // Adds the subcommand's options to `app` and returns the function that runs it (exit code).
  std::function<std::function<int()>(CLI::App& app, const GlobalOptions& globals)> setup;
};

// Called from a static initializer in each cmd_<name>.cc:
//   static const bool kRegistered = RegisterCommand({"devices", "...", SetupDevices});
bool RegisterCommand(Command command);
std::vector<Command>& Commands();

}  // namespace polychip::cli
