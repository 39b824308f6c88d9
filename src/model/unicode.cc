#include "model/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <unordered_map>

namespace polychip::model {

int Utf8SeqLen(uint8_t lead) {
  if (lead < 0xC0) return 1;  // ASCII or a stray continuation byte
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

bool IsContinuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Length of the valid UTF-8 sequence at `s[i]`, or 0 if it is invalid or truncated.
size_t ValidSeqAt(std::string_view s, size_t i) {
  const uint8_t lead = static_cast<uint8_t>(s[i]);
  if (lead < 0x80) return 1;
  if (lead < 0xC2 || lead > 0xF4) return 0;
  const size_t n = static_cast<size_t>(Utf8SeqLen(lead));
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if (!IsContinuation(static_cast<uint8_t>(s[i + k]))) return 0;
  }
  const uint8_t second = static_cast<uint8_t>(s[i + 1]);
  if (lead == 0xE0 && second < 0xA0) return 0;  // overlong
  if (lead == 0xED && second > 0x9F) return 0;  // surrogates
  if (lead == 0xF0 && second < 0x90) return 0;  // overlong
  if (lead == 0xF4 && second > 0x8F) return 0;  // > U+10FFFF
  return n;
}

}  // namespace

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Look back at most 3 bytes for the lead byte of a sequence that is still open.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(bytes[n - back]);
    if (IsContinuation(b)) continue;
    if (b >= 0xC2 && b <= 0xF4 && static_cast<size_t>(Utf8SeqLen(b)) > back) return n - back;
    return n;
  }
  return n;
}

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = ValidSeqAt(bytes, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> byte_to_utf8;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
};

const ByteTables& GetByteTables() {
  static const ByteTables tables = [] {
    ByteTables t;
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(cp, t.byte_to_utf8[b]);
      t.cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return tables;
}

}  // namespace

const std::string& ByteToUnicode(uint8_t byte) { return GetByteTables().byte_to_utf8[byte]; }

std::string UnicodeToBytes(std::string_view text, bool* ok) {
  const auto& map = GetByteTables().cp_to_byte;
  std::string out;
  out.reserve(text.size());
  if (ok) *ok = true;
  for (size_t i = 0; i < text.size();) {
    const size_t n = ValidSeqAt(text, i);
    if (n == 0) {
      if (ok) *ok = false;
      out += text[i++];
      continue;
    }
    uint32_t cp = static_cast<uint8_t>(text[i]);
    if (n > 1) {
      cp &= 0x3F >> (n - 1);
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    }
    auto it = map.find(cp);
    if (it != map.end()) {
      out += static_cast<char>(it->second);
    } else {
      if (ok) *ok = false;
      out.append(text.substr(i, n));
    }
    i += n;
  }
  return out;
}

std::string ReplaceAll(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(text.substr(pos));
  return out;
}

// ---- Regex ----------------------------------------------------------------------------------

namespace {

// One match-data block per thread: a single ovector pair is all Split needs, and it works for
// every pattern, so tokenizing never allocates per call.
pcre2_match_data* ThreadMatchData() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder holder;
  return holder.md;
}

}  // namespace

StatusOr<std::unique_ptr<Regex>> Regex::Compile(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  const uint32_t options =
      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return InvalidArgument("bad pre-tokenizer regex at offset " + std::to_string(error_offset) +
                           ": " + reinterpret_cast<const char*>(message) + " in '" + pattern +
                           "'");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
  std::unique_ptr<Regex> regex(new Regex());
  regex->pattern_ = pattern;
  regex->code_ = code;
  return regex;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::Split(std::string_view text, std::vector<size_t>& lengths) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = ThreadMatchData();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t piece_start = 0;  // start of the current gap
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) break;  // no further match (or a matching error: keep the rest as one gap)
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end <= begin) {
      // An empty match splits nothing; step over one character and search again.
      pos = begin + Utf8SeqLen(static_cast<uint8_t>(text[begin]));
      continue;
    }
    if (begin > piece_start) lengths.push_back(begin - piece_start);
    lengths.push_back(end - begin);
    piece_start = pos = end;
  }
  if (text.size() > piece_start) lengths.push_back(text.size() - piece_start);
}

std::vector<std::string_view> SplitWithRegexes(
    std::string_view text, const std::vector<std::unique_ptr<Regex>>& regexes) {
  std::vector<std::string_view> pieces;
  if (text.empty()) return pieces;
  pieces.push_back(text);
  std::vector<size_t> lengths;
  for (const auto& regex : regexes) {
    std::vector<std::string_view> next;
    next.reserve(pieces.size() * 2);
    for (std::string_view piece : pieces) {
      lengths.clear();
      regex->Split(piece, lengths);
      size_t offset = 0;
      for (size_t len : lengths) {
        next.push_back(piece.substr(offset, len));
        offset += len;
      }
    }
    pieces = std::move(next);
  }
  return pieces;
}

}  // namespace polychip::model
