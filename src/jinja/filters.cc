// Jinja2's filters and tests (jinja2/filters.py, jinja2/tests.py) with transformers' tojson,
// and Python's operators on values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "jinja/eval.h"
#include "jinja/methods.h"

namespace polychip::jinja::internal {
namespace {

Status Unknown(const char* kind, const std::string& name) {
  return InvalidArgument(std::string("No ") + kind + " named '" + name + "'.");
}

// Python's str() of a filter's input (Jinja2's soft_str): a Markup stays Markup.
Value SoftStr(const Value& v) {
  if (v.is_string()) return v;
  return Value(v.Str());
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Sort keys: strings compare case-insensitively unless asked (Jinja2's ignore_case).
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(PyLower(v.str()));
  return v;
}

StatusOr<int64_t> ToIndex(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.AsInt();
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) {
      return InvalidArgument(std::string(what) + " out of range");
    }
    return static_cast<int64_t>(d);
  }
  if (v.is_undefined()) return InvalidArgument(v.undefined_hint());
  return InvalidArgument(std::string(what) + " must be an integer, not " + v.TypeName());
}

// Python's round(x, n) for floats: ties to even on the scaled value.
double PyRound(double x, int64_t n) {
  if (!std::isfinite(x)) return x;
  if (n >= 0 && n <= 30) {
    // printf rounds the exact binary value half to even, as CPython's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(n), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(n));
  const double y = x * scale;
  double r = std::nearbyint(y);
  if (std::fabs(y - std::trunc(y)) != 0.5) r = std::round(y);
  return r / scale;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Operators

StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b, Renderer& r) {
  if (op == "~") {
    std::string s = a.Str() + b.Str();
    PC_RETURN_IF_ERROR(r.CheckSize(s.size()));
    return Value(std::move(s));
  }
  if (a.is_undefined()) return InvalidArgument(a.undefined_hint());
  if (b.is_undefined()) return InvalidArgument(b.undefined_hint());
  auto unsupported = [&]() {
    return InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                           "' and '" + b.TypeName() + "'");
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t out;
      if (__builtin_add_overflow(a.AsInt(), b.AsInt(), &out)) {
        return InvalidArgument("integer overflow");
      }
      return Value(out);
    }
    if (nums) return Value(a.AsDouble() + b.AsDouble());
    if (a.is_string() && b.is_string()) {
      // Markup + str escapes the plain side (markupsafe), as functionary's template relies on.
      const bool safe = a.is_safe() || b.is_safe();
      std::string s = (safe && !a.is_safe() ? HtmlEscape(a.str()) : a.str()) +
                      (safe && !b.is_safe() ? HtmlEscape(b.str()) : b.str());
      PC_RETURN_IF_ERROR(r.CheckSize(s.size()));
      return Value(std::move(s), safe);
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      PC_RETURN_IF_ERROR(r.CheckSize(items.size()));
      PC_RETURN_IF_ERROR(r.Step(items.size()));
      return Value::List(std::move(items), a.is_tuple());
    }
    if (a.is_string()) {
      return InvalidArgument("can only concatenate str (not \"" + b.TypeName() + "\") to str");
    }
    if (a.is_list()) {
      return InvalidArgument("can only concatenate " + a.TypeName() + " (not \"" + b.TypeName() +
                             "\") to " + a.TypeName());
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) {
      int64_t out;
      if (__builtin_sub_overflow(a.AsInt(), b.AsInt(), &out)) {
        return InvalidArgument("integer overflow");
      }
      return Value(out);
    }
    if (nums) return Value(a.AsDouble() - b.AsDouble());
    return unsupported();
  }
  if (op == "*") {
    if (ints) {
      int64_t out;
      if (__builtin_mul_overflow(a.AsInt(), b.AsInt(), &out)) {
        return InvalidArgument("integer overflow");
      }
      return Value(out);
    }
    if (nums) return Value(a.AsDouble() * b.AsDouble());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
      const int64_t n = std::max<int64_t>(0, count->AsInt());
      if (seq->is_string()) {
        const std::string& s = seq->str();
        if (n > 0 && s.size() > r.options().limits.max_output_bytes / static_cast<uint64_t>(n)) {
          return r.CheckSize(std::numeric_limits<size_t>::max());
        }
        std::string out;
        out.reserve(s.size() * n);
        for (int64_t i = 0; i < n; ++i) out += s;
        PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
        return Value(std::move(out));
      }
      const auto& items = seq->list().items;
      if (n > 0 && items.size() > r.options().limits.max_output_bytes / static_cast<uint64_t>(n)) {
        return r.CheckSize(std::numeric_limits<size_t>::max());
      }
      std::vector<Value> out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      PC_RETURN_IF_ERROR(r.CheckSize(out.size()));
      PC_RETURN_IF_ERROR(r.Step(out.size()));
      return Value::List(std::move(out), seq->is_tuple());
    }
    if (a.is_string() || b.is_string() || a.is_list() || b.is_list()) {
      return InvalidArgument("can't multiply sequence by non-int of type '" + count->TypeName() +
                             "'");
    }
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.AsDouble() == 0) return InvalidArgument("division by zero");
    return Value(a.AsDouble() / b.AsDouble());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) {
      PC_ASSIGN_OR_RETURN(std::string s, PercentFormat(a.str(), b, r));
      return Value(std::move(s));
    }
    if (!nums) return unsupported();
    if (ints) {
      const int64_t x = a.AsInt(), y = b.AsInt();
      if (y == 0) return InvalidArgument("integer division or modulo by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) {
        return op == "%" ? Value(int64_t{0}) : StatusOr<Value>(InvalidArgument("integer overflow"));
      }
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    const double x = a.AsDouble(), y = b.AsDouble();
    if (y == 0) return InvalidArgument("float division by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    if (op == "%") return Value(m);
    // CPython's float floor division, exact where floor(x / y) would round badly.
    const double div = (x - std::fmod(x, y)) / y;
    double q;
    if (div != 0) {
      q = std::floor(div);
      if (div - q > 0.5) q += 1.0;
      if (std::fmod(x, y) != 0 && ((std::fmod(x, y) < 0) != (y < 0))) q -= 1.0;
    } else {
      q = std::copysign(0.0, x / y);
      if (std::fmod(x, y) != 0 && ((std::fmod(x, y) < 0) != (y < 0))) q -= 1.0;
    }
    return Value(q);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (ints && b.AsInt() >= 0) {
      int64_t base = a.AsInt(), e = b.AsInt(), out = 1;
      while (e > 0) {
        if (e & 1) {
          if (__builtin_mul_overflow(out, base, &out)) return InvalidArgument("integer overflow");
        }
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) {
          return InvalidArgument("integer overflow");
        }
      }
      return Value(out);
    }
    if (a.AsDouble() == 0 && b.AsDouble() < 0) {
      return InvalidArgument("0.0 cannot be raised to a negative power");
    }
    return Value(std::pow(a.AsDouble(), b.AsDouble()));
  }
  return InvalidArgument("unknown operator " + op);
}

