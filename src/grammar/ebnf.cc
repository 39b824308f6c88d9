// The EBNF parser: text -> Grammar (grammar.h). Character classes become UTF-8 byte sequences
// here, and postfix repetition becomes right-recursive helper rules (which the matcher runs in
// constant stack depth: a call in tail position does not push a return address).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "grammar/escapes.h"
#include "grammar/grammar.h"

namespace polychip::grammar {
namespace {

using Sequence = std::vector<Element>;
using CodeRange = std::pair<uint32_t, uint32_t>;  // inclusive

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 100000;  // {m,n} bounds beyond this are refused (size)

void EncodeUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of byte ranges (the method of
// RE2 and Rust's regex-syntax): each result is one sequence of per-byte [min, max] pairs.
void Utf8Sequences(uint32_t lo, uint32_t hi,
                   std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  // Surrogates are not characters.
  if (lo < 0xD800 && hi > 0xDFFF) {
    Utf8Sequences(lo, 0xD7FF, out);
    Utf8Sequences(0xE000, hi, out);
    return;
  }
  if (lo >= 0xD800 && hi <= 0xDFFF) return;
  if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
  if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
  if (lo > hi) return;
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      Utf8Sequences(lo, boundary, out);
      Utf8Sequences(boundary + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  EncodeUtf8(lo, &a);
  EncodeUtf8(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
  }
  out->push_back(std::move(seq));
}

std::vector<CodeRange> Normalize(std::vector<CodeRange> r) {
  std::sort(r.begin(), r.end());
  std::vector<CodeRange> out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

std::vector<CodeRange> Complement(const std::vector<CodeRange>& r) {
  std::vector<CodeRange> out;
  uint32_t next = 0;
  for (const auto& x : Normalize(r)) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  StatusOr<Grammar> Run(std::string_view root) {
    SkipSpace(true);
    while (pos_ < text_.size()) {
      const std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(true);
      if (text_.substr(pos_, 3) != "::=") return Error("expected '::=' after '" + name + "'");
      pos_ += 3;
      const int32_t id = RuleId(name);
      if (defined_[id]) return Error("rule '" + name + "' is defined twice");
      defined_[id] = true;
      PC_RETURN_IF_ERROR(Alternatives(id, /*nested=*/false));
      SkipSpace(true);
    }
    for (size_t i = 0; i < names_.size(); ++i) {
      if (!defined_[i]) return InvalidArgument("grammar: rule '" + names_[i] + "' is not defined");
    }
    auto it = ids_.find(std::string(root));
    if (it == ids_.end()) {
      return InvalidArgument("grammar: no root rule '" + std::string(root) + "'");
    }
    return Finish(it->second);
  }

 private:
  Status Error(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgument(fmt::format("grammar: {} at line {} column {}", what, line, col));
  }

  // Blanks and comments; newlines only where `newlines` (GBNF ends a rule at a newline unless
  // the rule continues, which we detect by the next `name ::=` instead).
  void SkipSpace(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  }

  std::string Name() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // True when a `name ::=` starts at the current position (the next rule).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  int32_t RuleId(const std::string& name) {
    auto [it, inserted] = ids_.emplace(name, static_cast<int32_t>(names_.size()));
    if (inserted) {
      names_.push_back(name);
      alts_.emplace_back();
      defined_.push_back(false);
    }
    return it->second;
  }

  int32_t NewRule(const std::string& hint) {
    const int32_t id = RuleId(fmt::format("{}#{}", hint, names_.size()));
    defined_[id] = true;
    return id;
  }

  int32_t ByteSetId(const ByteSet& set) {
    const std::string key = set.to_string();
    auto [it, inserted] = byte_set_ids_.emplace(key, static_cast<int32_t>(byte_sets_.size()));
    if (inserted) byte_sets_.push_back(set);
    return it->second;
  }

  Element Bytes(const ByteSet& set) { return {Element::Kind::kBytes, ByteSetId(set)}; }
  static Element Ref(int32_t rule) { return {Element::Kind::kRule, rule}; }

  // Parses alternatives into rule `id` (up to ')' when nested, else to the next rule).
  Status Alternatives(int32_t id, bool nested) {
    Sequence seq;
    while (true) {
      SkipSpace(nested);
      if (pos_ >= text_.size()) break;
      const char c = text_[pos_];
      if (c == '\n') {
        // A newline ends the rule unless the next line continues it (starts with '|' or is
        // not a new rule).
        SkipSpace(true);
        if (pos_ >= text_.size() || AtRuleStart()) break;
        continue;
      }
      if (c == '|') {
        ++pos_;
        alts_[id].push_back(std::move(seq));
        seq.clear();
        continue;
      }
      if (c == ')') {
        if (!nested) return Error("unbalanced ')'");
        break;
      }
      if (!nested && AtRuleStart()) break;
      std::optional<Sequence> item;
      PC_RETURN_IF_ERROR(Item(&item));
      PC_RETURN_IF_ERROR(Postfix(&*item));
      seq.insert(seq.end(), item->begin(), item->end());
    }
    alts_[id].push_back(std::move(seq));
    return Status::Ok();
  }

  // One primary: literal, class, name, group or '.'.
  Status Item(std::optional<Sequence>* out) {
    const char c = text_[pos_];
    if (c == '"' || c == '\'') {
      std::string bytes;
      PC_RETURN_IF_ERROR(Literal(c, &bytes));
      Sequence seq;
      for (unsigned char b : bytes) {
        ByteSet s;
        s.set(b);
        seq.push_back(Bytes(s));
      }
      *out = std::move(seq);
      return Status::Ok();
    }
    if (c == '[') {
      Element e;
      PC_RETURN_IF_ERROR(CharClass(&e));
      *out = Sequence{e};
      return Status::Ok();
    }
    if (c == '.') {
      ++pos_;
      *out = Sequence{ClassElement({{0, kMaxCodePoint}}, "any")};
      return Status::Ok();
    }
    if (c == '(') {
      ++pos_;
      const int32_t id = NewRule("group");
      PC_RETURN_IF_ERROR(Alternatives(id, /*nested=*/true));
      if (pos_ >= text_.size() || text_[pos_] != ')') return Error("expected ')'");
      ++pos_;
      *out = Sequence{Ref(id)};
      return Status::Ok();
    }
    if (IsNameChar(c)) {
      const std::string name = Name();
      *out = Sequence{Ref(RuleId(name))};
      return Status::Ok();
    }
    return Error(fmt::format("unexpected '{}'", c));
  }

  // Reads one (possibly escaped) code point of a literal or class.
  Status CodePoint(uint32_t* cp) {
    if (pos_ >= text_.size()) return Error("unterminated literal");
    const auto c = static_cast<unsigned char>(text_[pos_]);
    if (c == '\\') {
      if (++pos_ >= text_.size()) return Error("dangling '\\'");
      const char e = text_[pos_++];
      auto hex = [&](int n) -> Status {
        if (const char* why = ReadHexDigits(text_, &pos_, n, cp)) return Error(why);
        return Status::Ok();
      };
      if (const std::optional<uint32_t> control = ControlEscape(e)) {
        *cp = *control;
        return Status::Ok();
      }
      switch (e) {
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        default:
          *cp = static_cast<unsigned char>(e);
          return Status::Ok();
      }
    }
    // A UTF-8 sequence in the grammar text.
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > text_.size()) return Error("invalid UTF-8 in the grammar");
    uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k)
      v = (v << 6) | (static_cast<unsigned char>(text_[pos_ + k]) & 0x3F);
    pos_ += len;
    *cp = v;
    return Status::Ok();
  }

  Status Literal(char quote, std::string* bytes) {
    ++pos_;
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated literal");
      if (text_[pos_] == quote) {
        ++pos_;
        return Status::Ok();
      }
      const bool escaped = text_[pos_] == '\\';
      uint32_t cp = 0;
      const size_t at = pos_;
      PC_RETURN_IF_ERROR(CodePoint(&cp));
      // \xHH in a literal is a byte (GBNF), so that grammars can spell raw UTF-8.
      if (escaped && text_[at + 1] == 'x') {
        bytes->push_back(static_cast<char>(cp));
      } else {
        EncodeUtf8(cp, bytes);
      }
    }
  }

