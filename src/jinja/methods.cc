// Python methods on str, list and dict (templates call them as Python would: "x".strip(),
// d.get(k), s.split(sep, 1)), the loop object's methods, the globals transformers provides, and
// Python's two string formatting languages ("%" and str.format).
#include "jinja/methods.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace polychip::jinja::internal {

StatusOr<Bound> Bind(const Args& args, std::initializer_list<const char*> names,
                     const std::string& function) {
  Bound b;
  b.values.resize(names.size());
  b.given.assign(names.size(), false);
  if (args.pos.size() > names.size()) {
    return InvalidArgument(function + "() takes at most " + std::to_string(names.size()) +
                           " argument(s)");
  }
  for (size_t i = 0; i < args.pos.size(); ++i) {
    b.values[i] = args.pos[i];
    b.given[i] = true;
  }
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++i;
    }
    if (i == names.size()) {
      return InvalidArgument(function + "() got an unexpected keyword argument '" + k + "'");
    }
    if (b.given[i]) {
      return InvalidArgument(function + "() got multiple values for argument '" + k + "'");
    }
    b.values[i] = v;
    b.given[i] = true;
  }
  return b;
}

// ---------------------------------------------------------------------------------------------
// Python string helpers

uint32_t PyUpperCp(uint32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xe0 && cp <= 0xfe && cp != 0xf7)) return cp - 32;
  if (cp == 0xff) return 0x178;
  if (cp >= 0x100 && cp <= 0x17f) {
    const bool odd_lower = (cp >= 0x100 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177);
    if (odd_lower && (cp & 1)) return cp - 1;
    if (!odd_lower && ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e)) && !(cp & 1)) {
      return cp - 1;
    }
    return cp;
  }
  if (cp >= 0x3b1 && cp <= 0x3c9 && cp != 0x3c2) return cp - 32;
  if (cp >= 0x430 && cp <= 0x44f) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45f) return cp - 80;
  return cp;
}

uint32_t PyLowerCp(uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if (cp >= 0xc0 && cp <= 0xde && cp != 0xd7) return cp + 32;
  if (cp == 0x178) return 0xff;
  if (cp >= 0x100 && cp <= 0x17f) {
    const bool even_upper = (cp >= 0x100 && cp <= 0x137) || (cp >= 0x14a && cp <= 0x177);
    if (even_upper && !(cp & 1)) return cp + 1;
    if (!even_upper && ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17e)) && (cp & 1)) {
      return cp + 1;
    }
    return cp;
  }
  if (cp >= 0x391 && cp <= 0x3a9 && cp != 0x3a2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42f) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40f) return cp + 80;
  return cp;
}

namespace {

bool IsCased(uint32_t cp) { return PyUpperCp(cp) != cp || PyLowerCp(cp) != cp; }
bool IsUpperCp(uint32_t cp) { return PyLowerCp(cp) != cp; }
bool IsLowerCp(uint32_t cp) { return PyUpperCp(cp) != cp; }
bool IsAlphaCp(uint32_t cp) {
  if (cp < 0x80) return std::isalpha(static_cast<int>(cp));
  return IsCased(cp) || (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x3040 && cp <= 0x30ff) ||
         (cp >= 0xac00 && cp <= 0xd7a3) || cp == 0xdf || cp == 0xaa || cp == 0xba;
}
bool IsDigitCp(uint32_t cp) { return cp >= '0' && cp <= '9'; }

template <typename F>
std::string MapCodepoints(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(static_cast<char>(f(static_cast<uint32_t>(c))));
    return out;
  }
  for (uint32_t cp : DecodeUtf8(s)) AppendUtf8(&out, f(cp));
  return out;
}

// Byte offset -> code point index, for find() and index() on non-ASCII strings.
int64_t CpIndex(std::string_view s, size_t byte) {
  if (IsAscii(s)) return static_cast<int64_t>(byte);
  return static_cast<int64_t>(CodepointCount(s.substr(0, byte)));
}

std::string Strip(std::string_view s, const Value* chars, bool left, bool right) {
  const auto cps = DecodeUtf8(s);
  std::vector<uint32_t> set;
  const bool ws = !chars || chars->is_none();
  if (!ws) set = DecodeUtf8(chars->Str());
  auto strip = [&](uint32_t cp) {
    return ws ? IsPySpace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) AppendUtf8(&out, cps[i]);
  return out;
}