StatusOr<bool> Contains(const Value& container, const Value& item, Renderer& r) {
  switch (container.type()) {
    case Value::Type::kUndefined:
      return false;
    case Value::Type::kString:
      if (!item.is_string()) {
        return r.TypeError("'in <string>' requires string as left operand, not " + item.TypeName(),
                           item);
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Type::kList:
      for (const Value& v : container.list().items) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::Type::kDict:
      return container.dict().Find(item) != nullptr;
    default:
      return InvalidArgument("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

// ---------------------------------------------------------------------------------------------
// Filters

namespace {
// Every filter Jinja2 3.1 defines (transformers' tojson replaces Jinja2's own); the few not
// implemented here (groupby, pprint, random, striptags, urlencode, urlize, wordwrap, xmlattr,
// filesizeformat) fail when called, as an unknown filter in an if block does.
static const char* const kFilters[] = {
    "abs",    "attr",       "batch",       "capitalize", "center",   "count",
    "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
    "first",  "float",      "forceescape", "format",     "groupby",  "indent",
    "int",    "items",      "join",        "last",       "length",   "list",
    "lower",  "map",        "max",         "min",        "pprint",   "random",
    "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
    "select", "selectattr", "slice",       "sort",       "string",   "striptags",
    "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
    "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr"};
static const char* const kTests[] = {
    "defined",     "undefined", "none",     "boolean", "true",     "false",    "integer",
    "float",       "number",    "string",   "mapping", "sequence", "iterable", "callable",
    "escaped",     "lower",     "upper",    "filter",  "test",     "odd",      "even",
    "divisibleby", "sameas",    "in",       "eq",      "equalto",  "==",       "ne",
    "!=",          "lt",        "lessthan", "<",       "le",       "<=",       "gt",
    "greaterthan", ">",         "ge",       ">="};
}  // namespace

bool IsFilterName(std::string_view name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters),
                     [&](const char* f) { return name == f; });
}

bool IsTestName(std::string_view name) {
  return std::any_of(std::begin(kTests), std::end(kTests),
                     [&](const char* t) { return name == t; });
}

namespace {

// Jinja2's make_attrgetter: "a.b.0" looks up each part as an item (numbers as indices).
StatusOr<Value> AttrPath(Renderer& r, const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(start, dot - start);
    Value key(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      if (auto i = ParsePyInt(part, 10)) key = Value(*i);  // past int64: stays a string key
    }
    PC_ASSIGN_OR_RETURN(cur, r.GetItem(cur, key));
    start = dot + 1;
  }
  return cur;
}

// The test and its arguments of select/reject (from args[first]) or selectattr/rejectattr.
StatusOr<Value> SelectOrReject(Renderer& r, const Value& input, const Args& args, bool attr,
                               bool select) {
  // Jinja2's select_or_reject yields nothing for a falsy input (even None).
  if (!input.Truthy()) return Value::Iter({}, "generator");
  PC_ASSIGN_OR_RETURN(std::vector<Value> items, r.Iterate(input));
  size_t first = 0;
  std::string attribute;
  if (attr) {
    if (args.pos.empty() || !args.pos[0].is_string()) {
      return InvalidArgument("Missing parameter for attribute name");
    }
    attribute = args.pos[0].str();
    first = 1;
  }
  std::string test;
  Args test_args;
  if (args.pos.size() > first) {
    test = args.pos[first].Str();
    test_args.pos.assign(args.pos.begin() + static_cast<long>(first) + 1, args.pos.end());
    test_args.kw = args.kw;
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value v = item;
    if (attr) {
      PC_ASSIGN_OR_RETURN(v, AttrPath(r, item, attribute));
    }
    bool ok;
    if (test.empty()) {
      ok = v.Truthy();
    } else {
      PC_ASSIGN_OR_RETURN(ok, r.ApplyTest(test, v, test_args));
    }
    if (ok == select) out.push_back(item);
  }
  return Value::Iter(std::move(out), "generator");
}

StatusOr<Value> MinMax(Renderer& r, const Value& input, const Args& args, bool max) {
  PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"case_sensitive", "attribute"}, "min/max"));
  PC_ASSIGN_OR_RETURN(std::vector<Value> items, r.Iterate(input));
  const bool cs = b.Truthy(0, false);
  const Value* best = nullptr;
  Value best_key;
  for (const Value& item : items) {
    Value key = item;
    if (b.has(1)) {
      PC_ASSIGN_OR_RETURN(key, AttrPath(r, item, b[1].Str()));
    }
    key = SortKey(key, cs);
    if (!best) {
      best = &item;
      best_key = key;
      continue;
    }
    PC_ASSIGN_OR_RETURN(bool less, max ? Less(best_key, key) : Less(key, best_key));
    if (less) {
      best = &item;
      best_key = key;
    }
  }
  if (!best) return Value::MakeUndefined("No aggregated item, sequence was empty.");
  return *best;
}

}  // namespace

