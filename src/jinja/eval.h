// The evaluator: walks a Program with a set of variables and writes the output. eval.cc has
// statements and expressions, filters.cc the filters and tests, methods.cc the Python methods
// of str, list and dict and the global functions.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/ast.h"
#include "jinja/jinja.h"
#include "jinja/value.h"

namespace polychip::jinja::internal {

// A scope: a for-loop iteration, a macro call, a with block, the template itself.
struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  std::shared_ptr<Frame> parent;

  Value* FindLocal(std::string_view name) {
    for (auto& [k, v] : vars) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  void Set(std::string_view name, Value v) {
    if (Value* slot = FindLocal(name)) {
      *slot = std::move(v);
    } else {
      vars.emplace_back(std::string(name), std::move(v));
    }
  }
};
using FramePtr = std::shared_ptr<Frame>;

struct Callable {
  enum class Kind : uint8_t { kGlobal, kMethod, kMacro };
  Kind kind;
  std::string name;  // global or method name; the macro's name
  Value self;        // kMethod: the receiver
  const MacroDef* macro = nullptr;
  // The scope the macro was defined in. Weak: a frame holds its macros, and a macro holding
  // its frame would be a cycle that outlives the render.
  std::weak_ptr<Frame> closure;
};

struct LoopState {
  std::shared_ptr<const ListData> items;  // what the loop iterates (after its `if` filter)
  size_t index0 = 0;
  int depth0 = 0;
  const Node* node = nullptr;  // the for node, for `loop(...)` in recursive loops
  std::weak_ptr<Frame> frame;  // the frame the for node runs in
  bool has_changed = false;    // loop.changed(): the last arguments seen
  Value changed_last;
};

// Call arguments, Python style.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Renderer {
 public:
  Renderer(const Program& program, const RenderOptions& options);
  ~Renderer();
  StatusOr<std::string> Render(const nlohmann::ordered_json& variables);

  // ---- used across eval.cc, filters.cc, methods.cc --------------------------------------------
  StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
  StatusOr<Value> GetItem(const Value& obj, const Value& key);
  StatusOr<Value> CallValue(const Value& callee, Args args);
  StatusOr<Value> ApplyFilter(const std::string& name, const Value& input, Args args);
  StatusOr<bool> ApplyTest(const std::string& name, const Value& input, const Args& args);
  StatusOr<Value> CallMethod(const Value& self, const std::string& name, const Args& args);
  StatusOr<Value> CallGlobal(const std::string& name, const Args& args);
  // Python's iter(): list items, dict keys, string characters; Undefined iterates as empty.
  StatusOr<std::vector<Value>> Iterate(const Value& v);
  // The error a Value raises when used as it cannot be (an Undefined's own message).
  Status TypeError(const std::string& what, const Value& v) const;
  // Bounds a string or list a template builds (repetition, joins, ...) and charges its
  // building to the step budget.
  Status CheckSize(size_t bytes_or_items);
  Status Step(uint64_t n = 1);
  const RenderOptions& options() const { return options_; }
  bool IsGlobal(std::string_view name) const;
  void TrackNamespace(const std::shared_ptr<NamespaceData>& ns) { namespaces_.push_back(ns); }

 private:
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };

  Status RenderBody(const Body& body, const FramePtr& frame);
  Status RenderNode(const Node& node, const FramePtr& frame);
  Status RenderFor(const Node& node, const FramePtr& frame, const Value& iterable, int depth0);
  Status RenderToString(const Body& body, const FramePtr& frame, std::string* out);
  Status Assign(const Expr& target, const Value& value, const FramePtr& frame);
  Status Write(std::string_view s);

  StatusOr<Value> Eval(const Expr& e, const FramePtr& frame);
  StatusOr<Value> EvalInner(const Expr& e, const FramePtr& frame);
  StatusOr<Value> EvalCall(const Expr& e, const FramePtr& frame);
  StatusOr<Value> EvalSlice(const Expr& e, const FramePtr& frame);
  StatusOr<Value> EvalCompare(const Expr& e, const FramePtr& frame);
  StatusOr<Args> EvalArgs(const Expr& e, size_t first, const FramePtr& frame);
  StatusOr<Value> Lookup(const std::string& name, const FramePtr& frame);
  StatusOr<Value> CallMacro(const Callable& c, Args args);
  StatusOr<Value> LoopAttr(const Value& loop, const std::string& name);

  const Program& program_;
  const RenderOptions& options_;
  std::string* out_ = nullptr;
  uint64_t steps_ = 0;
  int depth_ = 0;
  int error_line_ = 0;
  Flow flow_ = Flow::kNormal;
  std::vector<std::shared_ptr<NamespaceData>> namespaces_;
  uint64_t written_ = 0;
};

// Binary operators with Python's semantics: + - * / // % ** and ~.
StatusOr<Value> BinaryOp(const std::string& op, const Value& a, const Value& b, Renderer& r);
// Whether `self.name` is a Python method the sandbox knows: 0 no such method, 1 a safe one,
// 2 one that mutates its receiver (ImmutableSandboxedEnvironment refuses those).
int MethodSafety(const Value& self, std::string_view name);
// `a in b`.
StatusOr<bool> Contains(const Value& container, const Value& item, Renderer& r);
// Python's "%" string formatting (the `format` filter and str % args).
StatusOr<std::string> PercentFormat(const std::string& fmt, const Value& args, Renderer& r);

}  // namespace polychip::jinja::internal