// str.split / str.rsplit.
std::vector<std::string> Split(const std::string& s, const Value* sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    const auto cps = DecodeUtf8(s);
    std::vector<std::pair<size_t, size_t>> words;  // code point ranges
    if (!from_right) {
      size_t i = 0;
      while (i < cps.size()) {
        while (i < cps.size() && IsPySpace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = cps.size();
          words.emplace_back(i, e);
          break;
        }
        size_t j = i;
        while (j < cps.size() && !IsPySpace(cps[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = cps.size();
      while (i > 0) {
        while (i > 0 && IsPySpace(cps[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, i);
          break;
        }
        size_t j = i;
        while (j > 0 && !IsPySpace(cps[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto [b, e] : words) {
      std::string w;
      for (size_t k = b; k < e; ++k) AppendUtf8(&w, cps[k]);
      out.push_back(std::move(w));
    }
    return out;
  }
  const std::string& d = sep->str();
  if (!from_right) {
    size_t start = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t p = s.find(d, start);
      if (p == std::string::npos) break;
      out.push_back(s.substr(start, p - start));
      start = p + d.size();
      ++n;
    }
    out.push_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    if (end < d.size()) break;
    const size_t p = s.rfind(d, end - d.size());
    if (p == std::string::npos) break;
    out.push_back(s.substr(p + d.size(), end - p - d.size()));
    end = p;
    ++n;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Value StringList(std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) items.emplace_back(std::move(p));
  return Value::List(std::move(items));
}

std::string Replace(const std::string& s, const std::string& old, const std::string& rep,
                    int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `rep` around every character
    const auto cps = DecodeUtf8(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) {
        out += rep;
        ++n;
      }
      if (i < cps.size()) AppendUtf8(&out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += rep;
    start = p + old.size();
    ++n;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string Pad(const std::string& s, int64_t width, char align, const std::string& fill) {
  const auto len = static_cast<int64_t>(CodepointCount(s));
  if (width <= len) return s;
  const int64_t pad = width - len;
  int64_t left = 0;
  if (align == '>') left = pad;
  if (align == '^') left = pad / 2;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < pad - left; ++i) out += fill;
  return out;
}

}  // namespace

std::string PyLower(std::string_view s) { return MapCodepoints(s, PyLowerCp); }

std::optional<int64_t> ParsePyInt(std::string_view s, int base) {
  std::string t = Strip(s, nullptr, true, true);
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty()) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if (t[0] == '+' || t[0] == '-') {
    neg = t[0] == '-';
    i = 1;
  }
  if ((base == 16 || base == 8 || base == 2 || base == 0) && i + 1 < t.size() && t[i] == '0') {
    const char p = static_cast<char>(t[i + 1] | 0x20);
    if ((p == 'x' && (base == 16 || base == 0)) || (p == 'o' && (base == 8 || base == 0)) ||
        (p == 'b' && (base == 2 || base == 0))) {
      base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
      i += 2;
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || i >= t.size()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const std::string digits = t.substr(i);
  if (!std::isalnum(static_cast<unsigned char>(digits[0]))) return std::nullopt;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (*end != 0 || errno) return std::nullopt;
  return neg ? -v : v;
}

std::optional<double> ParsePyFloat(std::string_view s) {
  std::string t = Strip(s, nullptr, true, true);
  if (t.empty()) return std::nullopt;
  std::string lower = PyLower(t);
  if (lower == "nan" || lower == "+nan" || lower == "-nan") return std::nan("");
  if (lower == "inf" || lower == "+inf" || lower == "infinity" || lower == "+infinity") {
    return HUGE_VAL;
  }
  if (lower == "-inf" || lower == "-infinity") return -HUGE_VAL;
  for (char c : t) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
          c == '+' || c == '-' || c == '_')) {
      return std::nullopt;
    }
  }
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (*end != 0) return std::nullopt;
  return d;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  const auto cps = DecodeUtf8(s);
  std::string cur;
  for (size_t i = 0; i < cps.size(); ++i) {
    const uint32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d ||
                     c == 0x1e || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      AppendUtf8(&cur, c);
      continue;
    }
    if (keepends) AppendUtf8(&cur, c);
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') {
      if (keepends) cur.push_back('\n');
      ++i;
    }
    out.push_back(std::move(cur));
    cur.clear();
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::string AsciiEscapeJson(std::string_view json) {
  std::string out;
  for (uint32_t cp : DecodeUtf8(json)) {
    char buf[16];
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x10000) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      out += buf;
    } else {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      out += buf;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Formatting

namespace {

struct Spec {
  std::string fill = " ";
  char align = 0;
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

bool ParseSpec(std::string_view s, Spec* spec) {
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  const auto cps = DecodeUtf8(s);
  if (cps.size() >= 2 && cps[1] < 0x80 && is_align(static_cast<char>(cps[1]))) {
    spec->fill.clear();
    AppendUtf8(&spec->fill, cps[0]);
    spec->align = static_cast<char>(cps[1]);
    std::string first;
    AppendUtf8(&first, cps[0]);
    i = first.size() + 1;
  } else if (!s.empty() && is_align(s[0])) {
    spec->align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec->sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    spec->alt = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    spec->zero = true;
    ++i;
  }
  if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    spec->width = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      spec->width = spec->width * 10 + (s[i++] - '0');
      if (spec->width > (1 << 20)) return false;  // refused rather than padded (see below)
    }
  }
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec->grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    spec->precision = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
      spec->precision = spec->precision * 10 + (s[i++] - '0');
      if (spec->precision > (1 << 20)) return false;
    }
  }
  if (i < s.size()) spec->type = s[i++];
  return i == s.size();
}

std::string Group(const std::string& digits, char sep) {
  if (!sep) return digits;
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i && (n - i) % 3 == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

// format(value, spec) for str, int, float and bool.
StatusOr<std::string> FormatValue(const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return v.Str();
  Spec spec;
  if (!ParseSpec(spec_text, &spec)) return InvalidArgument("Invalid format specifier");
  std::string body;
  std::string sign;
  bool numeric = false;
  if (v.is_string()) {
    if (spec.type && spec.type != 's') {
      return InvalidArgument(std::string("Unknown format code '") + spec.type +
                             "' for object of type 'str'");
    }
    body = v.str();
    if (spec.precision >= 0) {
      const auto cps = DecodeUtf8(body);
      if (static_cast<int64_t>(cps.size()) > spec.precision) {
        body.clear();
        for (int64_t i = 0; i < spec.precision; ++i) AppendUtf8(&body, cps[i]);
      }
    }
  } else if (v.is_number()) {
    numeric = true;
    char type = spec.type;
    const bool as_int = !v.is_float() && (type == 0 || type == 'd' || type == 'x' || type == 'X' ||
                                          type == 'o' || type == 'b' || type == 'c' || type == 'n');
    if (as_int) {
      const int64_t i = v.AsInt();
      const uint64_t mag = i < 0 ? 0 - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
      if (i < 0)
        sign = "-";
      else if (spec.sign == '+')
        sign = "+";
      else if (spec.sign == ' ')
        sign = " ";
      char buf[80];
      switch (type) {
        case 'x':
          std::snprintf(buf, sizeof(buf), "%llx", (unsigned long long)mag);
          break;
        case 'X':
          std::snprintf(buf, sizeof(buf), "%llX", (unsigned long long)mag);
          break;
        case 'o':
          std::snprintf(buf, sizeof(buf), "%llo", (unsigned long long)mag);
          break;
        case 'b': {
          std::string bits;
          uint64_t m = mag;
          do {
            bits.insert(bits.begin(), static_cast<char>('0' + (m & 1)));
            m >>= 1;
          } while (m);
          std::snprintf(buf, sizeof(buf), "%s", bits.c_str());
          break;
        }
        case 'c': {
          std::string c;
          AppendUtf8(&c, static_cast<uint32_t>(mag));
          return Pad(c, spec.width, spec.align ? spec.align : '<', spec.fill);
        }
        default:
          std::snprintf(buf, sizeof(buf), "%llu", (unsigned long long)mag);
      }
      body = Group(buf, spec.grouping);
      if (spec.alt && (type == 'x' || type == 'X' || type == 'o' || type == 'b')) {
        sign += std::string("0") + type;
      }
    } else {
      double d = v.AsDouble();
      if (std::signbit(d) && !std::isnan(d)) {
        sign = "-";
        d = -d;
      } else if (spec.sign == '+') {
        sign = "+";
      } else if (spec.sign == ' ') {
        sign = " ";
      }
      if (!type) {
        body = spec.precision >= 0 ? "" : FormatFloat(d);
        if (spec.precision >= 0) {
          char buf[512];
          std::snprintf(buf, sizeof(buf), "%.*g",
                        static_cast<int>(std::max<int64_t>(1, spec.precision)), d);
          body = buf;
          if (body.find_first_of(".en") == std::string::npos) body += ".0";
        }
      } else {
        if (std::string_view("eEfFgG%").find(type) == std::string_view::npos) {
          return InvalidArgument(std::string("Unknown format code '") + type +
                                 "' for object of type 'float'");
        }
        const int prec = static_cast<int>(spec.precision >= 0 ? spec.precision : 6);
        char fmt[16];
        const char ctype = type == '%' ? 'f' : type;
        std::snprintf(fmt, sizeof(fmt), "%%%s.%d%c", spec.alt ? "#" : "", prec, ctype);
        char buf[512];
        std::snprintf(buf, sizeof(buf), fmt, type == '%' ? d * 100 : d);
        body = buf;
        if (type == '%') body += "%";
      }
      if (spec.grouping) {
        const size_t dot = body.find_first_of(".e%");
        body = Group(body.substr(0, dot), spec.grouping) +
               (dot == std::string::npos ? "" : body.substr(dot));
      }
    }
  } else {
    return InvalidArgument("unsupported format string passed to " + v.TypeName() + ".__format__");
  }
  if (numeric && (spec.zero || spec.align == '=') && spec.width >= 0) {
    const std::string fill = spec.align == '=' ? spec.fill : "0";
    std::string padded = body;
    const auto total = static_cast<int64_t>(sign.size() + CodepointCount(body));
    for (int64_t i = total; i < spec.width; ++i) padded = fill + padded;
    if (!spec.align || spec.align == '=') return sign + padded;
  }
  const char align = spec.align ? spec.align : (numeric ? '>' : '<');
  if (align == '=') return sign + body;
  return Pad(sign + body, spec.width, align, spec.fill);
}

}  // namespace

StatusOr<std::string> PercentFormat(const std::string& fmt, const Value& args, Renderer& r) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.list().items;
  } else if (args.is_dict()) {
    mapping = &args;
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) return InvalidArgument("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) {
        return InvalidArgument("format requires a mapping");
      }
      const Value* v = mapping->dict().Find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (!v) return InvalidArgument("KeyError: " + fmt.substr(i + 1, close - i - 1));
      keyed = *v;
      arg = &keyed;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      flags.push_back(fmt[i++]);
    }
    int64_t width = -1, precision = -1;
    // Widths and precisions past a million are refused (Python: "width too big" past
    // ssize_t); padding that large would only burn the output budget.
    constexpr int64_t kMaxWidth = 1 << 20;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
      width = std::max<int64_t>(width, 0) * 10 + (fmt[i++] - '0');
      if (width > kMaxWidth) return InvalidArgument("width too big");
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        precision = precision * 10 + (fmt[i++] - '0');
        if (precision > kMaxWidth) return InvalidArgument("precision too big");
      }
    }
    if (i >= fmt.size()) return InvalidArgument("incomplete format");
    const char type = fmt[i];
    if (!arg) {
      if (next >= positional.size()) {
        return InvalidArgument("not enough arguments for format string");
      }
      arg = &positional[next++];
    }
    std::string piece;
    const bool left = flags.find('-') != std::string::npos;
    if (type == 's' || type == 'r' || type == 'a') {
      piece = type == 's' ? arg->Str() : arg->Repr();
      if (precision >= 0) {
        const auto cps = DecodeUtf8(piece);
        if (static_cast<int64_t>(cps.size()) > precision) {
          piece.clear();
          for (int64_t k = 0; k < precision; ++k) AppendUtf8(&piece, cps[k]);
        }
      }
      piece = Pad(piece, width, left ? '<' : '>', " ");
    } else if (std::string_view("diouxXeEfFgGc").find(type) != std::string_view::npos) {
      if (!arg->is_number()) {
        return r.TypeError(
            std::string("%") + type + " format: a real number is required, not " + arg->TypeName(),
            *arg);
      }
      std::string spec;
      if (left)
        spec += "<";
      else if (flags.find('0') != std::string::npos)
        spec += "0";
      if (flags.find('+') != std::string::npos)
        spec.insert(spec.size() - (spec == "0" ? 1 : 0), "+");
      else if (flags.find(' ') != std::string::npos)
        spec.insert(spec.size() - (spec == "0" ? 1 : 0), " ");
      if (flags.find('#') != std::string::npos) spec += "#";
      if (width >= 0) spec += std::to_string(width);
      Value num = *arg;
      char t = type;
      if (t == 'i' || t == 'u') t = 'd';
      if (t == 'd' || t == 'x' || t == 'X' || t == 'o') {
        if (num.is_float() &&
            (!std::isfinite(num.as_float()) || std::fabs(num.as_float()) >= 9.2e18)) {
          return InvalidArgument("cannot convert float to integer");
        }
        num = Value(num.is_float() ? static_cast<int64_t>(num.as_float()) : num.AsInt());
      } else if (t != 'c') {
        num = Value(num.AsDouble());
        spec += "." + std::to_string(precision >= 0 ? precision : 6);
      }
      spec.push_back(t);
      PC_ASSIGN_OR_RETURN(piece, FormatValue(num, spec));
    } else {
      return InvalidArgument(std::string("unsupported format character '") + type + "'");
    }
    out += piece;
    PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  if (!mapping && next < positional.size()) {
    return InvalidArgument("not all arguments converted during string formatting");
  }
  return out;
}

