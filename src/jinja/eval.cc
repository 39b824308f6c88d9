// Statements and expressions. Scoping follows Jinja2: each for-loop iteration, macro call,
// with block and generation block is a new frame whose assignments vanish when it ends (hence
// namespace()); if blocks share their parent's frame.
#include "jinja/eval.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace polychip::jinja::internal {

Renderer::Renderer(const Program& program, const RenderOptions& options)
    : program_(program), options_(options) {}

Renderer::~Renderer() {
  // Namespaces are the only mutable objects, so the only way to a reference cycle (a namespace
  // holding itself): emptying them all frees what they hold without deep recursion.
  for (auto& ns : namespaces_) ns->attrs.items.clear();
}

StatusOr<std::string> Renderer::Render(const nlohmann::ordered_json& variables) {
  auto root = std::make_shared<Frame>();
  if (!variables.is_object() && !variables.is_null()) {
    return InvalidArgument(program_.name + ": variables must be a JSON object");
  }
  if (variables.is_object()) {
    for (const auto& [k, v] : variables.items()) {
      auto value = FromJson(v, options_.limits.max_depth);
      if (!value.ok()) return InvalidArgument(program_.name + ": " + value.status().message());
      root->Set(k, std::move(value).value());
    }
  }
  std::string out;
  out_ = &out;
  Status st = RenderBody(program_.body, root);
  if (!st.ok()) {
    return Status(st.code(),
                  program_.name + " line " + std::to_string(error_line_) + ": " + st.message());
  }
  return out;
}

Status Renderer::Step(uint64_t n) {
  steps_ += n;
  if (steps_ > options_.limits.max_steps) {
    return ResourceExhausted("template evaluation exceeded " +
                             std::to_string(options_.limits.max_steps) + " steps");
  }
  return Status::Ok();
}

Status Renderer::CheckSize(size_t n) {
  if (n > options_.limits.max_output_bytes) {
    return ResourceExhausted("template built a value over " +
                             std::to_string(options_.limits.max_output_bytes) + " bytes");
  }
  return Step(n / 64);
}

Status Renderer::Write(std::string_view s) {
  written_ += s.size();
  if (written_ > options_.limits.max_output_bytes) {
    return ResourceExhausted("template output exceeded " +
                             std::to_string(options_.limits.max_output_bytes) + " bytes");
  }
  out_->append(s);
  return Status::Ok();
}

Status Renderer::TypeError(const std::string& what, const Value& v) const {
  if (v.is_undefined()) return InvalidArgument(v.undefined_hint());
  return InvalidArgument(what);
}

// ---------------------------------------------------------------------------------------------
// Statements

Status Renderer::RenderBody(const Body& body, const FramePtr& frame) {
  for (const auto& node : body) {
    PC_RETURN_IF_ERROR(Step());
    Status st = RenderNode(*node, frame);
    if (!st.ok()) {
      if (error_line_ == 0) error_line_ = node->line;
      return st;
    }
    if (flow_ != Flow::kNormal) return Status::Ok();
  }
  return Status::Ok();
}

Status Renderer::RenderToString(const Body& body, const FramePtr& frame, std::string* out) {
  std::string* saved = out_;
  out_ = out;
  Status st = RenderBody(body, frame);
  out_ = saved;
  return st;
}

namespace {
FramePtr Child(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}
}  // namespace

