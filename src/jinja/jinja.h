// A Jinja template engine with the semantics Hugging Face `transformers` gives chat templates:
// Jinja2's sandboxed environment with trim_blocks, lstrip_blocks and the loopcontrols
// extension, `tojson` without ASCII escaping, the globals `raise_exception(msg)` and
// `strftime_now(fmt)`, the Python methods templates call on strings, lists and dicts, and
// Jinja2's undefined values. Python's jinja2 is the reference: same template, same variables,
// same bytes out.
//
// Self-contained: depends on util/ (Status) and nlohmann::json (the variables) only. Nothing a
// template or its variables do may crash or hang the caller: parsing and rendering are bounded
// by Limits and every failure is a Status whose message names the template line.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace polychip::jinja {

struct Limits {
  uint64_t max_steps = 20'000'000;         // evaluation steps (expressions, loop iterations)
  size_t max_output_bytes = 16u << 20;     // rendered text
  int max_depth = 256;                     // nesting of calls, macros, includes, expressions
  size_t max_source_bytes = 1u << 20;      // template text given to Parse
};

struct RenderOptions {
  Limits limits;
  // strftime_now's clock (local time); unset = the current time. Tests pin it.
  std::optional<std::time_t> now;
};

namespace internal {
struct Program;  // the parsed template (ast.h)
}

class Template {
 public:
  // Parses `source`. `name` appears in error messages ("chat template line 12: ...").
  // Errors: InvalidArgument naming the line and what was expected.
  static StatusOr<Template> Parse(std::string_view source, std::string name = "template");

  // Renders with `variables` (an object: messages, tools, add_generation_prompt, bos_token,
  // ...; key order is kept, as Python dicts keep it). Errors: InvalidArgument for
  // raise_exception() and for runtime errors (undefined attribute access, a type error), with
  // the template line; ResourceExhausted when a limit is hit. A raise_exception message is
  // the message of the Status, after "<name> line N: ".
  StatusOr<std::string> Render(const nlohmann::ordered_json& variables,
                               const RenderOptions& options = {}) const;

  const std::string& name() const;

 private:
  std::shared_ptr<const internal::Program> program_;
};

}  // namespace polychip::jinja