  Status CharClass(Element* out) {
    const size_t start = pos_;
    ++pos_;
    bool negate = false;
    if (pos_ < text_.size() && text_[pos_] == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<CodeRange> ranges;
    while (true) {
      if (pos_ >= text_.size()) return Error("unterminated character class");
      if (text_[pos_] == ']') {
        ++pos_;
        break;
      }
      uint32_t lo = 0;
      PC_RETURN_IF_ERROR(CodePoint(&lo));
      uint32_t hi = lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        PC_RETURN_IF_ERROR(CodePoint(&hi));
      }
      if (hi < lo) return Error("reversed range in a character class");
      ranges.push_back({lo, std::min(hi, kMaxCodePoint)});
    }
    if (negate) ranges = Complement(ranges);
    if (ranges.empty()) return Error("empty character class");
    *out = ClassElement(ranges, std::string(text_.substr(start, pos_ - start)));
    return Status::Ok();
  }

  // A set of code points as one element: a byte set when it is all ASCII, else a rule whose
  // alternatives are the UTF-8 byte sequences of its ranges (shared by identical classes).
  Element ClassElement(const std::vector<CodeRange>& in, const std::string& key) {
    const std::vector<CodeRange> ranges = Normalize(in);
    if (ranges.back().second < 0x80) {
      ByteSet s;
      for (const auto& [lo, hi] : ranges) {
        for (uint32_t b = lo; b <= hi; ++b) s.set(b);
      }
      return Bytes(s);
    }
    std::string canon;
    for (const auto& [lo, hi] : ranges) canon += fmt::format("{:x}-{:x},", lo, hi);
    if (auto it = class_rules_.find(canon); it != class_rules_.end()) return Ref(it->second);
    const int32_t id = NewRule("class");
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (const auto& [lo, hi] : ranges) Utf8Sequences(lo, hi, &seqs);
    // Single-byte sequences merge into one set; multi-byte ones sharing all but the last byte
    // range stay apart (there are few).
    ByteSet ascii;
    for (const auto& seq : seqs) {
      if (seq.size() == 1) {
        for (int b = seq[0].first; b <= seq[0].second; ++b) ascii.set(b);
        continue;
      }
      Sequence alt;
      for (const auto& [lo, hi] : seq) {
        ByteSet s;
        for (int b = lo; b <= hi; ++b) s.set(b);
        alt.push_back(Bytes(s));
      }
      alts_[id].push_back(std::move(alt));
    }
    if (ascii.any()) alts_[id].insert(alts_[id].begin(), Sequence{Bytes(ascii)});
    (void)key;
    class_rules_.emplace(canon, id);
    return Ref(id);
  }

