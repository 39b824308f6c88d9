// The launch options as data: one row per option with its name (the flag without dashes, also
// its config key), the other spellings it accepts (vLLM's and SGLang's names), its help, the
// commands it belongs to, and how it is parsed, checked and printed. The command line, the YAML
// file, `--help` and `--print-config` all read this table, so a flag is a config key with the
// same checks by construction.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "launch/launch.h"
#include "util/status.h"

namespace polychip::launch {

// The commands an option belongs to (a bit set).
enum Scope : uint32_t {
  kScopeServe = 1,     // polychip serve
  kScopeModel = 2,     // every command that loads a model (serve, run, bench, profile, ...)
  kScopeParallel = 4,  // commands that run tp x pp ranks (serve, run, perplexity)
};

struct Option {
  enum class Kind { kInt, kNumber, kText, kSwitch };
  std::string name;                  // "max-running-requests": --max-running-requests, key
  std::vector<std::string> aliases;  // other flag spellings, with dashes: "--max-model-len"
  std::string help;
  Kind kind = Kind::kText;
  uint32_t scope = kScopeServe;
  std::function<Status(LaunchSpec&, const std::string&)> set;  // parses and checks
  std::function<std::string(const LaunchSpec&)> get;           // as a config value
  bool secret = false;  // printed as "<set>" by --print-config
  // Given more than once (a flag repeated, a YAML list): each value goes through `set`, which
  // appends; `get` prints the list in YAML's flow style.
  bool repeated = false;
};

const std::vector<Option>& Options();

// The option whose name is `key` (dashes or underscores), or null.
const Option* FindOption(std::string_view key);

// The known name nearest to `key` among `candidates` (edit distance), or "" when none is close.
std::string Nearest(std::string_view key, const std::vector<std::string>& candidates);

// Where each value of a spec came from, by option name: "default", "config FILE", "flag",
// "env NAME".
using Sources = std::map<std::string, std::string>;

// Applies the YAML file's launch keys of `scope` to `spec` (those not in `skip`: the flags given
// on the command line, which win). The rule: launch options are top-level keys; `backend`,
// `comm`, `memory` are the runtime's sections and `plugin_path`, `devices`, `op_fallback` its
// keys (runtime/config.h); a `serve:` section is the same as the top level, and a key in both
// is an error. Any other key is an error naming it and the nearest known one; every value goes
// through its flag's checks. Options of other commands are accepted and left alone.
Status ApplyConfigFile(const std::string& path, uint32_t scope,
                       const std::vector<std::string>& skip, LaunchSpec* spec, Sources* sources);

// The resolved launch as a YAML config (`polychip serve --print-config`): every option of
// `scope` with its value and, as a comment, where it came from; keys marked secret are masked.
std::string PrintConfig(const LaunchSpec& spec, uint32_t scope, const Sources& sources);

}  // namespace polychip::launch
