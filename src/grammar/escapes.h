// What the regex and the EBNF syntaxes share when reading a literal: the one-letter escapes of
// control characters.
#pragma once

#include <cstdint>
#include <optional>

namespace polychip::grammar {

// \n \t \r \f \v \0 as their code points; nullopt for any other escape letter.
inline std::optional<uint32_t> ControlEscape(char e) {
  switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    default: return std::nullopt;
  }
}

}  // namespace polychip::grammar
