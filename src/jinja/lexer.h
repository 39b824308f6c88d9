// Template text to tokens, with Jinja2's lexer rules for the settings transformers uses:
// newlines normalized to "\n", one trailing newline dropped, trim_blocks (the newline after a
// block or comment tag goes), lstrip_blocks (spaces and tabs before a block or comment tag on
// its own line go), `-` and `+` whitespace control, raw blocks, and tag ends recognized only
// when brackets are balanced.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace polychip::jinja::internal {

enum class TokenType : uint8_t {
  kText,        // template data, output as is
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value: the string with escapes resolved
  kInt,
  kFloat,
  kOp,  // value: the operator ("+", "//", "==", "(", ...)
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0;
};

// Errors name the line ("<name> line N: ...").
StatusOr<std::vector<Token>> Tokenize(std::string_view source, const std::string& name);

}  // namespace polychip::jinja::internal
