// Python's str, list and dict methods as the sandbox exposes them, the global functions of
// transformers' environment, and the Python helpers the filters share with them.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/eval.h"

namespace polychip::jinja::internal {

// Arguments bound to a signature: positional first, then keywords by name.
struct Bound {
  std::vector<Value> values;
  std::vector<bool> given;
  bool has(size_t i) const { return given[i]; }
  const Value& operator[](size_t i) const { return values[i]; }
  bool Truthy(size_t i, bool fallback) const { return given[i] ? values[i].Truthy() : fallback; }
};
StatusOr<Bound> Bind(const Args& args, std::initializer_list<const char*> names,
                     const std::string& function);

// Case mapping (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic).
uint32_t PyUpperCp(uint32_t cp);
uint32_t PyLowerCp(uint32_t cp);
std::string PyLower(std::string_view s);

// int(s, base) and float(s) as Python parses strings; nullopt where Python raises.
std::optional<int64_t> ParsePyInt(std::string_view s, int base);
std::optional<double> ParsePyFloat(std::string_view s);
// str.splitlines(keepends).
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);
// json.dumps's ensure_ascii=True applied to JSON text (non-ASCII as \uXXXX escapes).
std::string AsciiEscapeJson(std::string_view json);

}  // namespace polychip::jinja::internal