Status Renderer::RenderNode(const Node& node, const FramePtr& frame) {
  switch (node.kind) {
    case NodeKind::kText:
      return Write(node.text);
    case NodeKind::kOutput: {
      PC_ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0], frame));
      if (v.is_string()) return Write(v.str());
      return Write(v.Str());
    }
    case NodeKind::kIf: {
      for (size_t i = 0; i < node.exprs.size(); ++i) {
        PC_ASSIGN_OR_RETURN(Value c, Eval(*node.exprs[i], frame));
        if (c.Truthy()) return RenderBody(node.bodies[i], frame);
      }
      if (node.bodies.size() > node.exprs.size()) return RenderBody(node.bodies.back(), frame);
      return Status::Ok();
    }
    case NodeKind::kFor: {
      PC_ASSIGN_OR_RETURN(Value iterable, Eval(*node.exprs[0], frame));
      return RenderFor(node, frame, iterable, 0);
    }
    case NodeKind::kSet: {
      PC_ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0], frame));
      return Assign(*node.target, v, frame);
    }
    case NodeKind::kSetBlock:
    case NodeKind::kFilterBlock: {
      std::string text;
      PC_RETURN_IF_ERROR(RenderToString(node.bodies[0], Child(frame), &text));
      Value v(std::move(text));
      // The filter chain's innermost input is the block's text.
      std::vector<const Expr*> chain;
      for (const Expr* f = node.exprs[0].get(); f; f = f->args[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        PC_ASSIGN_OR_RETURN(Args args, EvalArgs(**it, 1, frame));
        PC_ASSIGN_OR_RETURN(v, ApplyFilter((*it)->name, v, std::move(args)));
      }
      if (node.kind == NodeKind::kFilterBlock) return Write(v.Str());
      return Assign(*node.target, v, frame);
    }
    case NodeKind::kMacro: {
      auto c = std::make_shared<Callable>();
      c->kind = Callable::Kind::kMacro;
      c->name = node.macro->name;
      c->macro = node.macro.get();
      c->closure = frame;
      frame->Set(node.macro->name, Value(std::shared_ptr<const Callable>(std::move(c))));
      return Status::Ok();
    }
    case NodeKind::kCallBlock: {
      const Expr& call = *node.exprs[0];
      auto c = std::make_shared<Callable>();
      c->kind = Callable::Kind::kMacro;
      c->name = "caller";
      c->macro = node.macro.get();
      c->closure = frame;
      PC_ASSIGN_OR_RETURN(Value callee, Eval(*call.args[0], frame));
      PC_ASSIGN_OR_RETURN(Args args, EvalArgs(call, 1, frame));
      args.kw.emplace_back("caller", Value(std::shared_ptr<const Callable>(std::move(c))));
      PC_ASSIGN_OR_RETURN(Value v, CallValue(callee, std::move(args)));
      return Write(v.Str());
    }
    case NodeKind::kWith: {
      auto inner = Child(frame);
      const size_t n = node.exprs.size() / 2;
      for (size_t i = 0; i < n; ++i) {
        PC_ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[n + i], frame));
        PC_RETURN_IF_ERROR(Assign(*node.exprs[i], v, inner));
      }
      return RenderBody(node.bodies[0], inner);
    }
    case NodeKind::kBreak:
      flow_ = Flow::kBreak;
      return Status::Ok();
    case NodeKind::kContinue:
      flow_ = Flow::kContinue;
      return Status::Ok();
    case NodeKind::kScope:
      return RenderBody(node.bodies[0], Child(frame));
  }
  return Internal("unknown node");
}