namespace {

// str.format: {}, {0}, {name}, {0.attr}, {0[key]}, !r/!s conversions and format specs.
StatusOr<std::string> StrFormat(const std::string& fmt, const Args& args, Renderer& r) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return InvalidArgument("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    // The field runs to the matching '}' (a spec may hold one nested level, unsupported here).
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos)
      return InvalidArgument("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    char conversion = 0;
    const size_t colon = field.find(':');
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    const size_t bang = field.find('!');
    if (bang != std::string::npos) {
      if (bang + 2 != field.size()) return InvalidArgument("invalid conversion in format string");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    size_t name_end = field.find_first_of(".[");
    const std::string head = field.substr(0, name_end);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.pos.size()) {
        return InvalidArgument("Replacement index " + std::to_string(auto_index) +
                               " out of range for positional args tuple");
      }
      v = args.pos[auto_index++];
    } else if (std::all_of(head.begin(), head.end(), ::isdigit)) {
      const auto idx = ParsePyInt(head, 10);
      if (!idx || *idx >= static_cast<int64_t>(args.pos.size())) {
        return InvalidArgument("Replacement index " + head +
                               " out of range for positional args tuple");
      }
      v = args.pos[static_cast<size_t>(*idx)];
    } else {
      bool found = false;
      for (const auto& [k, val] : args.kw) {
        if (k == head) {
          v = val;
          found = true;
        }
      }
      if (!found) return InvalidArgument("KeyError: '" + head + "'");
    }
    while (name_end != std::string::npos && name_end < field.size()) {
      if (field[name_end] == '.') {
        size_t e = field.find_first_of(".[", name_end + 1);
        PC_ASSIGN_OR_RETURN(v, r.GetAttr(v, field.substr(name_end + 1, e - name_end - 1)));
        name_end = e;
      } else {
        const size_t e = field.find(']', name_end);
        if (e == std::string::npos) return InvalidArgument("Missing ']' in format string");
        const std::string key = field.substr(name_end + 1, e - name_end - 1);
        Value k(key);
        if (!key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
          if (auto i = ParsePyInt(key, 10)) k = Value(*i);
        }
        PC_ASSIGN_OR_RETURN(v, r.GetItem(v, k));
        name_end = e + 1;
      }
    }
    if (conversion == 'r' || conversion == 'a')
      v = Value(v.Repr());
    else if (conversion == 's')
      v = Value(v.Str());
    else if (conversion)
      return InvalidArgument("Unknown conversion specifier");
    PC_ASSIGN_OR_RETURN(std::string piece, FormatValue(v, spec));
    out += piece;
    PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  return out;
}

