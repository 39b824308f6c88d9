// What the regex and the EBNF syntaxes share when reading a literal: the one-letter escapes of
// control characters and the hex digits of \x, \u and \U.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

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

// Reads n hex digits of `text` from *pos (advancing it) into *cp; on failure returns what is
// wrong ("short hex escape", "bad hex digit"), else nullptr.
inline const char* ReadHexDigits(std::string_view text, size_t* pos, int n, uint32_t* cp) {
  if (*pos + n > text.size()) return "short hex escape";
  uint32_t v = 0;
  for (int k = 0; k < n; ++k) {
    const char h = text[(*pos)++];
    v <<= 4;
    if (h >= '0' && h <= '9')
      v |= h - '0';
    else if (h >= 'a' && h <= 'f')
      v |= h - 'a' + 10;
    else if (h >= 'A' && h <= 'F')
      v |= h - 'A' + 10;
    else
      return "bad hex digit";
  }
  *cp = v;
  return nullptr;
}

}  // namespace polychip::grammar
