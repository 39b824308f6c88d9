// The values a template computes with: Python's types as Jinja2 sees them (None, bool, int,
// float, str, list, tuple, dict, callables, namespace objects, the loop object) plus Jinja2's
// Undefined. Lists and dicts are immutable once built (the sandbox transformers uses forbids
// mutating them), so values share them by pointer; only namespace objects change in place.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "util/status.h"

namespace polychip::jinja::internal {

class Value;
struct Callable;   // eval.h: macros, builtin functions, bound methods
struct LoopState;  // eval.h: the `loop` variable of a for loop

struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
  // Not a list but a Python iterator or view with this type name ("generator" from map and
  // select, "dict_items" from d.items(), ...): iterable, but not JSON, not indexable, and a
  // generator is true even when empty. Templates meet these and Jinja2 answers accordingly.
  const char* iter_type = nullptr;
  int depth = 1;  // nesting, so that no template can build a structure too deep to destroy
};

// A Python dict: insertion ordered, keys compared with Python equality (1 == 1.0 == True).
struct DictData {
  std::vector<std::pair<Value, Value>> items;
  int depth = 1;
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Inserts or replaces, keeping the first insertion's position as Python does.
  void Set(Value key, Value value);
};

struct NamespaceData {
  DictData attrs;
};

// Jinja2's Undefined: renders empty, is falsy, iterates as empty; using it in any other way
// raises `hint` ("'x' is undefined", "'dict object' has no attribute 'y'").
struct Undefined {
  std::string hint;
};
struct NoneType {};

class Value {
 public:
  enum class Type : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable,
    kNamespace,
    kLoop
  };

  Value() : v_(Undefined{}) {}
  Value(bool b) : v_(b) {}                 // NOLINT
  Value(int v) : v_(int64_t{v}) {}         // NOLINT
  Value(int64_t v) : v_(v) {}              // NOLINT
  Value(double v) : v_(v) {}               // NOLINT
  Value(std::string s, bool safe = false)  // NOLINT
      : v_(std::make_shared<const std::string>(std::move(s))), safe_(safe) {}
  Value(const char* s) : Value(std::string(s)) {}                 // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}            // NOLINT
  Value(std::shared_ptr<const Callable> c) : v_(std::move(c)) {}  // NOLINT
  Value(std::shared_ptr<NamespaceData> n) : v_(std::move(n)) {}   // NOLINT
  Value(std::shared_ptr<LoopState> l) : v_(std::move(l)) {}       // NOLINT

  static Value None() {
    Value v;
    v.v_ = NoneType{};
    return v;
  }
  static Value MakeUndefined(std::string hint) {
    Value v;
    v.v_ = Undefined{std::move(hint)};
    return v;
  }
  static Value List(std::vector<Value> items, bool is_tuple = false);
  static Value Iter(std::vector<Value> items, const char* type_name);
  static Value Dict(DictData dict);

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::kUndefined; }
  bool is_none() const { return type() == Type::kNone; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_int() const { return type() == Type::kInt; }
  bool is_float() const { return type() == Type::kFloat; }
  // Python's numbers include bool.
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type() == Type::kString; }
  bool is_list() const { return type() == Type::kList && !list().iter_type; }  // list or tuple
  bool is_tuple() const { return is_list() && list().is_tuple; }
  bool is_iter() const { return type() == Type::kList && list().iter_type; }
  // A dict view (d.items(), d.keys(), d.values()): has a length, unlike a generator.
  bool is_view() const {
    return is_iter() && std::string_view(list().iter_type).rfind("dict_", 0) == 0;
  }
  bool is_dict() const { return type() == Type::kDict; }
  bool is_callable() const { return type() == Type::kCallable; }
  bool is_namespace() const { return type() == Type::kNamespace; }
  bool is_loop() const { return type() == Type::kLoop; }
  bool is_safe() const { return safe_; }  // a Markup string (|safe, |escape)

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const ListData& list() const { return *std::get<std::shared_ptr<const ListData>>(v_); }
  const DictData& dict() const { return *std::get<std::shared_ptr<const DictData>>(v_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(v_); }
  const std::shared_ptr<const Callable>& callable_ptr() const {
    return std::get<std::shared_ptr<const Callable>>(v_);
  }
  NamespaceData& ns() const { return *std::get<std::shared_ptr<NamespaceData>>(v_); }
  const std::shared_ptr<NamespaceData>& ns_ptr() const {
    return std::get<std::shared_ptr<NamespaceData>>(v_);
  }
  LoopState& loop() const { return *std::get<std::shared_ptr<LoopState>>(v_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(v_).hint; }

  // Integer value of a bool or int (Python's bool is an int).
  int64_t AsInt() const { return is_bool() ? (as_bool() ? 1 : 0) : as_int(); }
  double AsDouble() const { return is_float() ? as_float() : static_cast<double>(AsInt()); }
  int depth() const;

  bool Truthy() const;
  // Python's str() and repr().
  std::string Str() const;
  std::string Repr() const;
  // "str", "int", "dict", ... as Python's type(x).__name__.
  std::string TypeName() const;

 private:
  // Strings are shared: templates copy values freely (loop variables, list concatenation).
  std::variant<Undefined, NoneType, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
               std::shared_ptr<const Callable>, std::shared_ptr<NamespaceData>,
               std::shared_ptr<LoopState>>
      v_;
  bool safe_ = false;
};

// Python ==.
bool Equal(const Value& a, const Value& b);
// Python <, for numbers, strings and sequences; an error names the two types.
StatusOr<bool> Less(const Value& a, const Value& b);

// Python float repr: shortest round trip, "1.0", "1e+16", "inf".
std::string FormatFloat(double d);
// Python's repr of a str: quotes chosen as Python chooses them, escapes for the unprintable.
std::string ReprString(std::string_view s);

// Variables in: JSON (an ordered object keeps its key order, as a Python dict would).
StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int max_depth);

// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...), byte for byte.
struct JsonOptions {
  std::string indent;   // per level
  bool pretty = false;  // indent given (even ""): newlines between items
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// UTF-8 helpers: templates index and slice strings by code point as Python does.
std::vector<uint32_t> DecodeUtf8(std::string_view s);
void AppendUtf8(std::string* out, uint32_t cp);
size_t CodepointCount(std::string_view s);
bool IsAscii(std::string_view s);
// Python's str.isspace() of one code point (the set str.split() and str.strip() use).
bool IsPySpace(uint32_t cp);

}  // namespace polychip::jinja::internal