const char* const kStrMethods[] = {
    "capitalize", "casefold",   "center",       "count",        "endswith",  "expandtabs",
    "find",       "format",     "index",        "isalnum",      "isalpha",   "isascii",
    "isdecimal",  "isdigit",    "isidentifier", "islower",      "isnumeric", "isprintable",
    "isspace",    "istitle",    "isupper",      "join",         "ljust",     "lower",
    "lstrip",     "partition",  "removeprefix", "removesuffix", "replace",   "rfind",
    "rindex",     "rjust",      "rpartition",   "rsplit",       "rstrip",    "split",
    "splitlines", "startswith", "strip",        "swapcase",     "title",     "upper",
    "zfill",      "encode",     "format_map",   "maketrans",    "translate"};
const char* const kListSafe[] = {"copy", "count", "index"};
const char* const kListUnsafe[] = {"append", "clear",  "extend",  "insert",
                                   "pop",    "remove", "reverse", "sort"};
const char* const kDictSafe[] = {"copy", "fromkeys", "get", "items", "keys", "values"};
const char* const kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
bool In(const char* const (&names)[N], std::string_view name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

}  // namespace

int MethodSafety(const Value& self, std::string_view name) {
  if (self.is_string()) return In(kStrMethods, name) ? 1 : 0;
  if (self.is_list()) {
    if (self.is_tuple()) return (name == "count" || name == "index") ? 1 : 0;
    if (In(kListSafe, name)) return 1;
    return In(kListUnsafe, name) ? 2 : 0;
  }
  if (self.is_dict()) {
    if (In(kDictSafe, name)) return 1;
    return In(kDictUnsafe, name) ? 2 : 0;
  }
  if (self.is_float() && name == "is_integer") return 1;
  return 0;
}

