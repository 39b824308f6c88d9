// Regular expressions -> EBNF text (grammar.h). A regex is regular, so its EBNF has no
// recursion; the matcher needs no special case for it.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "grammar/escapes.h"
#include "grammar/grammar.h"

namespace polychip::grammar {
namespace {

using CodeRange = std::pair<uint32_t, uint32_t>;

const std::vector<CodeRange> kDigit = {{'0', '9'}};
const std::vector<CodeRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodeRange> kSpace = {{'\t', '\r'}, {' ', ' '}};

std::vector<CodeRange> ComplementOf(std::vector<CodeRange> r) {
  std::sort(r.begin(), r.end());
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const auto& x : r) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = std::max(next, x.second + 1);
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

// A code point as it may appear inside an EBNF literal or class.
std::string Escaped(uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
      cp == ' ' || cp == '_' || cp == ',' || cp == ':' || cp == ';' || cp == '@' || cp == '!') {
    return std::string(1, static_cast<char>(cp));
  }
  if (cp < 0x80) return fmt::format("\\x{:02X}", cp);
  return fmt::format("\\U{:08X}", cp);
}

std::string ClassText(const std::vector<CodeRange>& ranges, bool negate) {
  std::string out = negate ? "[^" : "[";
  for (const auto& [lo, hi] : ranges) {
    out += Escaped(lo);
    if (hi > lo) out += "-" + Escaped(hi);
  }
  return out + "]";
}

// Inside a JSON string the quote, the backslash and control characters must be escaped, so
// a pattern applied to a JSON string's content never produces them raw.
const std::vector<CodeRange> kJsonUnsafe = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};

std::vector<CodeRange> Subtract(const std::vector<CodeRange>& a, const std::vector<CodeRange>& b) {
  // a AND NOT b = complement(complement(a) OR b)
  std::vector<CodeRange> u = ComplementOf(a);
  u.insert(u.end(), b.begin(), b.end());
  return ComplementOf(u);
}

class RegexParser {
 public:
  RegexParser(std::string_view re, bool json_safe) : re_(re), json_safe_(json_safe) {}

  StatusOr<std::string> Run() {
    if (!re_.empty() && re_[0] == '^') ++pos_;
    std::string out;
    PC_RETURN_IF_ERROR(Alternation(&out));
    if (pos_ < re_.size()) return Error("unbalanced ')'");
    return out.empty() ? std::string("\"\"") : out;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument(fmt::format("regex: {} at offset {} of '{}'", what, pos_, re_));
  }
  Status Unsupported(const std::string& what) const {
    return Unimplemented(fmt::format("regex: {} (offset {}) is not supported", what, pos_));
  }

  bool AtEndAnchor() const { return re_[pos_] == '$' && pos_ + 1 == re_.size(); }

  Status Alternation(std::string* out) {
    std::vector<std::string> alts(1);
    while (pos_ < re_.size() && re_[pos_] != ')') {
      if (re_[pos_] == '|') {
        ++pos_;
        alts.emplace_back();
        continue;
      }
      if (AtEndAnchor()) {
        ++pos_;
        continue;
      }
      std::string atom;
      PC_RETURN_IF_ERROR(Atom(&atom));
      PC_RETURN_IF_ERROR(Quantifier(&atom));
      if (!alts.back().empty()) alts.back() += " ";
      alts.back() += atom;
    }
    for (auto& a : alts) {
      if (a.empty()) a = "\"\"";
    }
    if (alts.size() == 1) {
      *out = alts[0];
    } else {
      *out = "(";
      for (size_t i = 0; i < alts.size(); ++i) out->append(i ? " | " : "").append(alts[i]);
      *out += ")";
    }
    return Status::Ok();
  }