  // The item as one element (wrapped in a rule when it is a sequence).
  Element AsElement(const Sequence& item) {
    if (item.size() == 1) return item[0];
    const int32_t id = NewRule("seq");
    alts_[id].push_back(item);
    return Ref(id);
  }

  // x* as R ::= x R | ()  (right recursion: constant depth in the matcher).
  Element Star(Element x) {
    const int32_t id = NewRule("star");
    alts_[id].push_back({x, Ref(id)});
    alts_[id].push_back({});
    return Ref(id);
  }

  Status Postfix(Sequence* item) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      int min = 0, max = -1;  // max -1: unbounded
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        ++pos_;
        auto number = [&](int* v) -> bool {
          const size_t s = pos_;
          int64_t n = 0;
          while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
            n = n * 10 + (text_[pos_++] - '0');
            if (n > kMaxRepeat) return false;
          }
          *v = static_cast<int>(n);
          return pos_ > s;
        };
        SkipSpace(false);
        if (!number(&min)) return Error("bad repetition count");
        SkipSpace(false);
        max = min;
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
          SkipSpace(false);
          max = -1;
          if (pos_ < text_.size() && text_[pos_] != '}' && !number(&max)) {
            return Error("bad repetition count");
          }
          SkipSpace(false);
        }
        if (pos_ >= text_.size() || text_[pos_] != '}') return Error("expected '}'");
        ++pos_;
        if (max >= 0 && max < min) return Error("repetition {m,n} with n < m");
      } else {
        return Status::Ok();
      }
      const Element x = AsElement(*item);
      Sequence out(min, x);
      if (max < 0) {
        out.push_back(Star(x));
      } else if (max > min) {
        // (x (x (x)?)?)? built from the inside out; each optional is in tail position.
        int32_t inner = -1;
        for (int k = 0; k < max - min; ++k) {
          const int32_t id = NewRule("opt");
          Sequence alt{x};
          if (inner >= 0) alt.push_back(Ref(inner));
          alts_[id].push_back(std::move(alt));
          alts_[id].push_back({});
          inner = id;
        }
        out.push_back(Ref(inner));
      }
      *item = std::move(out);
      SkipSpace(false);
    }
    return Status::Ok();
  }

  Grammar Finish(int32_t root) {
    Grammar g;
    g.byte_sets = std::move(byte_sets_);
    g.rule_names = std::move(names_);
    g.rule_alts.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r) {
      for (const auto& alt : alts_[r]) {
        g.rule_alts[r].push_back(static_cast<int32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), alt.begin(), alt.end());
        g.elements.push_back({Element::Kind::kEnd, 0});
      }
    }
    g.root = root;
    return g;
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
  std::vector<std::vector<Sequence>> alts_;
  std::vector<bool> defined_;
  std::vector<ByteSet> byte_sets_;
  std::map<std::string, int32_t> byte_set_ids_;
  std::map<std::string, int32_t> class_rules_;
};