namespace {

StatusOr<Value> StrMethod(Renderer& r, const Value& self, const std::string& name,
                          const Args& args) {
  const std::string& s = self.str();
  auto bind = [&](std::initializer_list<const char*> names) { return Bind(args, names, name); };
  auto need_str = [&](const Value& v, const char* what) -> Status {
    if (!v.is_string()) {
      return r.TypeError(std::string(what) + " must be str, not " + v.TypeName(), v);
    }
    return Status::Ok();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"chars"}));
    if (b.has(0) && !b[0].is_none()) PC_RETURN_IF_ERROR(need_str(b[0], "strip arg"));
    return Value(Strip(s, b.has(0) ? &b[0] : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"sep", "maxsplit"}));
    int64_t maxsplit = -1;
    if (b.has(1)) {
      if (!b[1].is_int() && !b[1].is_bool()) return InvalidArgument("maxsplit must be an int");
      maxsplit = b[1].AsInt();
    }
    if (b.has(0) && !b[0].is_none()) {
      PC_RETURN_IF_ERROR(need_str(b[0], "sep"));
      if (b[0].str().empty()) return InvalidArgument("empty separator");
    }
    auto parts = Split(s, b.has(0) ? &b[0] : nullptr, maxsplit, name == "rsplit");
    PC_RETURN_IF_ERROR(r.Step(parts.size()));
    return StringList(std::move(parts));
  }
  if (name == "splitlines") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"keepends"}));
    return StringList(PySplitLines(s, b.Truthy(0, false)));
  }
  if (name == "startswith" || name == "endswith") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"prefix", "start", "end"}));
    if (!b.has(0)) return InvalidArgument(name + "() takes at least 1 argument");
    std::vector<Value> options;
    if (b[0].is_tuple()) {
      options = b[0].list().items;
    } else {
      PC_RETURN_IF_ERROR(need_str(b[0], (name + " first arg").c_str()));
      options.push_back(b[0]);
    }
    std::string_view text = s;
    if (b.has(1) || b.has(2)) {
      const auto cps = DecodeUtf8(s);
      const auto n = static_cast<int64_t>(cps.size());
      auto clamp = [&](const Value& v, int64_t dflt) {
        if (v.is_none() || (!v.is_int() && !v.is_bool())) return dflt;
        int64_t x = v.AsInt();
        if (x < 0) x += n;
        return std::clamp<int64_t>(x, 0, n);
      };
      const int64_t from = b.has(1) ? clamp(b[1], 0) : 0;
      const int64_t to = b.has(2) ? clamp(b[2], n) : n;
      std::string sub;
      for (int64_t i = from; i < to; ++i) AppendUtf8(&sub, cps[i]);
      bool hit = false;
      for (const Value& o : options) {
        PC_RETURN_IF_ERROR(need_str(o, "tuple item"));
        const std::string& p = o.str();
        if (from > to) continue;
        if (name == "startswith"
                ? sub.compare(0, p.size(), p) == 0 && sub.size() >= p.size()
                : sub.size() >= p.size() && sub.compare(sub.size() - p.size(), p.size(), p) == 0) {
          hit = true;
        }
      }
      return Value(hit);
    }
    for (const Value& o : options) {
      PC_RETURN_IF_ERROR(need_str(o, "tuple item"));
      const std::string& p = o.str();
      if (text.size() < p.size()) continue;
      if (name == "startswith" ? text.compare(0, p.size(), p) == 0
                               : text.compare(text.size() - p.size(), p.size(), p) == 0) {
        return Value(true);
      }
    }
    return Value(false);
  }
  if (name == "replace") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"old", "new", "count"}));
    if (!b.has(0) || !b.has(1)) return InvalidArgument("replace() takes at least 2 arguments");
    PC_RETURN_IF_ERROR(need_str(b[0], "replace() argument 1"));
    PC_RETURN_IF_ERROR(need_str(b[1], "replace() argument 2"));
    int64_t count = -1;
    if (b.has(2) && !b[2].is_none()) count = b[2].AsInt();
    std::string out = Replace(s, b[0].str(), b[1].str(), count);
    PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
    return Value(std::move(out));
  }
  if (name == "upper") {
    std::string out = MapCodepoints(s, PyUpperCp);
    // The one common letter whose capital is two letters.
    for (size_t p = out.find("\xc3\x9f"); p != std::string::npos; p = out.find("\xc3\x9f", p)) {
      out.replace(p, 2, "SS");
    }
    return Value(std::move(out));
  }
  if (name == "lower" || name == "casefold") return Value(MapCodepoints(s, PyLowerCp));
  if (name == "swapcase") {
    return Value(
        MapCodepoints(s, [](uint32_t c) { return IsUpperCp(c) ? PyLowerCp(c) : PyUpperCp(c); }));
  }
  if (name == "capitalize" || name == "title") {
    std::string out;
    bool prev_cased = false;
    bool first = true;
    for (uint32_t cp : DecodeUtf8(s)) {
      if (name == "capitalize") {
        AppendUtf8(&out, first ? PyUpperCp(cp) : PyLowerCp(cp));
      } else {
        AppendUtf8(&out, prev_cased ? PyLowerCp(cp) : PyUpperCp(cp));
        prev_cased = IsCased(cp);
      }
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"sub", "start", "end"}));
    if (!b.has(0)) return InvalidArgument(name + "() takes at least 1 argument");
    PC_RETURN_IF_ERROR(need_str(b[0], "must be str"));
    const std::string& sub = b[0].str();
    // Bounds are code point indices; resolved to a byte range.
    const auto cps_n = static_cast<int64_t>(CodepointCount(s));
    auto clamp = [&](const Bound& bb, size_t i, int64_t dflt) {
      if (!bb.has(i) || bb[i].is_none() || (!bb[i].is_int() && !bb[i].is_bool())) return dflt;
      int64_t x = bb[i].AsInt();
      if (x < 0) x += cps_n;
      return std::clamp<int64_t>(x, 0, cps_n);
    };
    const int64_t from = clamp(b, 1, 0), to = clamp(b, 2, cps_n);
    auto byte_of = [&](int64_t cp_index) -> size_t {
      if (IsAscii(s)) return static_cast<size_t>(cp_index);
      size_t byte = 0;
      for (int64_t k = 0; k < cp_index && byte < s.size(); ++k) {
        ++byte;
        while (byte < s.size() && (static_cast<unsigned char>(s[byte]) & 0xc0) == 0x80) ++byte;
      }
      return byte;
    };
    const size_t bf = byte_of(from), bt = std::max(bf, byte_of(to));
    const std::string_view window = std::string_view(s).substr(bf, bt - bf);
    if (name == "count") {
      if (from > to) return Value(int64_t{0});
      if (sub.empty()) return Value(static_cast<int64_t>(CodepointCount(window)) + 1);
      int64_t n = 0;
      for (size_t p = window.find(sub); p != std::string_view::npos;
           p = window.find(sub, p + sub.size())) {
        ++n;
      }
      return Value(n);
    }
    size_t p = from > to ? std::string_view::npos
                         : (name[0] == 'r' ? window.rfind(sub) : window.find(sub));
    if (p == std::string_view::npos) {
      if (name == "index" || name == "rindex") return InvalidArgument("substring not found");
      return Value(int64_t{-1});
    }
    return Value(CpIndex(s, bf + p));
  }
  if (name == "join") {
    if (args.pos.size() != 1) return InvalidArgument("join() takes exactly one argument");
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, r.Iterate(args.pos[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return InvalidArgument("sequence item " + std::to_string(i) + ": expected str instance, " +
                               items[i].TypeName() + " found");
      }
      if (i) out += s;
      out += items[i].str();
      PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
    }
    return Value(std::move(out));
  }
  if (name == "format") {
    PC_ASSIGN_OR_RETURN(std::string out, StrFormat(s, args, r));
    return Value(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    if (args.pos.size() != 1) return InvalidArgument(name + "() takes exactly one argument");
    PC_RETURN_IF_ERROR(need_str(args.pos[0], (name + "() argument").c_str()));
    const std::string& a = args.pos[0].str();
    if (name == "removeprefix" && s.compare(0, a.size(), a) == 0 && s.size() >= a.size()) {
      return Value(s.substr(a.size()));
    }
    if (name == "removesuffix" && !a.empty() && s.size() >= a.size() &&
        s.compare(s.size() - a.size(), a.size(), a) == 0) {
      return Value(s.substr(0, s.size() - a.size()));
    }
    return Value(s);
  }
  if (name == "partition" || name == "rpartition") {
    if (args.pos.size() != 1) return InvalidArgument(name + "() takes exactly one argument");
    PC_RETURN_IF_ERROR(need_str(args.pos[0], "sep"));
    const std::string& sep = args.pos[0].str();
    if (sep.empty()) return InvalidArgument("empty separator");
    const size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos) {
      return name == "partition" ? Value::List({Value(s), Value(""), Value("")}, true)
                                 : Value::List({Value(""), Value(""), Value(s)}, true);
    }
    return Value::List({Value(s.substr(0, p)), Value(sep), Value(s.substr(p + sep.size()))}, true);
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"width", "fillchar"}));
    if (!b.has(0) || (!b[0].is_int() && !b[0].is_bool())) {
      return InvalidArgument(name + "() requires an integer width");
    }
    const int64_t width = b[0].AsInt();
    PC_RETURN_IF_ERROR(r.CheckSize(static_cast<size_t>(std::max<int64_t>(width, 0))));
    const std::string fill = b.has(1) ? b[1].Str() : " ";
    const auto len = static_cast<int64_t>(CodepointCount(s));
    if (width <= len) return Value(s);
    if (name == "zfill") {
      const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
      return Value((sign ? s.substr(0, 1) : "") + std::string(width - len, '0') +
                   (sign ? s.substr(1) : s));
    }
    if (name == "center") {
      const int64_t marg = width - len;
      const int64_t left = marg / 2 + (marg & width & 1);
      std::string out;
      for (int64_t i = 0; i < left; ++i) out += fill;
      out += s;
      for (int64_t i = 0; i < marg - left; ++i) out += fill;
      return Value(std::move(out));
    }
    return Value(Pad(s, width, name == "ljust" ? '<' : '>', fill));
  }
  if (name == "expandtabs") {
    PC_ASSIGN_OR_RETURN(Bound b, bind({"tabsize"}));
    const int64_t tab = b.has(0) ? std::clamp<int64_t>(b[0].AsInt(), 0, 1024) : 8;
    std::string out;
    int64_t col = 0;
    for (uint32_t cp : DecodeUtf8(s)) {
      if (cp == '\t') {
        if (tab > 0) {
          const int64_t n = tab - col % tab;
          out.append(static_cast<size_t>(n), ' ');
          col += n;
        }
      } else {
        AppendUtf8(&out, cp);
        col = (cp == '\n' || cp == '\r') ? 0 : col + 1;
      }
    }
    return Value(std::move(out));
  }
  if (name.rfind("is", 0) == 0) {
    const auto cps = DecodeUtf8(s);
    auto all = [&](auto pred) { return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred); };
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric")
      return Value(all(IsDigitCp));
    if (name == "isalpha") return Value(all(IsAlphaCp));
    if (name == "isalnum") {
      return Value(all([](uint32_t c) { return IsAlphaCp(c) || IsDigitCp(c); }));
    }
    if (name == "isspace") return Value(all(IsPySpace));
    if (name == "isascii") return Value(IsAscii(s));
    if (name == "isprintable") {
      return Value(std::all_of(cps.begin(), cps.end(), [](uint32_t c) {
        return !(c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0xa0));
      }));
    }
    if (name == "isidentifier") {
      return Value(!cps.empty() && !IsDigitCp(cps[0]) &&
                   all([](uint32_t c) { return c == '_' || IsAlphaCp(c) || IsDigitCp(c); }));
    }
    if (name == "islower" || name == "isupper") {
      bool any_cased = false;
      for (uint32_t c : cps) {
        if (name == "islower" ? IsUpperCp(c) : IsLowerCp(c)) return Value(false);
        if (IsCased(c)) any_cased = true;
      }
      return Value(any_cased);
    }
    if (name == "istitle") {
      bool prev_cased = false, any = false;
      for (uint32_t c : cps) {
        if (IsUpperCp(c)) {
          if (prev_cased) return Value(false);
          prev_cased = any = true;
        } else if (IsLowerCp(c)) {
          if (!prev_cased) return Value(false);
          prev_cased = any = true;
        } else {
          prev_cased = false;
        }
      }
      return Value(any);
    }
  }
  return InvalidArgument("str." + name + "() is not supported");
}