  Status Quantifier(std::string* atom) {
    while (pos_ < re_.size()) {
      const char c = re_[pos_];
      std::string q;
      if (c == '*' || c == '+' || c == '?') {
        q = std::string(1, c);
        ++pos_;
      } else if (c == '{') {
        const size_t close = re_.find('}', pos_);
        if (close == std::string_view::npos) return Error("unterminated '{'");
        const std::string_view body = re_.substr(pos_ + 1, close - pos_ - 1);
        if (body.empty() || body.find_first_not_of("0123456789,") != std::string_view::npos ||
            body[0] == ',') {
          return Error("bad repetition '{" + std::string(body) + "}'");
        }
        q = "{" + std::string(body) + "}";
        pos_ = close + 1;
      } else {
        return Status::Ok();
      }
      // Lazy (x*?) and possessive (x*+) forms match the same strings.
      if (pos_ < re_.size() && (re_[pos_] == '?' || re_[pos_] == '+')) ++pos_;
      *atom = "(" + *atom + ")" + q;
    }
    return Status::Ok();
  }

  Status ReadCodePoint(uint32_t* cp) {
    const auto c = static_cast<unsigned char>(re_[pos_]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > re_.size()) return Error("invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) v = (v << 6) | (static_cast<unsigned char>(re_[pos_ + k]) & 0x3F);
    pos_ += len;
    *cp = v;
    return Status::Ok();
  }

  Status Hex(int n, uint32_t* cp) {
    if (const char* why = ReadHexDigits(re_, &pos_, n, cp)) return Error(why);
    return Status::Ok();
  }

  // An escape after '\': either a set of code points (\d, \w, \s and their negations) or one
  // code point.
  Status Escape(std::vector<CodeRange>* set, uint32_t* cp, bool* is_set) {
    if (pos_ >= re_.size()) return Error("dangling '\\'");
    const char e = re_[pos_++];
    *is_set = true;
    switch (e) {
      case 'd':
        *set = kDigit;
        return Status::Ok();
      case 'D':
        *set = ComplementOf(kDigit);
        return Status::Ok();
      case 'w':
        *set = kWord;
        return Status::Ok();
      case 'W':
        *set = ComplementOf(kWord);
        return Status::Ok();
      case 's':
        *set = kSpace;
        return Status::Ok();
      case 'S':
        *set = ComplementOf(kSpace);
        return Status::Ok();
      default:
        break;
    }
    *is_set = false;
    if (const std::optional<uint32_t> control = ControlEscape(e)) {
      *cp = *control;
      return Status::Ok();
    }
    switch (e) {
      case 'x':
        return Hex(2, cp);
      case 'u':
        return Hex(4, cp);
      case 'b':
      case 'B':
        return Unsupported("a word boundary \\b");
      default:
        break;
    }
    if (e >= '1' && e <= '9') return Unsupported("a backreference");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
      return Unsupported(fmt::format("the escape \\{}", e));
    }
    --pos_;
    return ReadCodePoint(cp);
  }

