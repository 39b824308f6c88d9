// JSON Schema -> EBNF text (grammar.h). Every schema node becomes an EBNF expression; objects,
// arrays and $refs get named rules (a $ref's rule is named before its body is built, so
// recursive schemas work). Lengths are bounded where JSON leaves them open (numbers, and
// whitespace) so that a sampling model always reaches the end of the document.
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace polychip::grammar {
namespace {

// ordered_json: properties keep the order the schema declares (the order of the output).
using json = nlohmann::ordered_json;

constexpr int64_t kMaxIntMagnitude = 9999999999999999;  // 16 digits

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out.append(i ? sep : "").append(parts[i]);
  return out;
}

std::string Alts(const std::vector<std::string>& parts) {
  if (parts.size() == 1) return parts[0];
  return "(" + Join(parts, " | ") + ")";
}

// Decimal strings of equal length, a <= b: the EBNF of every number between them.
std::string SameLength(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (a == b) return EbnfLiteral(a);
  if (n == 1) return fmt::format("[{}-{}]", a[0], b[0]);
  if (a[0] == b[0]) return EbnfLiteral(a.substr(0, 1)) + " " + SameLength(a.substr(1), b.substr(1));
  const bool low_zeros = a.find_first_not_of('0', 1) == std::string::npos;
  const bool high_nines = b.find_first_not_of('9', 1) == std::string::npos;
  std::vector<std::string> parts;
  if (!low_zeros) {
    parts.push_back(EbnfLiteral(a.substr(0, 1)) + " " +
                    SameLength(a.substr(1), std::string(n - 1, '9')));
  }
  const char first = a[0] + (low_zeros ? 0 : 1);
  const char last = b[0] - (high_nines ? 0 : 1);
  if (first <= last) parts.push_back(fmt::format("[{}-{}] [0-9]{{{}}}", first, last, n - 1));
  if (!high_nines) {
    parts.push_back(EbnfLiteral(b.substr(0, 1)) + " " +
                    SameLength(std::string(n - 1, '0'), b.substr(1)));
  }
  return Alts(parts);
}

// Every non-negative integer in [lo, hi] written without leading zeros.
std::string UnsignedRange(int64_t lo, int64_t hi) {
  std::vector<std::string> parts;
  const size_t lo_len = std::to_string(lo).size(), hi_len = std::to_string(hi).size();
  int64_t pow = 1;
  for (size_t k = 1; k < lo_len; ++k) pow *= 10;
  for (size_t len = lo_len; len <= hi_len; ++len, pow *= 10) {
    const int64_t a = std::max(lo, len == 1 ? 0 : pow);
    const int64_t b = std::min(hi, pow * 10 - 1);
    if (a <= b) parts.push_back(SameLength(std::to_string(a), std::to_string(b)));
  }
  return Alts(parts);
}

std::string IntRange(int64_t lo, int64_t hi) {
  std::vector<std::string> parts;
  if (lo < 0) {
    const int64_t mag_lo = hi < 0 ? -hi : 1;
    parts.push_back("\"-\" " + UnsignedRange(mag_lo, -lo));
  }
  if (hi >= 0) parts.push_back(UnsignedRange(std::max<int64_t>(lo, 0), hi));
  return Alts(parts);
}

class Converter {
 public:
  Converter(const json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {}

  StatusOr<std::string> Run() {
    AddBasics();
    PC_ASSIGN_OR_RETURN(std::string body, Visit(root_, "root"));
    std::string out = "root ::= " + body + "\n";
    for (const auto& [name, rule] : rules_) out += name + " ::= " + rule + "\n";
    return out;
  }

 private:
  void AddBasics() {
    // Layout between JSON tokens: one space, or one line break and an indentation (llama.cpp's
    // rule). A weak model must not spend its tokens on whitespace.
    rules_["ws"] = fmt::format("(\" \" | \"\\n\" [ \\t]{{0,{}}})?", options_.max_whitespace);
    rules_["char"] = R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))";
    rules_["string"] = R"("\"" char* "\"")";
    rules_["number"] =
        R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?)";
    rules_["integer"] = R"("-"? ("0" | [1-9] [0-9]{0,15}))";
    rules_["boolean"] = R"("true" | "false")";
    rules_["null"] = R"("null")";
    rules_["value"] = "object | array | string | number | boolean | null";
    rules_["object"] =
        R"("{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}")";
    rules_["array"] = R"("[" ws (value ws ("," ws value ws)*)? "]")";
  }

  std::string NewRule(const std::string& hint, std::string body) {
    // Property names become part of rule names: keep them to the EBNF name characters.
    std::string clean = hint.substr(0, 40);
    for (char& c : clean) {
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) c = '-';
    }
    std::string name = fmt::format("{}-{}", clean, counter_++);
    rules_[name] = std::move(body);
    return name;
  }

  StatusOr<const json*> Resolve(const std::string& ref) {
    if (ref == "#") return &root_;
    if (ref.rfind("#/", 0) != 0) {
      return Unimplemented("json_schema: only local $refs (#/...) are supported, got '" + ref +
                           "'");
    }
    const json* node = &root_;
    size_t start = 2;
    while (start <= ref.size()) {
      size_t end = ref.find('/', start);
      if (end == std::string::npos) end = ref.size();
      std::string part = ref.substr(start, end - start);
      // JSON pointer escapes.
      for (size_t p; (p = part.find("~1")) != std::string::npos;) part.replace(p, 2, "/");
      for (size_t p; (p = part.find("~0")) != std::string::npos;) part.replace(p, 2, "~");
      if (!node->is_object() || !node->contains(part)) {
        return InvalidArgument("json_schema: $ref '" + ref + "' does not resolve");
      }
      node = &(*node)[part];
      start = end + 1;
    }
    return node;
  }

  Status CheckSupported(const json& s) {
    static const char* kUnsupported[] = {"not",
                                         "if",
                                         "then",
                                         "else",
                                         "patternProperties",
                                         "dependentRequired",
                                         "dependentSchemas",
                                         "multipleOf",
                                         "contains",
                                         "minProperties",
                                         "maxProperties",
                                         "propertyNames",
                                         "unevaluatedProperties",
                                         "unevaluatedItems",
                                         "minContains",
                                         "maxContains",
                                         "dependencies"};
    for (const char* k : kUnsupported) {
      if (s.contains(k)) return Unimplemented(fmt::format("json_schema: '{}' is not supported", k));
    }
    if (s.value("uniqueItems", false)) {
      return Unimplemented("json_schema: 'uniqueItems' is not supported");
    }
    return Status::Ok();
  }

  StatusOr<std::string> Visit(const json& s, const std::string& hint) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return std::string("value");
      return InvalidArgument("json_schema: the schema 'false' matches nothing");
    }
    if (!s.is_object()) return InvalidArgument("json_schema: a schema must be an object");
    PC_RETURN_IF_ERROR(CheckSupported(s));
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) return InvalidArgument("json_schema: '$ref' must be a string");
      const std::string ref = it->get<std::string>();
      if (auto r = ref_rules_.find(ref); r != ref_rules_.end()) return r->second;
      std::string name = fmt::format("ref-{}", counter_++);
      ref_rules_[ref] = name;
      rules_[name] = "";  // named before its body: recursion refers to it
      PC_ASSIGN_OR_RETURN(const json* target, Resolve(ref));
      PC_ASSIGN_OR_RETURN(std::string body, Visit(*target, "ref"));
      rules_[name] = body;
      return name;
    }
    if (auto it = s.find("const"); it != s.end()) return EbnfLiteral(it->dump());
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) {
        return InvalidArgument("json_schema: 'enum' must be a non-empty array");
      }
      std::vector<std::string> parts;
      for (const auto& v : *it) parts.push_back(EbnfLiteral(v.dump()));
      return Alts(parts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) {
        if (!it->is_array() || it->empty()) {
          return InvalidArgument(fmt::format("json_schema: '{}' must be a non-empty array", key));
        }
        std::vector<std::string> parts;
        for (const auto& sub : *it) {
          // Sibling keywords apply to every branch (e.g. "type" next to "anyOf").
          json merged = s;
          merged.erase("anyOf");
          merged.erase("oneOf");
          if (sub.is_object()) {
            for (auto& [k, v] : sub.items()) merged[k] = v;
          } else {
            merged = sub;
          }
          PC_ASSIGN_OR_RETURN(std::string p, Visit(merged, hint));
          parts.push_back(p);
        }
        return Alts(parts);
      }
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument("json_schema: 'allOf' must be an array");
      // Object schemas merge (properties and required); anything else is not supported.
      json merged = s;
      merged.erase("allOf");
      for (const auto& sub0 : *it) {
        const json* sub = &sub0;
        if (sub->contains("$ref")) {
          PC_ASSIGN_OR_RETURN(sub, Resolve((*sub)["$ref"].get<std::string>()));
        }
        if (!sub->is_object()) return Unimplemented("json_schema: 'allOf' of non-objects");
        for (auto& [k, v] : sub->items()) {
          if (k == "properties") {
            for (auto& [pk, pv] : v.items()) merged["properties"][pk] = pv;
          } else if (k == "required") {
            for (const auto& r : v) merged["required"].push_back(r);
          } else if (merged.contains(k) && merged[k] != v) {
            return Unimplemented("json_schema: 'allOf' with conflicting '" + k + "'");
          } else {
            merged[k] = v;
          }
        }
      }
      return Visit(merged, hint);
    }

    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const auto& t : *it) {
          if (!t.is_string()) return InvalidArgument("json_schema: 'type' must hold strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return InvalidArgument("json_schema: 'type' must be a string or an array");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
               s.contains("format")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return std::string("value");
    }
    std::vector<std::string> parts;
    for (const auto& t : types) {
      PC_ASSIGN_OR_RETURN(std::string p, VisitType(s, t, hint));
      parts.push_back(p);
    }
    return Alts(parts);
  }

  StatusOr<std::string> VisitType(const json& s, const std::string& type, const std::string& hint) {
    if (type == "object") return Object(s, hint);
    if (type == "array") return Array(s, hint);
    if (type == "string") return String(s);
    if (type == "integer") return Integer(s);
    if (type == "number") return Number(s);
    if (type == "boolean") return std::string("boolean");
    if (type == "null") return std::string("null");
    return InvalidArgument("json_schema: unknown type '" + type + "'");
  }

  StatusOr<std::string> Object(const json& s, const std::string& hint) {
    const json props = s.value("properties", json::object());
    if (!props.is_object()) return InvalidArgument("json_schema: 'properties' must be an object");
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument("json_schema: 'required' must be an array");
      for (const auto& r : *it) {
        if (!r.is_string()) return InvalidArgument("json_schema: 'required' must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    // The value of keys not listed, or "" when none is allowed.
    std::string extra;
    auto ap = s.find("additionalProperties");
    if (ap == s.end()) {
      if (props.empty() || options_.allow_additional_properties) extra = "value";
    } else if (ap->is_boolean()) {
      if (ap->get<bool>()) extra = "value";
    } else {
      PC_ASSIGN_OR_RETURN(extra, Visit(*ap, hint + "-extra"));
    }
    for (const auto& r : required) {
      if (!props.contains(r)) {
        if (extra.empty()) {
          return InvalidArgument("json_schema: required property '" + r + "' is not defined");
        }
      }
    }
    std::vector<std::string> kvs;
    std::vector<bool> req;
    for (const auto& [key, sub] : props.items()) {
      PC_ASSIGN_OR_RETURN(std::string value, Visit(sub, hint + "-" + key));
      kvs.push_back(EbnfLiteral(json(key).dump()) + " ws \":\" ws " + value);
      req.push_back(required.count(key) > 0);
    }
    // Properties come in the declared order, each optional one may be left out. rest[k]: the
    // members from k on when one was already written (each after a comma); first[k]: the
    // same when none was (no comma before the first).
    const size_t n = kvs.size();
    const std::string extra_kv = extra.empty() ? "" : "string ws \":\" ws " + extra;
    const std::string base = NewRule(hint + "-obj", "");
    std::vector<std::string> rest(n + 1), first(n + 1);
    rest[n] = NewRule(base + "-rest", extra.empty() ? "\"\"" : "(\",\" ws " + extra_kv + " ws)*");
    first[n] =
        NewRule(base + "-first", extra.empty() ? "\"\"" : "(" + extra_kv + " ws " + rest[n] + ")?");
    for (size_t k = n; k-- > 0;) {
      rest[k] = NewRule(base + "-rest", req[k] ? "\",\" ws " + kvs[k] + " ws " + rest[k + 1]
                                               : "(\",\" ws " + kvs[k] + " ws)? " + rest[k + 1]);
      first[k] =
          NewRule(base + "-first", req[k] ? kvs[k] + " ws " + rest[k + 1]
                                          : kvs[k] + " ws " + rest[k + 1] + " | " + first[k + 1]);
    }
    rules_[base] = "\"{\" ws " + first[0] + " \"}\"";
    return base;
  }

  StatusOr<std::string> Array(const json& s, const std::string& hint) {
    int64_t min_items = 0, max_items = -1;
    if (auto it = s.find("minItems"); it != s.end() && it->is_number_integer()) {
      min_items = it->get<int64_t>();
    }
    if (auto it = s.find("maxItems"); it != s.end() && it->is_number_integer()) {
      max_items = it->get<int64_t>();
    }
    if (min_items < 0 || (max_items >= 0 && max_items < min_items) || min_items > 10000 ||
        max_items > 10000) {
      return InvalidArgument("json_schema: bad minItems/maxItems");
    }
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument("json_schema: 'prefixItems' must be an array");
      std::string body = "\"[\" ws";
      for (size_t i = 0; i < it->size(); ++i) {
        PC_ASSIGN_OR_RETURN(std::string v, Visit((*it)[i], hint + "-item"));
        body += (i ? " \",\" ws " : " ") + v + " ws";
      }
      if (auto items = s.find("items"); items != s.end() && !(items->is_boolean() && !*items)) {
        PC_ASSIGN_OR_RETURN(std::string v, Visit(*items, hint + "-item"));
        body += " (\",\" ws " + v + " ws)*";
      }
      return NewRule(hint + "-tuple", body + " \"]\"");
    }
    std::string item = "value";
    if (auto it = s.find("items"); it != s.end()) {
      PC_ASSIGN_OR_RETURN(item, Visit(*it, hint + "-item"));
    }
    std::string body;
    if (max_items == 0) {
      body = "\"[\" ws \"]\"";
    } else {
      const std::string more =
          max_items < 0
              ? fmt::format("{{{},}}", std::max<int64_t>(min_items - 1, 0))
              : fmt::format("{{{},{}}}", std::max<int64_t>(min_items - 1, 0), max_items - 1);
      const std::string list = item + " ws (\",\" ws " + item + " ws)" + more;
      body = min_items == 0 ? "\"[\" ws (" + list + ")? \"]\"" : "\"[\" ws " + list + " \"]\"";
    }
    return NewRule(hint + "-array", body);
  }

  StatusOr<std::string> String(const json& s) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return InvalidArgument("json_schema: 'pattern' must be a string");
      if (has_len) {
        return Unimplemented("json_schema: 'pattern' together with minLength/maxLength");
      }
      PC_ASSIGN_OR_RETURN(std::string re, RegexToEbnf(it->get<std::string>(), true));
      return NewRule("pattern", "\"\\\"\" " + re + " \"\\\"\"");
    }
    if (auto it = s.find("format"); it != s.end() && it->is_string() && !has_len) {
      const std::string f = it->get<std::string>();
      const std::string date =
          R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))";
      const std::string time =
          R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
      std::string body;
      if (f == "date") body = date;
      if (f == "time") body = time;
      if (f == "date-time") body = date + " \"T\" " + time;
      if (f == "uuid") {
        body = R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})";
      }
      if (f == "email") {
        body =
            R"([a-zA-Z0-9_+-] [a-zA-Z0-9._+-]{0,30} "@" [a-zA-Z0-9] [a-zA-Z0-9-]{0,30} ("." [a-zA-Z] [a-zA-Z0-9-]{0,30}){1,3})";
      }
      if (f == "ipv4") {
        const std::string octet = IntRange(0, 255);
        body = octet + " (\".\" " + octet + "){3}";
      }
      if (f == "hostname") {
        body = R"([a-zA-Z0-9] [a-zA-Z0-9-]{0,30} ("." [a-zA-Z0-9] [a-zA-Z0-9-]{0,30}){0,4})";
      }
      if (f == "uri") {
        body = R"([a-zA-Z] [a-zA-Z0-9+.-]{0,15} "://" [a-zA-Z0-9._~%!$&'()*+,;=:@/?#-]{1,200})";
      }
      // Other formats are annotations (JSON Schema's default): any string.
      if (!body.empty()) return NewRule("format", "\"\\\"\" " + body + " \"\\\"\"");
    }
    if (!has_len) return std::string("string");
    int64_t lo = s.value("minLength", int64_t{0});
    int64_t hi = s.value("maxLength", int64_t{-1});
    if (lo < 0 || (hi >= 0 && hi < lo) || lo > 100000 || hi > 100000) {
      return InvalidArgument("json_schema: bad minLength/maxLength");
    }
    const std::string rep = hi < 0 ? fmt::format("{{{},}}", lo) : fmt::format("{{{},{}}}", lo, hi);
    return NewRule("string", "\"\\\"\" char" + rep + " \"\\\"\"");
  }

  // The bounds of a number schema, rounded inward to integers (a subset of the valid values,
  // so every output still validates).
  Status Bounds(const json& s, int64_t* lo, int64_t* hi, bool* bounded) {
    *lo = -kMaxIntMagnitude;
    *hi = kMaxIntMagnitude;
    *bounded = false;
    auto read = [&](const char* key, bool lower, bool exclusive) -> Status {
      auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) return Status::Ok();
      if (!it->is_number())
        return InvalidArgument(fmt::format("json_schema: '{}' must be a number", key));
      const double v = it->get<double>();
      *bounded = true;
      if (lower) {
        double c = std::ceil(v);
        if (exclusive && c == v) c += 1;
        *lo = std::max<int64_t>(*lo, static_cast<int64_t>(std::max<double>(c, -kMaxIntMagnitude)));
      } else {
        double f = std::floor(v);
        if (exclusive && f == v) f -= 1;
        *hi = std::min<int64_t>(*hi, static_cast<int64_t>(std::min<double>(f, kMaxIntMagnitude)));
      }
      return Status::Ok();
    };
    PC_RETURN_IF_ERROR(read("minimum", true, false));
    PC_RETURN_IF_ERROR(read("exclusiveMinimum", true, true));
    PC_RETURN_IF_ERROR(read("maximum", false, false));
    PC_RETURN_IF_ERROR(read("exclusiveMaximum", false, true));
    if (*lo > *hi) {
      return Unimplemented("json_schema: numeric bounds that hold no integer are not supported");
    }
    return Status::Ok();
  }

  StatusOr<std::string> Integer(const json& s) {
    int64_t lo, hi;
    bool bounded;
    PC_RETURN_IF_ERROR(Bounds(s, &lo, &hi, &bounded));
    if (!bounded) return std::string("integer");
    return NewRule("int", IntRange(lo, hi));
  }

  StatusOr<std::string> Number(const json& s) {
    int64_t lo, hi;
    bool bounded;
    PC_RETURN_IF_ERROR(Bounds(s, &lo, &hi, &bounded));
    if (!bounded) return std::string("number");
    // An integer part k may take a fraction when the whole interval it opens stays inside
    // [lo, hi]: [k, k+1) for k >= 0, (-(k+1), -k] for "-k".
    std::vector<std::string> frac;
    if (std::max<int64_t>(lo, 0) <= hi - 1)
      frac.push_back(IntRange(std::max<int64_t>(lo, 0), hi - 1));
    if (std::max<int64_t>(1, -hi) <= -lo - 1) {
      frac.push_back("\"-\" " + UnsignedRange(std::max<int64_t>(1, -hi), -lo - 1));
    }
    if (lo <= -1 && hi >= 0) frac.push_back("\"-0\"");
    std::string body = IntRange(lo, hi);
    if (!frac.empty()) body += " | " + Alts(frac) + " \".\" [0-9]{1,16}";
    return NewRule("num", body);
  }

  const json& root_;
  JsonSchemaOptions options_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> ref_rules_;
  int counter_ = 0;
};

}  // namespace

StatusOr<std::string> JsonSchemaToEbnf(const nlohmann::ordered_json& schema,
                                       const JsonSchemaOptions& options) {
  return Converter(schema, options).Run();
}

std::string JsonObjectEbnf(const JsonSchemaOptions& options) {
  auto r = JsonSchemaToEbnf(json{{"type", "object"}}, options);
  PC_CHECK(r.ok());
  return *r;
}

}  // namespace polychip::grammar