StatusOr<Value> ListMethod(const Value& self, const std::string& name, const Args& args) {
  const auto& items = self.list().items;
  if (name == "copy") return Value::List(items);
  if (name == "count") {
    if (args.pos.size() != 1) return InvalidArgument("count() takes exactly one argument");
    int64_t n = 0;
    for (const Value& v : items) n += Equal(v, args.pos[0]) ? 1 : 0;
    return Value(n);
  }
  if (name == "index") {
    if (args.pos.empty()) return InvalidArgument("index() takes at least 1 argument");
    for (size_t i = 0; i < items.size(); ++i) {
      if (Equal(items[i], args.pos[0])) return Value(static_cast<int64_t>(i));
    }
    return InvalidArgument(args.pos[0].Repr() + " is not in list");
  }
  return InvalidArgument("list." + name + "() is not supported");
}

StatusOr<Value> DictMethod(const Value& self, const std::string& name, const Args& args) {
  const auto& d = self.dict();
  if (name == "get") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"key", "default"}, "get"));
    if (!b.has(0)) return InvalidArgument("get expected at least 1 argument, got 0");
    if (const Value* v = d.Find(b[0])) return *v;
    return b.has(1) ? b[1] : Value::None();
  }
  if (name == "items" || name == "keys" || name == "values") {
    if (!args.pos.empty() || !args.kw.empty()) {
      return InvalidArgument(name + "() takes no arguments");
    }
    std::vector<Value> out;
    out.reserve(d.items.size());
    for (const auto& [k, v] : d.items) {
      if (name == "items")
        out.push_back(Value::List({k, v}, true));
      else
        out.push_back(name == "keys" ? k : v);
    }
    return Value::Iter(std::move(out), name == "items"  ? "dict_items"
                                       : name == "keys" ? "dict_keys"
                                                        : "dict_values");
  }
  if (name == "copy") return self;
  return InvalidArgument("dict." + name + "() is not supported");
}

}  // namespace