Status Renderer::RenderFor(const Node& node, const FramePtr& frame, const Value& iterable,
                           int depth0) {
  if (depth_ >= options_.limits.max_depth) {
    return ResourceExhausted("template recursion deeper than " +
                             std::to_string(options_.limits.max_depth));
  }
  PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
  PC_RETURN_IF_ERROR(Step(items.size()));
  if (const Expr* filter = node.exprs[1].get()) {
    std::vector<Value> kept;
    for (auto& item : items) {
      auto scope = Child(frame);
      PC_RETURN_IF_ERROR(Assign(*node.target, item, scope));
      PC_ASSIGN_OR_RETURN(Value keep, Eval(*filter, scope));
      if (keep.Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (node.bodies.size() > 1) return RenderBody(node.bodies[1], Child(frame));
    return Status::Ok();
  }
  auto state = std::make_shared<LoopState>();
  auto list = std::make_shared<ListData>();
  list->items = std::move(items);
  state->items = list;
  state->depth0 = depth0;
  state->node = &node;
  state->frame = frame;
  const Value loop_value(state);
  ++depth_;
  Status st = Status::Ok();
  for (size_t i = 0; i < list->items.size(); ++i) {
    st = Step();
    if (!st.ok()) break;
    state->index0 = i;
    auto scope = Child(frame);
    st = Assign(*node.target, list->items[i], scope);
    if (!st.ok()) break;
    scope->Set("loop", loop_value);
    st = RenderBody(node.bodies[0], scope);
    if (!st.ok()) break;
    if (flow_ == Flow::kBreak) {
      flow_ = Flow::kNormal;
      break;
    }
    flow_ = Flow::kNormal;
  }
  --depth_;
  return st;
}

Status Renderer::Assign(const Expr& target, const Value& value, const FramePtr& frame) {
  switch (target.kind) {
    case ExprKind::kName:
      frame->Set(target.name, value);
      return Status::Ok();
    case ExprKind::kTuple: {
      PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
      if (items.size() != target.args.size()) {
        return InvalidArgument(
            std::string(items.size() < target.args.size() ? "not enough" : "too many") +
            " values to unpack (expected " + std::to_string(target.args.size()) + ", got " +
            std::to_string(items.size()) + ")");
      }
      for (size_t i = 0; i < items.size(); ++i) {
        PC_RETURN_IF_ERROR(Assign(*target.args[i], items[i], frame));
      }
      return Status::Ok();
    }
    case ExprKind::kGetAttr: {
      PC_ASSIGN_OR_RETURN(Value ns, Lookup(target.args[0]->name, frame));
      if (!ns.is_namespace()) {
        return InvalidArgument("cannot assign attribute on non-namespace object");
      }
      if (value.depth() >= options_.limits.max_depth) {
        return ResourceExhausted("value nested too deeply");
      }
      ns.ns().attrs.Set(Value(target.name), value);
      return Status::Ok();
    }
    default:
      return InvalidArgument("cannot assign to this expression");
  }
}

// ---------------------------------------------------------------------------------------------
// Expressions

StatusOr<Value> Renderer::Eval(const Expr& e, const FramePtr& frame) {
  if (depth_ >= options_.limits.max_depth * 4) {
    return ResourceExhausted("template recursion deeper than " +
                             std::to_string(options_.limits.max_depth));
  }
  PC_RETURN_IF_ERROR(Step());
  ++depth_;
  StatusOr<Value> r = EvalInner(e, frame);
  --depth_;
  if (!r.ok()) {
    if (error_line_ == 0) error_line_ = e.line;
    return r;
  }
  if (r->depth() > options_.limits.max_depth) {
    error_line_ = error_line_ ? error_line_ : e.line;
    return ResourceExhausted("value nested too deeply");
  }
  return r;
}

StatusOr<Value> Renderer::Lookup(const std::string& name, const FramePtr& frame) {
  for (Frame* f = frame.get(); f; f = f->parent.get()) {
    if (Value* v = f->FindLocal(name)) return *v;
  }
  if (IsGlobal(name)) {
    auto c = std::make_shared<Callable>();
    c->kind = Callable::Kind::kGlobal;
    c->name = name;
    return Value(std::shared_ptr<const Callable>(std::move(c)));
  }
  return Value::MakeUndefined("'" + name + "' is undefined");
}

StatusOr<Value> Renderer::EvalInner(const Expr& e, const FramePtr& frame) {
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return Lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) {
        PC_ASSIGN_OR_RETURN(Value v, Eval(*a, frame));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items), e.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      DictData d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        PC_ASSIGN_OR_RETURN(Value k, Eval(*e.args[i], frame));
        PC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], frame));
        if (k.is_list() && !k.is_tuple()) return InvalidArgument("unhashable type: 'list'");
        if (k.is_dict()) return InvalidArgument("unhashable type: 'dict'");
        d.Set(std::move(k), std::move(v));
      }
      return Value::Dict(std::move(d));
    }
    case ExprKind::kGetAttr: {
      PC_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      return GetAttr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      PC_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
      PC_ASSIGN_OR_RETURN(Value key, Eval(*e.args[1], frame));
      return GetItem(obj, key);
    }
    case ExprKind::kSlice:
      return EvalSlice(e, frame);
    case ExprKind::kCall:
      return EvalCall(e, frame);
    case ExprKind::kFilter: {
      PC_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0], frame));
      PC_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1, frame));
      return ApplyFilter(e.name, input, std::move(args));
    }
    case ExprKind::kTest: {
      PC_ASSIGN_OR_RETURN(Value input, Eval(*e.args[0], frame));
      PC_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1, frame));
      PC_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, input, args));
      return Value(r);
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      PC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      const bool neg = e.kind == ExprKind::kNeg;
      if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        const int64_t i = v.AsInt();
        if (neg && i == std::numeric_limits<int64_t>::min()) {
          return InvalidArgument("integer overflow");
        }
        return Value(neg ? -i : i);
      }
      return TypeError(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": '" +
                           v.TypeName() + "'",
                       v);
    }
    case ExprKind::kNot: {
      PC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[0], frame));
      return Value(!v.Truthy());
    }
    case ExprKind::kBinary: {
      PC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
      PC_ASSIGN_OR_RETURN(Value b, Eval(*e.args[1], frame));
      return BinaryOp(e.name, a, b, *this);
    }
    case ExprKind::kAnd:
    case ExprKind::kOr: {
      PC_ASSIGN_OR_RETURN(Value a, Eval(*e.args[0], frame));
      if (a.Truthy() == (e.kind == ExprKind::kOr)) return a;
      return Eval(*e.args[1], frame);
    }
    case ExprKind::kCompare:
      return EvalCompare(e, frame);
    case ExprKind::kCondExpr: {
      PC_ASSIGN_OR_RETURN(Value c, Eval(*e.args[0], frame));
      if (c.Truthy()) return Eval(*e.args[1], frame);
      if (e.args[2]) return Eval(*e.args[2], frame);
      return Value::MakeUndefined("the inline if-expression on line " + std::to_string(e.line) +
                                  " evaluated to false and no else section was defined.");
    }
  }
  return Internal("unknown expression");
}