std::string ByteSetText(const ByteSet& s) {
  if (s.count() == 1) {
    for (int b = 0; b < 256; ++b) {
      if (s[b])
        return b >= 0x20 && b < 0x7F && b != '"' && b != '\\'
                   ? fmt::format("\"{}\"", static_cast<char>(b))
                   : fmt::format("\"\\x{:02X}\"", b);
    }
  }
  std::string out = "[";
  for (int b = 0; b < 256;) {
    if (!s[b]) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s[e + 1]) ++e;
    out += fmt::format("\\x{:02X}", b);
    if (e > b) out += fmt::format("-\\x{:02X}", e);
    b = e + 1;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::ToString() const {
  std::string out;
  for (size_t r = 0; r < rule_alts.size(); ++r) {
    out += rule_names[r] + " ::=";
    for (size_t a = 0; a < rule_alts[r].size(); ++a) {
      if (a > 0) out += " |";
      for (int32_t p = rule_alts[r][a]; elements[p].kind != Element::Kind::kEnd; ++p) {
        const Element& e = elements[p];
        out += " ";
        out +=
            e.kind == Element::Kind::kRule ? rule_names[e.value] : ByteSetText(byte_sets[e.value]);
      }
      if (elements[rule_alts[r][a]].kind == Element::Kind::kEnd) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

std::string EbnfLiteral(std::string_view bytes) {
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string PrefixRuleNames(std::string_view ebnf, std::string_view prefix) {
  std::string out;
  auto is_name = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  for (size_t i = 0; i < ebnf.size();) {
    const char c = ebnf[i];
    if (c == '"' || c == '\'' || c == '[') {
      // A literal or a class, copied with its escapes.
      const char close = c == '[' ? ']' : c;
      size_t j = i + 1;
      while (j < ebnf.size() && ebnf[j] != close) j += ebnf[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, ebnf.size());
      out.append(ebnf.substr(i, j - i));
      i = j;
    } else if (c == '#') {
      while (i < ebnf.size() && ebnf[i] != '\n') ++i;
    } else if (c == '{') {
      // A repetition count, not a name.
      const size_t j = std::min(ebnf.find('}', i), ebnf.size() - 1) + 1;
      out.append(ebnf.substr(i, j - i));
      i = j;
    } else if (is_name(c)) {
      size_t j = i;
      while (j < ebnf.size() && is_name(ebnf[j])) ++j;
      out.append(prefix).append(ebnf.substr(i, j - i));
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return out;
}

StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root) {
  return Parser(text).Run(root);
}

}  // namespace polychip::grammar
