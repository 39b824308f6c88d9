#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/eval.h"

namespace polychip::jinja::internal {

// ---------------------------------------------------------------------------------------------
// UTF-8

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) {  // invalid byte: kept as one unit, as a lone code point
      out.push_back(c);
      ++i;
      continue;
    }
    uint32_t cp = n == 1 ? c : c & (0x7f >> n);
    bool ok = true;
    for (int k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(c);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

size_t CodepointCount(std::string_view s) {
  if (IsAscii(s)) return s.size();
  return DecodeUtf8(s).size();
}

bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// ---------------------------------------------------------------------------------------------
// Containers

Value Value::List(std::vector<Value> items, bool is_tuple) {
  auto data = std::make_shared<ListData>();
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  data->items = std::move(items);
  data->is_tuple = is_tuple;
  data->depth = depth + 1;
  Value v;
  v.v_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}

Value Value::Iter(std::vector<Value> items, const char* type_name) {
  Value v = List(std::move(items));
  // List() made the only reference: safe to mark before anyone else sees it.
  const_cast<ListData&>(v.list()).iter_type = type_name;
  return v;
}

Value Value::Dict(DictData dict) {
  int depth = 0;
  for (const auto& [k, val] : dict.items) depth = std::max(depth, val.depth());
  dict.depth = depth + 1;
  Value v;
  v.v_ = std::shared_ptr<const DictData>(std::make_shared<DictData>(std::move(dict)));
  return v;
}

int Value::depth() const {
  if (type() == Type::kList) return list().depth;
  if (is_dict()) return dict().depth;
  return 0;
}

const Value* DictData::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.str()));
  for (const auto& [k, v] : items) {
    if (Equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* DictData::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

void DictData::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

// ---------------------------------------------------------------------------------------------
// Python semantics

bool Value::Truthy() const {
  switch (type()) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return as_bool();
    case Type::kInt:
      return as_int() != 0;
    case Type::kFloat:
      return as_float() != 0.0;
    case Type::kString:
      return !str().empty();
    case Type::kList:
      return (list().iter_type && !is_view()) || !list().items.empty();
    case Type::kDict:
      return !dict().items.empty();
    default:
      return true;
  }
}

std::string Value::TypeName() const {
  switch (type()) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return list().iter_type ? list().iter_type : is_tuple() ? "tuple" : "list";
    case Type::kDict:
      return "dict";
    case Type::kCallable:
      return "function";
    case Type::kNamespace:
      return "Namespace";
    case Type::kLoop:
      return "LoopContext";
  }
  return "object";
}

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: scientific when the decimal exponent is
  // below -4 or at least 16, otherwise positional with at least one fractional digit.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  if (sci[0] == '-') {
    out = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  return out;
}

namespace {

bool IsPyPrintable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp >= 0x80 && cp <= 0xa0) return false;
  if (cp == 0xad) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
      (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff ||
      (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0xfff9 && cp <= 0xfffb) || cp == 0x1680) {
    return false;
  }
  return true;
}

void ReprInto(const Value& v, std::string* out, int depth);

void ReprSeq(const ListData& l, std::string* out, int depth) {
  out->push_back(l.is_tuple ? '(' : '[');
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (i) out->append(", ");
    ReprInto(l.items[i], out, depth + 1);
  }
  if (l.is_tuple && l.items.size() == 1) out->push_back(',');
  out->push_back(l.is_tuple ? ')' : ']');
}

void ReprDict(const DictData& d, std::string* out, int depth) {
  out->push_back('{');
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out->append(", ");
    ReprInto(d.items[i].first, out, depth + 1);
    out->append(": ");
    ReprInto(d.items[i].second, out, depth + 1);
  }
  out->push_back('}');
}

void ReprInto(const Value& v, std::string* out, int depth) {
  if (depth > 1000) {  // only a namespace can refer to itself; Python prints "..." there too
    out->append("...");
    return;
  }
  switch (v.type()) {
    case Value::Type::kString:
      out->append(ReprString(v.str()));
      return;
    case Value::Type::kList:
      if (v.is_view()) {
        out->append(v.list().iter_type);
        out->append("(");
        ReprSeq(v.list(), out, depth);
        out->append(")");
      } else if (v.is_iter()) {
        out->append(std::string("<") + v.list().iter_type + " object>");
      } else {
        ReprSeq(v.list(), out, depth);
      }
      return;
    case Value::Type::kDict:
      ReprDict(v.dict(), out, depth);
      return;
    case Value::Type::kNamespace:
      out->append("<Namespace ");
      ReprDict(v.ns().attrs, out, depth);
      out->append(">");
      return;
    case Value::Type::kUndefined:
      out->append("Undefined");
      return;
    default:
      out->append(v.Str());
      return;
  }
}

}  // namespace

std::string ReprString(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : DecodeUtf8(s)) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out.append("\\n");
    } else if (cp == '\r') {
      out.append("\\r");
    } else if (cp == '\t') {
      out.append("\\t");
    } else if (!IsPyPrintable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      }
      out.append(buf);
    } else {
      AppendUtf8(&out, cp);
    }
  }
  out.push_back(quote);
  return out;
}