StatusOr<Value> Renderer::EvalCompare(const Expr& e, const FramePtr& frame) {
  PC_ASSIGN_OR_RETURN(Value left, Eval(*e.args[0], frame));
  for (size_t i = 0; i < e.ops.size(); ++i) {
    PC_ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1], frame));
    const std::string& op = e.ops[i];
    bool r;
    if (op == "==") {
      r = Equal(left, right);
    } else if (op == "!=") {
      r = !Equal(left, right);
    } else if (op == "in" || op == "not in") {
      PC_ASSIGN_OR_RETURN(r, Contains(right, left, *this));
      if (op == "not in") r = !r;
    } else {
      // Python's <= on sequences is lexicographic like <; on numbers and strings a < b or ==.
      const bool swap = op == ">" || op == "<=";
      PC_ASSIGN_OR_RETURN(bool less, swap ? Less(right, left) : Less(left, right));
      r = (op == "<" || op == ">") ? less : !less;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

StatusOr<Args> Renderer::EvalArgs(const Expr& e, size_t first, const FramePtr& frame) {
  Args args;
  for (size_t i = first; i < e.args.size(); ++i) {
    PC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i], frame));
    args.pos.push_back(std::move(v));
  }
  for (const auto& [k, expr] : e.kwargs) {
    PC_ASSIGN_OR_RETURN(Value v, Eval(*expr, frame));
    args.kw.emplace_back(k, std::move(v));
  }
  if (e.star_args) {
    PC_ASSIGN_OR_RETURN(Value v, Eval(*e.star_args, frame));
    PC_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    for (auto& item : items) args.pos.push_back(std::move(item));
  }
  if (e.star_kwargs) {
    PC_ASSIGN_OR_RETURN(Value v, Eval(*e.star_kwargs, frame));
    if (!v.is_dict()) return TypeError("argument after ** must be a mapping", v);
    for (const auto& [k, val] : v.dict().items) {
      if (!k.is_string()) return InvalidArgument("keywords must be strings");
      args.kw.emplace_back(k.str(), val);
    }
  }
  return args;
}