StatusOr<Value> Renderer::CallMethod(const Value& self, const std::string& name, const Args& args) {
  PC_RETURN_IF_ERROR(Step());
  if (self.is_loop()) {
    LoopState& s = self.loop();
    if (name == "cycle") {
      if (args.pos.empty()) return InvalidArgument("no items for cycling given");
      return args.pos[s.index0 % args.pos.size()];
    }
    if (name == "changed") {
      const Value now = Value::List(args.pos, true);
      const bool changed = !s.has_changed || !Equal(now, s.changed_last);
      s.has_changed = true;
      s.changed_last = now;
      return Value(changed);
    }
  }
  if (self.is_string()) return StrMethod(*this, self, name, args);
  if (self.is_list()) return ListMethod(self, name, args);
  if (self.is_dict()) return DictMethod(self, name, args);
  if (self.is_float() && name == "is_integer") {
    return Value(std::isfinite(self.as_float()) && std::trunc(self.as_float()) == self.as_float());
  }
  return InvalidArgument("'" + self.TypeName() + "' object has no method '" + name + "'");
}

// ---------------------------------------------------------------------------------------------
// Globals

bool Renderer::IsGlobal(std::string_view name) const {
  return name == "range" || name == "dict" || name == "namespace" || name == "raise_exception" ||
         name == "strftime_now";
}