std::string Value::Str() const {
  switch (type()) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return as_bool() ? "True" : "False";
    case Type::kInt:
      return std::to_string(as_int());
    case Type::kFloat:
      return FormatFloat(as_float());
    case Type::kString:
      return str();
    case Type::kCallable:
      return "<function " + callable().name + ">";
    case Type::kLoop:
      return "<LoopContext>";
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  std::string out;
  if (is_string() || type() == Type::kList || is_dict() || is_namespace()) {
    ReprInto(*this, &out, 0);
    return out;
  }
  return Str();
}

bool Equal(const Value& a, const Value& b) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    return a.AsInt() == b.AsInt();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case T::kUndefined:
    case T::kNone:
      return true;
    case T::kString:
      return a.str() == b.str();
    case T::kList: {
      if (a.is_iter() || b.is_iter()) return &a.list() == &b.list();
      const auto& x = a.list();
      const auto& y = b.list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!Equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case T::kDict: {
      const auto& x = a.dict();
      const auto& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (!other || !Equal(v, *other)) return false;
      }
      return true;
    }
    case T::kCallable:
      return &a.callable() == &b.callable();
    case T::kNamespace:
      return &a.ns() == &b.ns();
    case T::kLoop:
      return &a.loop() == &b.loop();
    default:
      return false;
  }
}

StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() < b.AsDouble();
    return a.AsInt() < b.AsInt();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) return InvalidArgument(a.undefined_hint());
  if (b.is_undefined()) return InvalidArgument(b.undefined_hint());
  return InvalidArgument("'<' not supported between instances of '" + a.TypeName() + "' and '" +
                         b.TypeName() + "'");
}

// ---------------------------------------------------------------------------------------------
// JSON

StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int max_depth) {
  if (max_depth <= 0) return InvalidArgument("variables nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        PC_ASSIGN_OR_RETURN(Value v, FromJson(e, max_depth - 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) {
        PC_ASSIGN_OR_RETURN(Value v, FromJson(e, max_depth - 1));
        d.items.emplace_back(Value(k), std::move(v));
      }
      return Value::Dict(std::move(d));
    }
    default:
      return InvalidArgument("variables hold a value JSON cannot carry");
  }
}

namespace {

void JsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

Status JsonInto(const Value& v, const JsonOptions& o, int level, std::string* out);

void Newline(const JsonOptions& o, int level, std::string* out) {
  out->push_back('\n');
  for (int i = 0; i < level; ++i) out->append(o.indent);
}

// json.dumps turns keys into strings: str keys as they are, numbers, bools and None as JSON
// writes them; other keys are a TypeError.
StatusOr<std::string> JsonKey(const Value& k) {
  switch (k.type()) {
    case Value::Type::kString:
      return k.str();
    case Value::Type::kBool:
      return std::string(k.as_bool() ? "true" : "false");
    case Value::Type::kNone:
      return std::string("null");
    case Value::Type::kInt:
      return std::to_string(k.as_int());
    case Value::Type::kFloat:
      return FormatFloat(k.as_float());
    default:
      return InvalidArgument("keys must be str, int, float, bool or None, not " + k.TypeName());
  }
}

Status JsonInto(const Value& v, const JsonOptions& o, int level, std::string* out) {
  if (level > 1000) return InvalidArgument("Circular reference detected");
  switch (v.type()) {
    case Value::Type::kNone:
      out->append("null");
      return Status::Ok();
    case Value::Type::kBool:
      out->append(v.as_bool() ? "true" : "false");
      return Status::Ok();
    case Value::Type::kInt:
      out->append(std::to_string(v.as_int()));
      return Status::Ok();
    case Value::Type::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d))
        out->append("NaN");
      else if (std::isinf(d))
        out->append(d > 0 ? "Infinity" : "-Infinity");
      else
        out->append(FormatFloat(d));
      return Status::Ok();
    }
    case Value::Type::kString:
      JsonString(v.str(), out);
      return Status::Ok();
    case Value::Type::kList: {
      if (v.is_iter()) {
        return InvalidArgument(std::string("Object of type ") + v.list().iter_type +
                               " is not JSON serializable");
      }
      const auto& items = v.list().items;
      if (items.empty()) {
        out->append("[]");
        return Status::Ok();
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out->append(o.item_sep);
        if (o.pretty) Newline(o, level + 1, out);
        PC_RETURN_IF_ERROR(JsonInto(items[i], o, level + 1, out));
      }
      if (o.pretty) Newline(o, level, out);
      out->push_back(']');
      return Status::Ok();
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      if (v.is_namespace()) {
        return InvalidArgument("Object of type Namespace is not JSON serializable");
      }
      const auto& items = v.dict().items;
      if (items.empty()) {
        out->append("{}");
        return Status::Ok();
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      entries.reserve(items.size());
      for (const auto& [k, val] : items) {
        PC_ASSIGN_OR_RETURN(std::string key, JsonKey(k));
        entries.emplace_back(std::move(key), &val);
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out->append(o.item_sep);
        if (o.pretty) Newline(o, level + 1, out);
        JsonString(entries[i].first, out);
        out->append(o.key_sep);
        PC_RETURN_IF_ERROR(JsonInto(*entries[i].second, o, level + 1, out));
      }
      if (o.pretty) Newline(o, level, out);
      out->push_back('}');
      return Status::Ok();
    }
    default:
      return InvalidArgument("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  PC_RETURN_IF_ERROR(JsonInto(v, options, 0, &out));
  return out;
}

}  // namespace polychip::jinja::internal