StatusOr<Value> Renderer::EvalCall(const Expr& e, const FramePtr& frame) {
  PC_ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0], frame));
  PC_ASSIGN_OR_RETURN(Args args, EvalArgs(e, 1, frame));
  return CallValue(callee, std::move(args));
}

namespace {

// Python's slice.indices(): clamps start and stop to the sequence for the step's direction.
void SliceIndices(int64_t len, const std::optional<int64_t>& start_in,
                  const std::optional<int64_t>& stop_in, int64_t step, int64_t* start,
                  int64_t* stop) {
  auto adjust = [&](const std::optional<int64_t>& v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += len;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= len) {
      x = step < 0 ? len - 1 : len;
    }
    return x;
  };
  *start = adjust(start_in, step < 0 ? len - 1 : 0);
  *stop = adjust(stop_in, step < 0 ? -1 : len);
}

}  // namespace

StatusOr<Value> Renderer::EvalSlice(const Expr& e, const FramePtr& frame) {
  PC_ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0], frame));
  std::optional<int64_t> parts[3];
  for (int i = 0; i < 3; ++i) {
    if (!e.args[i + 1]) continue;
    PC_ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1], frame));
    if (v.is_none()) continue;
    // A non-integer bound is a TypeError inside Python's indexing, which Jinja2's getitem
    // turns into an undefined value.
    if (!v.is_int() && !v.is_bool()) {
      if (obj.is_undefined()) return InvalidArgument(obj.undefined_hint());
      return Value::MakeUndefined("slice indices must be integers or None");
    }
    parts[i] = v.AsInt();
  }
  const int64_t step = parts[2].value_or(1);
  if (step == 0) return InvalidArgument("slice step cannot be zero");
  if (obj.is_undefined()) return InvalidArgument(obj.undefined_hint());
  auto pick = [&](int64_t len, auto&& take) {
    int64_t start, stop;
    SliceIndices(len, parts[0], parts[1], step, &start, &stop);
    // Counted in unsigned steps: a step near the int64 edge must not overflow the index.
    const uint64_t ustep = step > 0 ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    const uint64_t span = step > 0 ? (stop > start ? static_cast<uint64_t>(stop - start) : 0)
                                   : (start > stop ? static_cast<uint64_t>(start - stop) : 0);
    const uint64_t n = span == 0 ? 0 : 1 + (span - 1) / ustep;
    for (uint64_t k = 0; k < n; ++k) {
      const auto offset = static_cast<int64_t>(k * ustep);  // < span <= len
      take(step > 0 ? start + offset : start - offset);
    }
  };
  if (obj.is_string()) {
    const std::string& s = obj.str();
    std::string out;
    if (IsAscii(s)) {
      pick(static_cast<int64_t>(s.size()), [&](int64_t i) { out.push_back(s[i]); });
    } else {
      const auto cps = DecodeUtf8(s);
      pick(static_cast<int64_t>(cps.size()), [&](int64_t i) { AppendUtf8(&out, cps[i]); });
    }
    return Value(std::move(out));
  }
  if (obj.is_list()) {
    const auto& items = obj.list().items;
    std::vector<Value> out;
    pick(static_cast<int64_t>(items.size()), [&](int64_t i) { out.push_back(items[i]); });
    return Value::List(std::move(out), obj.is_tuple());
  }
  return Value::MakeUndefined("'" + obj.TypeName() + " object' is not subscriptable");
}

// ---------------------------------------------------------------------------------------------
// Attributes, items, calls

namespace {
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return v.TypeName() + " object";
}
}  // namespace