StatusOr<Value> Renderer::CallGlobal(const std::string& name, const Args& args) {
  if (name == "raise_exception") {
    // The template refuses the conversation: its message is the error.
    return InvalidArgument(args.pos.empty() ? std::string() : args.pos[0].Str());
  }
  if (name == "range") {
    if (!args.kw.empty()) return InvalidArgument("range() takes no keyword arguments");
    if (args.pos.empty() || args.pos.size() > 3) {
      return InvalidArgument("range expected 1 to 3 arguments");
    }
    int64_t v[3] = {0, 0, 1};
    for (const Value& a : args.pos) {
      if (!a.is_int() && !a.is_bool()) {
        return TypeError("'" + a.TypeName() + "' object cannot be interpreted as an integer", a);
      }
    }
    if (args.pos.size() == 1) {
      v[1] = args.pos[0].AsInt();
    } else {
      v[0] = args.pos[0].AsInt();
      v[1] = args.pos[1].AsInt();
      if (args.pos.size() == 3) v[2] = args.pos[2].AsInt();
    }
    if (v[2] == 0) return InvalidArgument("range() arg 3 must not be zero");
    // The sandbox caps ranges (MAX_RANGE = 100000), which also bounds the work here.
    const __int128 span = static_cast<__int128>(v[1]) - v[0];
    const __int128 count128 = v[2] > 0 ? (span > 0 ? (span + v[2] - 1) / v[2] : 0)
                                       : (span < 0 ? (-span + (-static_cast<__int128>(v[2])) - 1) /
                                                         (-static_cast<__int128>(v[2]))
                                                   : 0);
    const auto count = static_cast<double>(count128);
    if (count > 100000) {
      return InvalidArgument(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    PC_RETURN_IF_ERROR(Step(static_cast<uint64_t>(count)));
    std::vector<Value> out;
    // Counted rather than stepped, so that a step near the int64 edge cannot overflow.
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k)
      out.emplace_back(static_cast<int64_t>(v[0] + static_cast<__int128>(k) * v[2]));
    return Value::List(std::move(out));
  }
  if (name == "dict" || name == "namespace") {
    DictData d;
    if (args.pos.size() > 1) return InvalidArgument(name + " expected at most 1 argument");
    if (!args.pos.empty()) {
      const Value& init = args.pos[0];
      if (init.is_dict()) {
        d = init.dict();
      } else {
        PC_ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(init));
        for (const Value& p : pairs) {
          PC_ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(p));
          if (kv.size() != 2) {
            return InvalidArgument("dictionary update sequence element has wrong length");
          }
          d.Set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& [k, v] : args.kw) d.Set(Value(k), v);
    if (name == "dict") return Value::Dict(std::move(d));
    auto ns = std::make_shared<NamespaceData>();
    ns->attrs = std::move(d);
    TrackNamespace(ns);
    return Value(ns);
  }
  if (name == "strftime_now") {
    if (args.pos.size() != 1 || !args.pos[0].is_string()) {
      return InvalidArgument("strftime_now() takes one format string");
    }
    const std::time_t now = options().now ? *options().now : std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    const std::string& fmt = args.pos[0].str();
    if (fmt.empty()) return Value(std::string());
    std::string buf(fmt.size() * 8 + 256, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    buf.resize(n);
    return Value(std::move(buf));
  }
  return InvalidArgument("'" + name + "' is undefined");
}

}  // namespace polychip::jinja::internal
