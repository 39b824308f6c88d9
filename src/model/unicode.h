// UTF-8 helpers and the regex word splitter used by the tokenizers.
//
// Pre-tokenizer regexes use Unicode classes (\p{L}, \p{N}, \s ...). They run on PCRE2 in UTF +
// UCP mode, so classes mean what they mean in the HF `tokenizers` library that produced the
// vocabularies; lookahead such as `\s+(?!\S)` is native there, no emulation needed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace polychip::model {

// Length of the UTF-8 sequence that starts with `lead` (1 for ASCII and for stray continuation
// bytes, so that a scan over arbitrary bytes always advances).
int Utf8SeqLen(uint8_t lead);

// Appends the UTF-8 encoding of `cp` to `out`.
void AppendUtf8(uint32_t cp, std::string& out);

// Length of the longest prefix of `bytes` that ends on a character boundary: a trailing partial
// multibyte sequence (one that more bytes could still complete) is excluded.
size_t CompleteUtf8Prefix(std::string_view bytes);

// Replaces every invalid UTF-8 sequence with U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

// GPT-2 byte-level BPE maps every byte to a printable code point (so that a vocabulary of
// strings can hold arbitrary bytes): printable Latin-1 maps to itself, the rest to U+0100...
const std::string& ByteToUnicode(uint8_t byte);  // UTF-8 of the code point for `byte`
// Inverse mapping of a whole string; bytes whose code point is outside the table are kept as
// their UTF-8 (`ok` is set false when that happens).
std::string UnicodeToBytes(std::string_view text, bool* ok = nullptr);

// Replaces every occurrence of `from` by `to`.
std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to);

// A compiled PCRE2 pattern (UTF, UCP, invalid UTF-8 tolerated, `$` only at the very end).
// Immutable after construction, so one instance may be shared by threads.
class Regex {
 public:
  static StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Splits `text` into the matches and the gaps between them, in order, as byte lengths (no
  // zero lengths; their sum is text.size()). The pattern only sees `text` (lookahead stops at
  // its end), as when the regex runs on one fragment of a larger input.
  void Split(std::string_view text, std::vector<size_t>& lengths) const;

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// Applies `regexes` in turn, each one splitting every piece left by the previous ones (matches
// and gaps alike), and returns the final pieces of `text`.
std::vector<std::string_view> SplitWithRegexes(std::string_view text,
                                               const std::vector<std::unique_ptr<Regex>>& regexes);

}  // namespace polychip::model