StatusOr<Value> Renderer::GetAttr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) return InvalidArgument(obj.undefined_hint());
  if (obj.is_loop()) return LoopAttr(obj, name);
  if (obj.is_namespace()) {
    if (const Value* v = obj.ns().attrs.Find(std::string_view(name))) return *v;
  } else if (const int safety = MethodSafety(obj, name)) {
    if (safety == 2) {
      return Value::MakeUndefined("access to attribute '" + name + "' of '" + obj.TypeName() +
                                  "' object is unsafe.");
    }
    auto c = std::make_shared<Callable>();
    c->kind = Callable::Kind::kMethod;
    c->name = name;
    c->self = obj;
    return Value(std::shared_ptr<const Callable>(std::move(c)));
  } else if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(std::string_view(name))) return *v;
  }
  return Value::MakeUndefined("'" + ObjectTypeRepr(obj) + "' has no attribute '" + name + "'");
}

StatusOr<Value> Renderer::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return InvalidArgument(obj.undefined_hint());
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.AsInt();
    if (obj.is_list()) {
      const auto& items = obj.list().items;
      const auto n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return items[i];
    } else {
      const std::string& s = obj.str();
      if (IsAscii(s)) {
        const auto n = static_cast<int64_t>(s.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return Value(std::string(1, s[i]));
      } else {
        const auto cps = DecodeUtf8(s);
        const auto n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string out;
          AppendUtf8(&out, cps[i]);
          return Value(std::move(out));
        }
      }
    }
  }
  // Jinja2 falls back to the attribute of that name (`d['items']` is the method when no key).
  if (key.is_string()) {
    if (!obj.is_dict() || MethodSafety(obj, key.str())) return GetAttr(obj, key.str());
    return Value::MakeUndefined("'" + ObjectTypeRepr(obj) + "' has no attribute '" + key.str() +
                                "'");
  }
  return Value::MakeUndefined("'" + ObjectTypeRepr(obj) + "' has no element " + key.Repr());
}

StatusOr<Value> Renderer::LoopAttr(const Value& loop, const std::string& name) {
  const LoopState& s = loop.loop();
  const auto n = static_cast<int64_t>(s.items->items.size());
  const auto i = static_cast<int64_t>(s.index0);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(int64_t{s.depth0} + 1);
  if (name == "depth0") return Value(int64_t{s.depth0});
  if (name == "previtem") {
    if (i == 0) return Value::MakeUndefined("there is no previous item");
    return s.items->items[i - 1];
  }
  if (name == "nextitem") {
    if (i + 1 >= n) return Value::MakeUndefined("there is no next item");
    return s.items->items[i + 1];
  }
  if (name == "cycle" || name == "changed") {
    auto c = std::make_shared<Callable>();
    c->kind = Callable::Kind::kMethod;
    c->name = name;
    c->self = loop;
    return Value(std::shared_ptr<const Callable>(std::move(c)));
  }
  return Value::MakeUndefined("'LoopContext object' has no attribute '" + name + "'");
}

StatusOr<Value> Renderer::CallValue(const Value& callee, Args args) {
  if (callee.is_undefined()) return InvalidArgument(callee.undefined_hint());
  if (callee.is_loop()) {
    LoopState& s = callee.loop();
    if (!s.node->recursive) {
      return InvalidArgument(
          "Tried to call non recursive loop. Maybe you forgot the 'recursive' modifier.");
    }
    if (args.pos.size() != 1 || !args.kw.empty()) {
      return InvalidArgument("loop() takes exactly one argument");
    }
    FramePtr frame = s.frame.lock();
    if (!frame) return InvalidArgument("loop called outside of its scope");
    std::string text;
    std::string* saved = out_;
    out_ = &text;
    Status st = RenderFor(*s.node, frame, args.pos[0], s.depth0 + 1);
    out_ = saved;
    PC_RETURN_IF_ERROR(st);
    return Value(std::move(text));
  }
  if (!callee.is_callable()) {
    return InvalidArgument("'" + callee.TypeName() + "' object is not callable");
  }
  const Callable& c = callee.callable();
  switch (c.kind) {
    case Callable::Kind::kGlobal:
      return CallGlobal(c.name, args);
    case Callable::Kind::kMethod:
      return CallMethod(c.self, c.name, args);
    case Callable::Kind::kMacro:
      return CallMacro(c, std::move(args));
  }
  return Internal("unknown callable");
}

