#include "jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "jinja/value.h"

namespace polychip::jinja::internal {
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= 0x1c && c <= 0x1f);
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : src_(std::move(source)), name_(name) {}

  StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    const size_t n = src_.size();
    bool line_starting = true;  // the last match ended a line: lstrip applies at data start
    while (pos < n) {
      size_t t = FindTagStart(pos);
      if (t == std::string::npos) {
        Emit(TokenType::kText, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[t + 1];  // '{', '%' or '#'
      char sign = 0;
      if (t + 2 < n && (src_[t + 2] == '-' || src_[t + 2] == '+')) sign = src_[t + 2];
      std::string text = src_.substr(pos, t - pos);
      StripBeforeTag(&text, sign, kind != '{', line_starting);
      if (!text.empty()) Emit(TokenType::kText, std::move(text), pos);
      size_t p = t + 2 + (sign ? 1 : 0);

      if (kind == '#') {
        const size_t q = src_.find("#}", p);
        if (q == std::string::npos) return Error(t, "missing end of comment tag");
        size_t end = q + 2;
        if (q > p && src_[q - 1] == '-') {
          while (end < n && IsSpace(src_[end])) ++end;
        } else if (!(q > p && src_[q - 1] == '+') && end < n && src_[end] == '\n') {
          ++end;  // trim_blocks
        }
        line_starting = src_[end - 1] == '\n';
        pos = end;
        continue;
      }
      if (kind == '%') {
        size_t raw_end = 0;
        if (MatchRawBegin(p, &raw_end)) {
          PC_ASSIGN_OR_RETURN(pos, LexRaw(t, raw_end, &line_starting));
          continue;
        }
      }
      const bool block = kind == '%';
      Emit(block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", t);
      PC_ASSIGN_OR_RETURN(pos, LexTag(p, block, t));
      line_starting = src_[pos - 1] == '\n';
    }
    Emit(TokenType::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size()) {
        const char c = src_[i + 1];
        if (c == '{' || c == '%' || c == '#') return i;
      }
    }
    return std::string::npos;
  }

  // The data before a tag: `-` strips all whitespace before it; lstrip_blocks strips the
  // spaces and tabs that stand alone before a block or comment tag on its line.
  static void StripBeforeTag(std::string* text, char sign, bool lstrip_applies,
                             bool line_starting) {
    if (sign == '-') {
      size_t e = text->size();
      while (e > 0 && IsSpace((*text)[e - 1])) --e;
      text->resize(e);
    } else if (sign != '+' && lstrip_applies) {
      const size_t nl = text->rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting) {
        bool only_blank = true;
        for (size_t i = l_pos; i < text->size(); ++i) {
          if ((*text)[i] != ' ' && (*text)[i] != '\t') {
            only_blank = false;
            break;
          }
        }
        if (only_blank) text->resize(l_pos);
      }
    }
  }

  size_t SkipSpace(size_t p) const {
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    return p;
  }

  // `{% raw %}` (after "{%" and its sign): `\s*raw\s*(-%}\s*|%})`.
  bool MatchRawBegin(size_t p, size_t* end) const {
    p = SkipSpace(p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && IsNameChar(src_[p])) return false;
    p = SkipSpace(p);
    if (src_.compare(p, 3, "-%}") == 0) {
      *end = SkipSpace(p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *end = p + 2;
      return true;
    }
    return false;
  }

  StatusOr<size_t> LexRaw(size_t tag, size_t start, bool* line_starting) {
    for (size_t i = src_.find("{%", start); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      p = SkipSpace(p);
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p = SkipSpace(p + 6);
      size_t end;
      if (src_.compare(p, 3, "+%}") == 0) {
        end = p + 3;
      } else if (src_.compare(p, 3, "-%}") == 0) {
        end = SkipSpace(p + 3);
      } else if (src_.compare(p, 2, "%}") == 0) {
        end = p + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = src_.substr(start, i - start);
      StripBeforeTag(&text, sign, true, start > 0 && src_[start - 1] == '\n');
      if (!text.empty()) Emit(TokenType::kText, std::move(text), start);
      *line_starting = src_[end - 1] == '\n';
      return end;
    }
    return Error(tag, "missing end of raw directive");
  }

  StatusOr<size_t> LexTag(size_t p, bool block, size_t tag_start) {
    std::string balance;
    const size_t n = src_.size();
    while (true) {
      if (p >= n) {
        return Error(tag_start, std::string("unexpected end of template, expected '") +
                                    (block ? "%}" : "}}") + "'");
      }
      if (balance.empty()) {
        if (block) {
          if (src_.compare(p, 3, "-%}") == 0) {
            Emit(TokenType::kBlockEnd, "", p);
            return SkipSpace(p + 3);
          }
          if (src_.compare(p, 3, "+%}") == 0) {
            Emit(TokenType::kBlockEnd, "", p);
            return p + 3;
          }
          if (src_.compare(p, 2, "%}") == 0) {
            Emit(TokenType::kBlockEnd, "", p);
            return p + 2 < n && src_[p + 2] == '\n' ? p + 3 : p + 2;  // trim_blocks
          }
        } else {
          if (src_.compare(p, 3, "-}}") == 0) {
            Emit(TokenType::kVarEnd, "", p);
            return SkipSpace(p + 3);
          }
          if (src_.compare(p, 2, "}}") == 0) {
            Emit(TokenType::kVarEnd, "", p);
            return p + 2;
          }
        }
      }
      const char c = src_[p];
      if (IsSpace(c)) {
        ++p;
        continue;
      }
      if (IsDigit(c)) {
        PC_ASSIGN_OR_RETURN(p, LexNumber(p));
        continue;
      }
      if (IsNameStart(c)) {
        size_t e = p;
        while (e < n && IsNameChar(src_[e])) ++e;
        Emit(TokenType::kName, src_.substr(p, e - p), p);
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        PC_ASSIGN_OR_RETURN(p, LexString(p));
        continue;
      }
      static constexpr const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* two : kTwo) {
        if (src_.compare(p, 2, two) == 0) op = two;
      }
      if (op.empty()) {
        static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
        if (kOne.find(c) == std::string_view::npos) {
          return Error(p, std::string("unexpected character '") + c + "'");
        }
        op = std::string(1, c);
      }
      if (op == "(" || op == "[" || op == "{") {
        balance.push_back(op[0]);
      } else if (op == ")" || op == "]" || op == "}") {
        const char open = op == ")" ? '(' : op == "]" ? '[' : '{';
        if (balance.empty() || balance.back() != open) {
          return Error(p, "unexpected '" + op + "'");
        }
        balance.pop_back();
      }
      Emit(TokenType::kOp, op, p);
      p += op.size();
    }
  }

  StatusOr<size_t> LexNumber(size_t p) {
    const size_t n = src_.size();
    auto digits = [&](size_t q) {  // (\d+_)*\d+
      size_t e = q;
      while (e < n &&
             (IsDigit(src_[e]) || (src_[e] == '_' && e + 1 < n && IsDigit(src_[e + 1]) && e > q))) {
        ++e;
      }
      return e;
    };
    auto clean = [](std::string s) {
      std::string r;
      for (char ch : s) {
        if (ch != '_') r.push_back(ch);
      }
      return r;
    };
    if (src_[p] == '0' && p + 1 < n &&
        (src_[p + 1] == 'x' || src_[p + 1] == 'X' || src_[p + 1] == 'o' || src_[p + 1] == 'O' ||
         src_[p + 1] == 'b' || src_[p + 1] == 'B')) {
      const char base_char = static_cast<char>(src_[p + 1] | 0x20);
      const int base = base_char == 'x' ? 16 : base_char == 'o' ? 8 : 2;
      size_t e = p + 2;
      while (e < n && (std::isxdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      const std::string body = clean(src_.substr(p + 2, e - p - 2));
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(body.c_str(), &end, base);
      if (body.empty() || *end != 0 || errno) return Error(p, "invalid integer literal");
      Token tok{TokenType::kInt, src_.substr(p, e - p), Line(p), v, 0};
      tokens_.push_back(std::move(tok));
      return e;
    }
    size_t e = digits(p);
    bool is_float = false;
    // A float needs digits after its point, and is never the `.0` of `x.0.1` (an attribute).
    const bool after_dot = p > 0 && src_[p - 1] == '.';
    if (!after_dot && e + 1 < n && src_[e] == '.' && IsDigit(src_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && IsDigit(src_[q])) {
        e = digits(q);
        is_float = true;
      }
    }
    const std::string text = clean(src_.substr(p, e - p));
    Token tok{is_float ? TokenType::kFloat : TokenType::kInt, src_.substr(p, e - p), Line(p), 0, 0};
    if (is_float) {
      tok.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      tok.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return Error(p, "integer literal too large");
    }
    tokens_.push_back(std::move(tok));
    return e;
  }

  static int HexValue(char c) {
    if (IsDigit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's unicode-escape decoding, which Jinja2 applies to string literals.
  StatusOr<size_t> LexString(size_t p) {
    const char quote = src_[p];
    const size_t n = src_.size();
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= n) return Error(p, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= n) return Error(p, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < len; ++k) {
            const int h = i + k < n ? HexValue(src_[i + k]) : -1;
            if (h < 0) return Error(p, std::string("truncated \\") + e + " escape in string");
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10ffff) return Error(p, "illegal Unicode character in string");
          i += len;
          AppendUtf8(&out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < n && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            }
            AppendUtf8(&out, cp);
          } else {
            // Python keeps an unknown escape as written.
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    Token tok{TokenType::kString, std::move(out), Line(p), 0, 0};
    tokens_.push_back(std::move(tok));
    return i + 1;
  }

  int Line(size_t pos) {
    // Tokens come in order of position, so the count advances incrementally.
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  void Emit(TokenType type, std::string value, size_t pos) {
    Token tok{type, std::move(value), Line(pos), 0, 0};
    tokens_.push_back(std::move(tok));
  }

  Status Error(size_t pos, const std::string& what) {
    return InvalidArgument(name_ + " line " + std::to_string(Line(pos)) + ": " + what);
  }

  std::string src_;
  const std::string& name_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

StatusOr<std::vector<Token>> Tokenize(std::string_view source, const std::string& name) {
  // Jinja2 normalizes every newline sequence to "\n" and drops one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), name).Run();
}

}  // namespace polychip::jinja::internal