StatusOr<Value> Renderer::ApplyFilter(const std::string& name, const Value& input, Args args) {
  PC_RETURN_IF_ERROR(Step());
  if (name == "tojson") {
    PC_ASSIGN_OR_RETURN(
        Bound b, Bind(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson"));
    JsonOptions o;
    if (b.has(1) && !b[1].is_none()) {
      o.pretty = true;
      o.item_sep = ",";
      if (b[1].is_string()) {
        o.indent = b[1].str();
      } else {
        PC_ASSIGN_OR_RETURN(int64_t n, ToIndex(b[1], "indent"));
        o.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(n, 0, 64)), ' ');
      }
    }
    if (b.has(2) && !b[2].is_none()) {
      PC_ASSIGN_OR_RETURN(std::vector<Value> seps, Iterate(b[2]));
      if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
        return InvalidArgument("separators must be a pair of strings");
      }
      o.item_sep = seps[0].str();
      o.key_sep = seps[1].str();
    }
    o.sort_keys = b.Truthy(3, false);
    PC_ASSIGN_OR_RETURN(std::string s, ToJson(input, o));
    if (b.Truthy(0, false)) s = AsciiEscapeJson(s);
    PC_RETURN_IF_ERROR(CheckSize(s.size()));
    return Value(std::move(s));
  }
  if (name == "length" || name == "count") {
    switch (input.type()) {
      case Value::Type::kUndefined:
        return Value(int64_t{0});
      case Value::Type::kString:
        return Value(static_cast<int64_t>(CodepointCount(input.str())));
      case Value::Type::kList:
        if (input.is_iter() && !input.is_view()) {
          return InvalidArgument("object of type '" + input.TypeName() + "' has no len()");
        }
        return Value(static_cast<int64_t>(input.list().items.size()));
      case Value::Type::kDict:
        return Value(static_cast<int64_t>(input.dict().items.size()));
      case Value::Type::kNamespace:
        return InvalidArgument("object of type 'Namespace' has no len()");
      case Value::Type::kLoop:
        return Value(static_cast<int64_t>(input.loop().items->items.size()));
      default:
        return InvalidArgument("object of type '" + input.TypeName() + "' has no len()");
    }
  }
  if (name == "default" || name == "d") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"default_value", "boolean"}, name));
    const bool use_default = input.is_undefined() || (b.Truthy(1, false) && !input.Truthy());
    if (!use_default) return input;
    return b.has(0) ? b[0] : Value(std::string());
  }
  if (name == "trim") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"chars"}, name));
    Args margs;
    if (b.has(0)) margs.pos.push_back(b[0]);
    return CallMethod(SoftStr(input), "strip", margs);
  }
  if (name == "upper" || name == "lower" || name == "capitalize") {
    return CallMethod(SoftStr(input), name, Args{});
  }
  if (name == "title") {
    // Jinja2's title: words start after spaces, dashes and opening brackets (not str.title).
    const auto cps = DecodeUtf8(SoftStr(input).str());
    std::string out;
    bool start = true;
    for (uint32_t cp : cps) {
      const bool sep =
          IsPySpace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
      if (sep) {
        AppendUtf8(&out, cp);
        start = true;
      } else {
        AppendUtf8(&out, start ? PyUpperCp(cp) : PyLowerCp(cp));
        start = false;
      }
    }
    return Value(std::move(out));
  }
  if (name == "string") return SoftStr(input);
  if (name == "safe") return Value(input.Str(), true);
  if (name == "escape" || name == "e" || name == "forceescape") {
    if (input.is_safe() && name != "forceescape") return input;
    return Value(HtmlEscape(input.Str()), true);
  }
  if (name == "join") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"d", "attribute"}, name));
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    const std::string sep = b.has(0) ? b[0].Str() : "";
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep;
      if (b.has(1)) {
        PC_ASSIGN_OR_RETURN(Value v, AttrPath(*this, items[i], b[1].Str()));
        out += v.Str();
      } else {
        out += items[i].Str();
      }
      PC_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value(std::move(out));
  }
  if (name == "replace") {
    return CallMethod(SoftStr(input), "replace", args);
  }
  if (name == "first" || name == "last") {
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    if (name == "last" && input.is_iter() && !input.is_view()) {
      return InvalidArgument("'" + input.TypeName() + "' object is not reversible");
    }
    if (items.empty()) {
      return Value::MakeUndefined(std::string("No ") + name + " item, sequence was empty.");
    }
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    return Value::List(std::move(items));
  }
  if (name == "int") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"default", "base"}, name));
    const Value dflt = b.has(0) ? b[0] : Value(int64_t{0});
    if (input.is_undefined()) return InvalidArgument(input.undefined_hint());
    if (input.is_int() || input.is_bool()) return Value(input.AsInt());
    if (input.is_float()) {
      const double d = input.as_float();
      if (!std::isfinite(d) || std::fabs(d) > 9.2e18) return dflt;
      return Value(static_cast<int64_t>(d));
    }
    if (input.is_string()) {
      int64_t base = 10;
      if (b.has(1)) {
        PC_ASSIGN_OR_RETURN(base, ToIndex(b[1], "base"));
      }
      if (auto v = ParsePyInt(input.str(), static_cast<int>(base))) return Value(*v);
      if (auto d = ParsePyFloat(input.str())) {
        if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value(static_cast<int64_t>(*d));
      }
    }
    return dflt;
  }
  if (name == "float") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"default"}, name));
    const Value dflt = b.has(0) ? b[0] : Value(0.0);
    if (input.is_undefined()) return InvalidArgument(input.undefined_hint());
    if (input.is_number()) return Value(input.AsDouble());
    if (input.is_string()) {
      if (auto d = ParsePyFloat(input.str())) return Value(*d);
    }
    return dflt;
  }
  if (name == "abs") {
    if (input.is_float()) return Value(std::fabs(input.as_float()));
    if (input.is_int() || input.is_bool()) {
      const int64_t i = input.AsInt();
      if (i == std::numeric_limits<int64_t>::min()) return InvalidArgument("integer overflow");
      return Value(i < 0 ? -i : i);
    }
    return TypeError("bad operand type for abs(): '" + input.TypeName() + "'", input);
  }
  if (name == "round") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"precision", "method"}, name));
    int64_t precision = 0;
    if (b.has(0)) {
      PC_ASSIGN_OR_RETURN(precision, ToIndex(b[0], "precision"));
    }
    const std::string method = b.has(1) ? b[1].Str() : "common";
    if (method != "common" && method != "ceil" && method != "floor") {
      return InvalidArgument("method must be common, ceil or floor");
    }
    if (!input.is_number()) {
      return TypeError("type " + input.TypeName() + " doesn't define __round__ method", input);
    }
    if (method == "common") {
      if (!input.is_float()) return Value(input.AsInt());
      return Value(PyRound(input.as_float(), precision));
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = input.AsDouble() * scale;
    return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "map") {
    if (!input.Truthy()) return Value::Iter({}, "generator");
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::vector<Value> out;
    out.reserve(items.size());
    const Value* attribute = nullptr;
    const Value* dflt = nullptr;
    for (const auto& [k, v] : args.kw) {
      if (k == "attribute") attribute = &v;
      if (k == "default") dflt = &v;
    }
    if (attribute) {
      for (const Value& item : items) {
        PC_ASSIGN_OR_RETURN(Value v, AttrPath(*this, item, attribute->Str()));
        if (dflt && v.is_undefined()) v = *dflt;
        out.push_back(std::move(v));
      }
      return Value::Iter(std::move(out), "generator");
    }
    if (args.pos.empty()) return InvalidArgument("map requires a filter argument");
    const std::string filter = args.pos[0].Str();
    Args fargs;
    fargs.pos.assign(args.pos.begin() + 1, args.pos.end());
    fargs.kw = args.kw;
    for (const Value& item : items) {
      PC_ASSIGN_OR_RETURN(Value v, ApplyFilter(filter, item, fargs));
      out.push_back(std::move(v));
    }
    return Value::Iter(std::move(out), "generator");
  }
  if (name == "select" || name == "reject") {
    return SelectOrReject(*this, input, args, false, name == "select");
  }
  if (name == "selectattr" || name == "rejectattr") {
    return SelectOrReject(*this, input, args, true, name == "selectattr");
  }
  if (name == "unique") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"case_sensitive", "attribute"}, name));
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::vector<Value> out, seen;
    for (const Value& item : items) {
      Value key = item;
      if (b.has(1)) {
        PC_ASSIGN_OR_RETURN(key, AttrPath(*this, item, b[1].Str()));
      }
      key = SortKey(key, b.Truthy(0, false));
      bool dup = false;
      for (const Value& s : seen) {
        if (Equal(s, key)) {
          dup = true;
          break;
        }
      }
      PC_RETURN_IF_ERROR(Step(seen.size()));
      if (!dup) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::Iter(std::move(out), "generator");
  }
  if (name == "sort" || name == "dictsort") {
    const bool dictsort = name == "dictsort";
    PC_ASSIGN_OR_RETURN(Bound b,
                        dictsort ? Bind(args, {"case_sensitive", "by", "reverse"}, name)
                                 : Bind(args, {"reverse", "case_sensitive", "attribute"}, name));
    std::vector<Value> items;
    if (dictsort) {
      if (!input.is_dict()) return InvalidArgument("You can only sort by either 'key' or 'value'");
      for (const auto& [k, v] : input.dict().items) items.push_back(Value::List({k, v}, true));
    } else {
      PC_ASSIGN_OR_RETURN(items, Iterate(input));
    }
    const bool reverse = dictsort ? b.Truthy(2, false) : b.Truthy(0, false);
    const bool cs = dictsort ? b.Truthy(0, false) : b.Truthy(1, false);
    size_t by = 0;
    if (dictsort && b.has(1)) {
      const std::string s = b[1].Str();
      if (s == "value")
        by = 1;
      else if (s != "key")
        return InvalidArgument("You can only sort by either 'key' or 'value'");
    }
    std::vector<std::pair<Value, size_t>> keyed;
    for (size_t i = 0; i < items.size(); ++i) {
      Value key = dictsort ? items[i].list().items[by] : items[i];
      if (!dictsort && b.has(2)) {
        PC_ASSIGN_OR_RETURN(key, AttrPath(*this, items[i], b[2].Str()));
      }
      keyed.emplace_back(SortKey(key, cs), i);
    }
    Status err = Status::Ok();
    PC_RETURN_IF_ERROR(Step(items.size() * 8));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      if (!err.ok()) return false;
      auto less = reverse ? Less(y.first, x.first) : Less(x.first, y.first);
      if (!less.ok()) {
        err = less.status();
        return false;
      }
      return *less;
    });
    PC_RETURN_IF_ERROR(err);
    std::vector<Value> out;
    for (const auto& [k, i] : keyed) out.push_back(items[i]);
    return Value::List(std::move(out));
  }
  if (name == "reverse") {
    if (input.is_string()) {
      auto cps = DecodeUtf8(input.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) AppendUtf8(&out, *it);
      return Value(std::move(out));
    }
    if (input.is_iter() && !input.is_view()) {
      return InvalidArgument("argument to reversed() must be a sequence");
    }
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::Iter(std::move(items),
                       input.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator");
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::Iter({}, "generator");
    if (!input.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, v] : input.dict().items) out.push_back(Value::List({k, v}, true));
    return Value::Iter(std::move(out), "generator");
  }
  if (name == "indent") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"width", "first", "blank"}, name));
    std::string indention = "    ";
    if (b.has(0)) {
      if (b[0].is_string()) {
        indention = b[0].str();
      } else {
        PC_ASSIGN_OR_RETURN(int64_t w, ToIndex(b[0], "width"));
        indention = std::string(static_cast<size_t>(std::clamp<int64_t>(w, 0, 1024)), ' ');
      }
    }
    const std::vector<std::string> lines = PySplitLines(SoftStr(input).str() + "\n", false);
    std::string out;
    if (b.Truthy(2, false)) {
      for (size_t i = 0; i < lines.size(); ++i) {
        if (i) out += "\n" + indention;
        out += lines[i];
      }
    } else {
      out = lines.empty() ? "" : lines[0];
      for (size_t i = 1; i < lines.size(); ++i) {
        out += "\n";
        if (!lines[i].empty()) out += indention + lines[i];
      }
    }
    if (b.Truthy(1, false)) out = indention + out;
    PC_RETURN_IF_ERROR(CheckSize(out.size()));
    return Value(std::move(out));
  }
  if (name == "center") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"width"}, name));
    Args margs;
    margs.pos.push_back(b.has(0) ? b[0] : Value(int64_t{80}));
    return CallMethod(SoftStr(input), "center", margs);
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (uint32_t cp : DecodeUtf8(SoftStr(input).str())) {
      const bool w = cp == '_' || cp >= 0x80 || std::isalnum(static_cast<int>(cp));
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value(n);
  }
  if (name == "truncate") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"length", "killwords", "end", "leeway"}, name));
    int64_t length = 255, leeway = 5;
    if (b.has(0)) {
      PC_ASSIGN_OR_RETURN(length, ToIndex(b[0], "length"));
    }
    if (b.has(3) && !b[3].is_none()) {
      PC_ASSIGN_OR_RETURN(leeway, ToIndex(b[3], "leeway"));
    }
    const std::string end = b.has(2) ? b[2].Str() : "...";
    const auto cps = DecodeUtf8(SoftStr(input).str());
    const auto end_len = static_cast<int64_t>(CodepointCount(end));
    if (length < end_len) return InvalidArgument("expected length >= " + std::to_string(end_len));
    if (static_cast<int64_t>(cps.size()) <= length + leeway) return SoftStr(input);
    std::string head;
    for (int64_t i = 0; i < length - end_len; ++i) AppendUtf8(&head, cps[i]);
    if (!b.Truthy(1, false)) {
      const size_t sp = head.rfind(' ');
      if (sp != std::string::npos) head.resize(sp);
    }
    return Value(head + end);
  }
  if (name == "format") {
    if (!args.kw.empty() && !args.pos.empty()) {
      return InvalidArgument("can't handle positional and keyword arguments at the same time");
    }
    Value fargs;
    if (!args.kw.empty()) {
      DictData d;
      for (auto& [k, v] : args.kw) d.Set(Value(k), v);
      fargs = Value::Dict(std::move(d));
    } else {
      fargs = Value::List(args.pos, true);
    }
    PC_ASSIGN_OR_RETURN(std::string s, PercentFormat(SoftStr(input).str(), fargs, *this));
    return Value(std::move(s));
  }
  if (name == "sum") {
    PC_ASSIGN_OR_RETURN(Bound b, Bind(args, {"attribute", "start"}, name));
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    Value total = b.has(1) ? b[1] : Value(int64_t{0});
    for (const Value& item : items) {
      Value v = item;
      if (b.has(0)) {
        PC_ASSIGN_OR_RETURN(v, AttrPath(*this, item, b[0].Str()));
      }
      PC_ASSIGN_OR_RETURN(total, BinaryOp("+", total, v, *this));
    }
    return total;
  }
  if (name == "min" || name == "max") return MinMax(*this, input, args, name == "max");
  if (name == "batch" || name == "slice") {
    PC_ASSIGN_OR_RETURN(Bound b,
                        Bind(args, {name == "batch" ? "linecount" : "slices", "fill_with"}, name));
    if (!b.has(0)) return InvalidArgument(name + "() missing required argument");
    PC_ASSIGN_OR_RETURN(int64_t n, ToIndex(b[0], name.c_str()));
    if (n <= 0) return InvalidArgument(name + " size must be positive");
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(input));
    std::vector<Value> out;
    const bool fill = b.has(1);
    if (name == "batch") {
      std::vector<Value> cur;
      for (const Value& item : items) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) {
          out.push_back(Value::List(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (fill) {
          while (static_cast<int64_t>(cur.size()) < n) cur.push_back(b[1]);
        }
        out.push_back(Value::List(std::move(cur)));
      }
    } else {
      const auto len = static_cast<int64_t>(items.size());
      const int64_t per = len / n, extra = len % n;
      int64_t offset = 0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t start = offset + i * per;
        if (i < extra) ++offset;
        const int64_t end = offset + (i + 1) * per;
        std::vector<Value> part(items.begin() + start, items.begin() + end);
        if (fill && i >= extra) part.push_back(b[1]);
        out.push_back(Value::List(std::move(part)));
      }
    }
    return Value::Iter(std::move(out), "generator");
  }
  if (name == "attr") {
    if (args.pos.size() != 1) return InvalidArgument("attr() takes one argument");
    return GetAttr(input, args.pos[0].Str());
  }
  if (IsFilterName(name)) return InvalidArgument("the " + name + " filter is not supported");
  return Unknown("filter", name);
}