StatusOr<Value> Renderer::CallMacro(const Callable& c, Args args) {
  if (depth_ >= options_.limits.max_depth) {
    return ResourceExhausted("template recursion deeper than " +
                             std::to_string(options_.limits.max_depth));
  }
  FramePtr closure = c.closure.lock();
  if (!closure) return InvalidArgument("macro '" + c.name + "' called outside of its scope");
  const MacroDef& def = *c.macro;
  auto frame = Child(closure);
  const size_t n = def.params.size();
  std::vector<bool> given(n, false);
  for (size_t i = 0; i < args.pos.size() && i < n; ++i) {
    frame->Set(def.params[i], std::move(args.pos[i]));
    given[i] = true;
  }
  std::vector<Value> extra;
  for (size_t i = n; i < args.pos.size(); ++i) extra.push_back(std::move(args.pos[i]));
  if (!extra.empty() && !def.uses_varargs) {
    return InvalidArgument("macro '" + def.name + "' takes not more than " + std::to_string(n) +
                           " argument(s)");
  }
  DictData kwargs;
  Value caller = Value::MakeUndefined("No caller defined");
  for (auto& [k, v] : args.kw) {
    auto it = std::find(def.params.begin(), def.params.end(), k);
    if (it != def.params.end()) {
      const size_t i = static_cast<size_t>(it - def.params.begin());
      if (given[i]) {
        return InvalidArgument("macro '" + def.name + "' got multiple values for argument '" + k +
                               "'");
      }
      frame->Set(k, std::move(v));
      given[i] = true;
    } else if (k == "caller" && def.uses_caller) {
      caller = std::move(v);
    } else if (def.uses_kwargs) {
      kwargs.Set(Value(k), std::move(v));
    } else {
      return InvalidArgument("macro '" + def.name + "' takes no keyword argument '" + k + "'");
    }
  }
  const size_t first_default = n - def.defaults.size();
  ++depth_;
  for (size_t i = 0; i < n; ++i) {
    if (given[i]) continue;
    if (i >= first_default) {
      auto v = Eval(*def.defaults[i - first_default], frame);
      if (!v.ok()) {
        --depth_;
        return v.status();
      }
      frame->Set(def.params[i], std::move(v).value());
    } else {
      frame->Set(def.params[i],
                 Value::MakeUndefined("parameter '" + def.params[i] + "' was not provided"));
    }
  }
  if (def.uses_varargs) frame->Set("varargs", Value::List(std::move(extra), true));
  if (def.uses_kwargs) frame->Set("kwargs", Value::Dict(std::move(kwargs)));
  if (def.uses_caller) frame->Set("caller", std::move(caller));
  std::string text;
  Status st = RenderToString(def.body, frame, &text);
  --depth_;
  PC_RETURN_IF_ERROR(st);
  return Value(std::move(text));
}

StatusOr<std::vector<Value>> Renderer::Iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return std::vector<Value>{};
    case Value::Type::kList:
      return v.list().items;
    case Value::Type::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().items.size());
      for (const auto& [k, val] : v.dict().items) keys.push_back(k);
      return keys;
    }
    case Value::Type::kString: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      if (IsAscii(s)) {
        for (char c : s) chars.emplace_back(std::string(1, c));
      } else {
        for (uint32_t cp : DecodeUtf8(s)) {
          std::string c;
          AppendUtf8(&c, cp);
          chars.emplace_back(std::move(c));
        }
      }
      return chars;
    }
    default:
      return InvalidArgument("'" + v.TypeName() + "' object is not iterable");
  }
}

}  // namespace polychip::jinja::internal