  Status Atom(std::string* out) {
    const char c = re_[pos_];
    if (c == '(') {
      ++pos_;
      if (pos_ < re_.size() && re_[pos_] == '?') {
        if (re_.substr(pos_, 2) == "?:") {
          pos_ += 2;
        } else if (re_.substr(pos_, 2) == "?<" && pos_ + 2 < re_.size() && re_[pos_ + 2] != '=' &&
                   re_[pos_ + 2] != '!') {
          pos_ = re_.find('>', pos_) + 1;  // a named group
          if (pos_ == 0) return Error("unterminated group name");
        } else if (re_.substr(pos_, 3) == "?P<") {
          pos_ = re_.find('>', pos_) + 1;
          if (pos_ == 0) return Error("unterminated group name");
        } else {
          return Unsupported("lookaround or inline flags '(?'");
        }
      }
      std::string inner;
      PC_RETURN_IF_ERROR(Alternation(&inner));
      if (pos_ >= re_.size() || re_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      *out = "(" + (inner.empty() ? std::string("\"\"") : inner) + ")";
      return Status::Ok();
    }
    if (c == '[') return Class(out);
    if (c == '.') {
      ++pos_;
      *out = SetText({{'\n', '\n'}}, true);
      return Status::Ok();
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Error("nothing to repeat");
    if (c == '^' || c == '$') return Unsupported("an anchor inside the expression");
    uint32_t cp = 0;
    if (c == '\\') {
      ++pos_;
      std::vector<CodeRange> set;
      bool is_set = false;
      PC_RETURN_IF_ERROR(Escape(&set, &cp, &is_set));
      if (is_set) {
        *out = SetText(set, false);
        return Status::Ok();
      }
    } else {
      PC_RETURN_IF_ERROR(ReadCodePoint(&cp));
    }
    *out = LiteralText(cp);
    return Status::Ok();
  }

  Status Class(std::string* out) {
    ++pos_;
    bool negate = false;
    if (pos_ < re_.size() && re_[pos_] == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<CodeRange> ranges;
    bool first = true;
    while (true) {
      if (pos_ >= re_.size()) return Error("unterminated '['");
      if (re_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      uint32_t lo = 0;
      if (re_[pos_] == '\\') {
        ++pos_;
        std::vector<CodeRange> set;
        bool is_set = false;
        PC_RETURN_IF_ERROR(Escape(&set, &lo, &is_set));
        if (is_set) {
          ranges.insert(ranges.end(), set.begin(), set.end());
          continue;
        }
      } else {
        PC_RETURN_IF_ERROR(ReadCodePoint(&lo));
      }
      uint32_t hi = lo;
      if (pos_ + 1 < re_.size() && re_[pos_] == '-' && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          ++pos_;
          std::vector<CodeRange> set;
          bool is_set = false;
          PC_RETURN_IF_ERROR(Escape(&set, &hi, &is_set));
          if (is_set) return Error("a class escape cannot end a range");
        } else {
          PC_RETURN_IF_ERROR(ReadCodePoint(&hi));
        }
        if (hi < lo) return Error("reversed range");
      }
      ranges.push_back({lo, hi});
    }
    std::sort(ranges.begin(), ranges.end());
    *out = SetText(ranges, negate);
    return Status::Ok();
  }

  // A set of code points as a class; inside a JSON string, what cannot appear raw (quote,
  // backslash, control characters) comes as its escape instead.
  std::string SetText(std::vector<CodeRange> ranges, bool negate) const {
    if (!json_safe_) return ClassText(ranges, negate);
    if (negate) ranges = ComplementOf(ranges);
    auto has = [&](uint32_t c) {
      for (const auto& [lo, hi] : ranges) {
        if (c >= lo && c <= hi) return true;
      }
      return false;
    };
    std::vector<std::string> alts;
    const std::vector<CodeRange> safe = Subtract(ranges, kJsonUnsafe);
    if (!safe.empty()) alts.push_back(ClassText(safe, false));
    if (has('"')) alts.push_back(LiteralText('"'));
    if (has('\\')) alts.push_back(LiteralText('\\'));
    bool all_controls = true;
    for (uint32_t c = 0; c < 0x20; ++c) all_controls = all_controls && has(c);
    if (all_controls) {
      alts.push_back(R"("\\u00" [01] [0-9a-fA-F])");
    } else {
      for (uint32_t c = 0; c < 0x20; ++c) {
        if (has(c)) alts.push_back(LiteralText(c));
      }
    }
    if (alts.empty()) return "[^\\x00-\\U0010FFFF]";  // nothing: a class that cannot match
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out.append(i ? " | " : "").append(alts[i]);
    return out + ")";
  }

  std::string LiteralText(uint32_t cp) const {
    if (json_safe_ && (cp == '"' || cp == '\\')) return cp == '"' ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"";
    if (json_safe_ && cp < 0x20) return fmt::format("\"\\\\u{:04x}\"", cp);
    return "\"" + Escaped(cp) + "\"";
  }

  std::string_view re_;
  bool json_safe_;
  size_t pos_ = 0;
};

}  // namespace

StatusOr<std::string> RegexToEbnf(std::string_view regex, bool json_string) {
  return RegexParser(regex, json_string).Run();
}

}  // namespace polychip::grammar