// ---------------------------------------------------------------------------------------------
// Tests

StatusOr<bool> Renderer::ApplyTest(const std::string& name, const Value& v, const Args& args) {
  PC_RETURN_IF_ERROR(Step());
  using T = Value::Type;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "sequence") {
    return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  }
  if (name == "iterable") {
    return v.is_string() || v.is_list() || v.is_iter() || v.is_dict() || v.is_undefined() ||
           v.is_loop();
  }
  if (name == "callable") return v.is_callable() || v.is_loop() || v.is_undefined();
  if (name == "escaped") return v.is_safe();
  if (name == "lower" || name == "upper") {
    PC_ASSIGN_OR_RETURN(Value r,
                        CallMethod(SoftStr(v), name == "lower" ? "islower" : "isupper", Args{}));
    return r.as_bool();
  }
  if (name == "filter" || name == "test") {
    return name == "filter" ? IsFilterName(v.Str()) : IsTestName(v.Str());
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    Value divisor(int64_t{2});
    if (name == "divisibleby") {
      if (args.pos.size() != 1) return InvalidArgument("divisibleby takes one argument");
      divisor = args.pos[0];
    }
    PC_ASSIGN_OR_RETURN(Value m, BinaryOp("%", v, divisor, *this));
    const bool zero = m.is_float() ? m.as_float() == 0 : m.AsInt() == 0;
    return name == "odd" ? !zero : zero;
  }
  if (args.pos.size() != 1) return InvalidArgument("test '" + name + "' takes one argument");
  const Value& other = args.pos[0];
  if (name == "sameas") {
    if (v.type() != other.type()) return false;
    switch (v.type()) {
      case T::kNone:
      case T::kUndefined:
        return v.is_none();
      case T::kBool:
      case T::kInt:
      case T::kFloat:
        return Equal(v, other);
      case T::kString:
        return &v.str() == &other.str();
      case T::kList:
        return &v.list() == &other.list();
      case T::kDict:
        return &v.dict() == &other.dict();
      default:
        return Equal(v, other);
    }
  }
  if (name == "in") return Contains(other, v, *this);
  if (name == "eq" || name == "equalto" || name == "==") return Equal(v, other);
  if (name == "ne" || name == "!=") return !Equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return Less(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return Less(other, v);
  if (name == "le" || name == "<=") {
    PC_ASSIGN_OR_RETURN(bool gt, Less(other, v));
    return !gt;
  }
  if (name == "ge" || name == ">=") {
    PC_ASSIGN_OR_RETURN(bool lt, Less(v, other));
    return !lt;
  }
  return Unknown("test", name);
}

}  // namespace polychip::jinja::internal
