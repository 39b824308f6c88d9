// Recursive descent over the tokens, following Jinja2's parser (jinja2/parser.py) rule by rule
// so that precedence and the odd corners (tests taking one bare argument, filters binding to
// the unary operand, tuples without parentheses) come out as Jinja2 has them.
#include <algorithm>
#include <initializer_list>

#include "jinja/ast.h"

namespace polychip::jinja::internal {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string name, int max_depth)
      : toks_(std::move(tokens)), name_(std::move(name)), max_depth_(max_depth) {}

  StatusOr<std::shared_ptr<Program>> Run() {
    auto program = std::make_shared<Program>();
    program->name = name_;
    PC_RETURN_IF_ERROR(Subparse({}, &program->body));
    for (const Unknown& u : unknown_) {
      if (!u.soft) {
        return Fail(
            std::string("No ") + (u.filter ? "filter" : "test") + " named '" + u.name + "'.",
            u.line);
      }
    }
    return program;
  }

 private:
  // ---- token stream ------------------------------------------------------------------------
  const Token& Cur() const { return toks_[pos_]; }
  const Token& Look(size_t k = 1) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }
  bool IsOp(const Token& t, std::string_view op) const {
    return t.type == TokenType::kOp && t.value == op;
  }
  bool IsOp(std::string_view op) const { return IsOp(Cur(), op); }
  bool IsName(const Token& t, std::string_view n) const {
    return t.type == TokenType::kName && t.value == n;
  }
  bool IsName(std::string_view n) const { return IsName(Cur(), n); }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view n) {
    if (!IsName(n)) return false;
    Advance();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kText:
        return "template data";
      case TokenType::kVarBegin:
        return "begin of print statement";
      case TokenType::kVarEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kString:
        return "string";
      case TokenType::kInt:
        return "integer";
      case TokenType::kFloat:
        return "float";
      case TokenType::kEof:
        return "end of template";
      default:
        return t.value;
    }
  }

  Status Fail(const std::string& what, int line = 0) const {
    return InvalidArgument(name_ + " line " + std::to_string(line ? line : Cur().line) + ": " +
                           what);
  }
  Status Expected(const std::string& what) const {
    return Fail("expected " + what + ", got '" + Describe(Cur()) + "'");
  }
  Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Expected("'" + std::string(op) + "'");
    return Status::Ok();
  }
  Status ExpectName(std::string_view n) {
    if (!SkipName(n)) return Expected("'" + std::string(n) + "'");
    return Status::Ok();
  }
  StatusOr<std::string> ExpectAnyName() {
    if (Cur().type != TokenType::kName) return Expected("a name");
    std::string n = Cur().value;
    Advance();
    return n;
  }
  Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Expected("end of statement block");
    Advance();
    return Status::Ok();
  }

  ExprPtr Make(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Bounds the parser's (and so the evaluator's) recursion over the tree.
  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  Status CheckDepth() const {
    if (depth_ > max_depth_) return Fail("template nested too deeply");
    return Status::Ok();
  }

  // ---- statements ---------------------------------------------------------------------------
  // Parses nodes until a block tag named in `end` (left as the current token) or the end.
  Status Subparse(std::initializer_list<std::string_view> end, Body* body) {
    DepthGuard guard(&depth_);
    PC_RETURN_IF_ERROR(CheckDepth());
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case TokenType::kText: {
          auto n = std::make_unique<Node>();
          n->kind = NodeKind::kText;
          n->line = t.line;
          n->text = t.value;
          body->push_back(std::move(n));
          Advance();
          break;
        }
        case TokenType::kVarBegin: {
          const int line = t.line;
          Advance();
          PC_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, false));
          if (Cur().type != TokenType::kVarEnd) return Expected("end of print statement");
          Advance();
          auto n = std::make_unique<Node>();
          n->kind = NodeKind::kOutput;
          n->line = line;
          n->exprs.push_back(std::move(e));
          body->push_back(std::move(n));
          break;
        }
        case TokenType::kBlockBegin: {
          Advance();
          if (Cur().type == TokenType::kName &&
              std::find(end.begin(), end.end(), Cur().value) != end.end()) {
            return Status::Ok();
          }
          PC_ASSIGN_OR_RETURN(auto node, ParseStatement());
          body->push_back(std::move(node));
          PC_RETURN_IF_ERROR(ExpectBlockEnd());
          break;
        }
        case TokenType::kEof: {
          if (end.size() == 0) return Status::Ok();
          std::string names;
          for (auto e : end) names += (names.empty() ? "'" : " or '") + std::string(e) + "'";
          return Fail("unexpected end of template, expected " + names);
        }
        default:
          return Fail("unexpected '" + Describe(t) + "'");
      }
    }
  }

  // After a statement's head: "%}", the body up to one of `end`; with `drop`, also the end name.
  Status ParseStatements(std::initializer_list<std::string_view> end, Body* body, bool drop) {
    SkipOp(":");
    PC_RETURN_IF_ERROR(ExpectBlockEnd());
    PC_RETURN_IF_ERROR(Subparse(end, body));
    if (Cur().type == TokenType::kEof) return Fail("unexpected end of template");
    if (drop) Advance();
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<Node>> ParseStatement() {
    if (Cur().type != TokenType::kName) return Fail("tag name expected");
    const std::string tag = Cur().value;
    const int line = Cur().line;
    auto n = std::make_unique<Node>();
    n->line = line;
    Advance();
    if (tag == "if") {
      n->kind = NodeKind::kIf;
      SoftScope soft(&soft_, true);
      while (true) {
        PC_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, false, {}, false));
        n->exprs.push_back(std::move(cond));
        n->bodies.emplace_back();
        PC_RETURN_IF_ERROR(ParseStatements({"elif", "else", "endif"}, &n->bodies.back(), false));
        const std::string which = Cur().value;
        Advance();
        if (which == "elif") continue;
        if (which == "else") {
          n->bodies.emplace_back();
          PC_RETURN_IF_ERROR(ParseStatements({"endif"}, &n->bodies.back(), true));
        }
        break;
      }
    } else if (tag == "for") {
      n->kind = NodeKind::kFor;
      PC_ASSIGN_OR_RETURN(n->target, ParseAssignTarget({"in"}, false));
      PC_RETURN_IF_ERROR(ExpectName("in"));
      PC_ASSIGN_OR_RETURN(ExprPtr iter, ParseTuple(false, false, {"recursive"}, false));
      n->exprs.push_back(std::move(iter));
      ExprPtr filter;
      if (SkipName("if")) {
        PC_ASSIGN_OR_RETURN(filter, ParseExpression(true));
      }
      n->exprs.push_back(std::move(filter));
      n->recursive = SkipName("recursive");
      ++loop_depth_;
      n->bodies.emplace_back();
      Status st;
      {
        SoftScope inner(&soft_, false);  // a loop body is a new frame in Jinja2's compiler
        st = ParseStatements({"endfor", "else"}, &n->bodies.back(), false);
      }
      --loop_depth_;
      PC_RETURN_IF_ERROR(st);
      const std::string which = Cur().value;
      Advance();
      n->bodies.emplace_back();
      if (which == "else") {
        PC_RETURN_IF_ERROR(ParseStatements({"endfor"}, &n->bodies.back(), true));
      }
    } else if (tag == "set") {
      PC_ASSIGN_OR_RETURN(n->target, ParseAssignTarget({}, true));
      if (SkipOp("=")) {
        n->kind = NodeKind::kSet;
        PC_ASSIGN_OR_RETURN(ExprPtr value, ParseTuple(false, true, {}, false));
        n->exprs.push_back(std::move(value));
      } else {
        n->kind = NodeKind::kSetBlock;
        SoftScope inner(&soft_, false);
        PC_ASSIGN_OR_RETURN(ExprPtr filters, ParseFilter(nullptr, false));
        n->exprs.push_back(std::move(filters));
        n->bodies.emplace_back();
        PC_RETURN_IF_ERROR(ParseStatements({"endset"}, &n->bodies.back(), true));
      }
    } else if (tag == "macro") {
      n->kind = NodeKind::kMacro;
      n->macro = std::make_shared<MacroDef>();
      PC_ASSIGN_OR_RETURN(n->macro->name, ExpectAnyName());
      PC_RETURN_IF_ERROR(ParseSignature(n->macro.get()));
      PC_RETURN_IF_ERROR(ParseMacroBody(n->macro.get(), "endmacro"));
    } else if (tag == "call") {
      n->kind = NodeKind::kCallBlock;
      n->macro = std::make_shared<MacroDef>();
      n->macro->name = "caller";
      if (IsOp("(")) PC_RETURN_IF_ERROR(ParseSignature(n->macro.get()));
      PC_ASSIGN_OR_RETURN(ExprPtr call, ParseExpression(true));
      if (call->kind != ExprKind::kCall) return Fail("expected call", line);
      n->exprs.push_back(std::move(call));
      PC_RETURN_IF_ERROR(ParseMacroBody(n->macro.get(), "endcall"));
    } else if (tag == "filter") {
      n->kind = NodeKind::kFilterBlock;
      SoftScope inner(&soft_, false);
      PC_ASSIGN_OR_RETURN(ExprPtr filters, ParseFilter(nullptr, true));
      n->exprs.push_back(std::move(filters));
      n->bodies.emplace_back();
      PC_RETURN_IF_ERROR(ParseStatements({"endfilter"}, &n->bodies.back(), true));
    } else if (tag == "with") {
      n->kind = NodeKind::kWith;
      std::vector<ExprPtr> targets, values;
      while (Cur().type != TokenType::kBlockEnd) {
        if (!targets.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
        PC_ASSIGN_OR_RETURN(ExprPtr t, ParseAssignTarget({}, false));
        PC_RETURN_IF_ERROR(ExpectOp("="));
        PC_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        targets.push_back(std::move(t));
        values.push_back(std::move(v));
      }
      for (auto& t : targets) n->exprs.push_back(std::move(t));
      for (auto& v : values) n->exprs.push_back(std::move(v));
      n->bodies.emplace_back();
      PC_RETURN_IF_ERROR(ParseStatements({"endwith"}, &n->bodies.back(), true));
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return Fail("'" + tag + "' outside of a loop", line);
      n->kind = tag == "break" ? NodeKind::kBreak : NodeKind::kContinue;
    } else if (tag == "generation") {
      // transformers' extension: marks assistant tokens for training; renders its body.
      n->kind = NodeKind::kScope;
      SoftScope inner(&soft_, false);
      n->bodies.emplace_back();
      PC_RETURN_IF_ERROR(ParseStatements({"endgeneration"}, &n->bodies.back(), true));
    } else if (tag == "block") {
      n->kind = NodeKind::kScope;
      PC_RETURN_IF_ERROR(ExpectAnyName().status());
      SkipName("scoped");
      SkipName("required");
      n->bodies.emplace_back();
      PC_RETURN_IF_ERROR(ParseStatements({"endblock"}, &n->bodies.back(), true));
      if (Cur().type == TokenType::kName) Advance();  // {% endblock name %}
    } else {
      return Fail("encountered unknown tag '" + tag + "'", line);
    }
    return n;
  }

  // Macro and call-block bodies: `break` does not cross them, and the names varargs, kwargs and
  // caller decide which arguments the macro accepts (as Jinja2 finds them in the body).
  Status ParseMacroBody(MacroDef* def, std::string_view end) {
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    SoftScope inner(&soft_, false);
    macros_.push_back(def);
    Status st = ParseStatements({end}, &def->body, true);
    macros_.pop_back();
    loop_depth_ = saved_loops;
    return st;
  }

  Status ParseSignature(MacroDef* def) {
    PC_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!def->params.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
      PC_ASSIGN_OR_RETURN(std::string param, ExpectAnyName());
      if (SkipOp("=")) {
        PC_ASSIGN_OR_RETURN(ExprPtr d, ParseExpression(true));
        def->defaults.push_back(std::move(d));
      } else if (!def->defaults.empty()) {
        return Fail("non-default argument follows default argument");
      }
      def->params.push_back(std::move(param));
    }
    Advance();
    return Status::Ok();
  }

  // A name, a tuple of names (for and set), or `ns.attr` (set only).
  StatusOr<ExprPtr> ParseAssignTarget(std::initializer_list<std::string_view> extra_end,
                                      bool with_namespace) {
    const int line = Cur().line;
    if (with_namespace && Cur().type == TokenType::kName && IsOp(Look(), ".")) {
      auto ref = Make(ExprKind::kGetAttr, line);
      auto base = Make(ExprKind::kName, line);
      base->name = Cur().value;
      Advance();
      Advance();
      PC_ASSIGN_OR_RETURN(ref->name, ExpectAnyName());
      ref->args.push_back(std::move(base));
      return ref;
    }
    PC_ASSIGN_OR_RETURN(ExprPtr target, ParseTuple(true, true, extra_end, false));
    if (target->kind == ExprKind::kName) return target;
    if (target->kind == ExprKind::kTuple) {
      for (const auto& a : target->args) {
        if (a->kind != ExprKind::kName) return Fail("can't assign to " + DescribeExpr(*a), line);
      }
      return target;
    }
    return Fail("can't assign to " + DescribeExpr(*target), line);
  }

  static std::string DescribeExpr(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kConst:
        return "a literal";
      case ExprKind::kCall:
        return "a call";
      default:
        return "this expression";
    }
  }

  // ---- expressions ----------------------------------------------------------------------------
  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Cur();
    if (t.type == TokenType::kVarEnd || t.type == TokenType::kBlockEnd || IsOp(t, ")")) {
      return true;
    }
    return t.type == TokenType::kName &&
           std::find(extra_end.begin(), extra_end.end(), t.value) != extra_end.end();
  }

  StatusOr<ExprPtr> ParseTuple(bool simplified, bool with_condexpr,
                               std::initializer_list<std::string_view> extra_end,
                               bool explicit_parens) {
    const int line = Cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      ExprPtr e;
      if (simplified) {
        PC_ASSIGN_OR_RETURN(e, ParsePrimary());
      } else {
        PC_ASSIGN_OR_RETURN(e, ParseExpression(with_condexpr));
      }
      args.push_back(std::move(e));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) return Expected("an expression");
    }
    auto t = Make(ExprKind::kTuple, line);
    t->args = std::move(args);
    return t;
  }

  StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(&depth_);
    PC_RETURN_IF_ERROR(CheckDepth());
    if (!with_condexpr) return ParseOr();
    const int line = Cur().line;
    const size_t first_unknown = unknown_.size();
    PC_ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
    while (IsName("if")) {
      for (size_t i = first_unknown; i < unknown_.size(); ++i) unknown_[i].soft = true;
      Advance();
      SoftScope soft(&soft_, true);
      PC_ASSIGN_OR_RETURN(ExprPtr expr2, ParseOr());
      ExprPtr expr3;
      if (SkipName("else")) {
        PC_ASSIGN_OR_RETURN(expr3, ParseExpression(true));
      }
      auto c = Make(ExprKind::kCondExpr, line);
      c->args.push_back(std::move(expr2));
      c->args.push_back(std::move(expr1));
      c->args.push_back(std::move(expr3));
      expr1 = std::move(c);
    }
    return expr1;
  }

  StatusOr<ExprPtr> ParseOr() {
    PC_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const int line = Cur().line;
      Advance();
      PC_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary(ExprKind::kOr, "or", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseAnd() {
    PC_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const int line = Cur().line;
      Advance();
      PC_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary(ExprKind::kAnd, "and", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Cur().line;
      Advance();
      DepthGuard guard(&depth_);
      PC_RETURN_IF_ERROR(CheckDepth());
      PC_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      auto n = Make(ExprKind::kNot, line);
      n->args.push_back(std::move(operand));
      return n;
    }
    return ParseCompare();
  }

  StatusOr<ExprPtr> ParseCompare() {
    const int line = Cur().line;
    PC_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    auto cmp = Make(ExprKind::kCompare, line);
    cmp->args.push_back(std::move(first));
    while (true) {
      std::string op;
      const Token& t = Cur();
      if (t.type == TokenType::kOp && (t.value == "==" || t.value == "!=" || t.value == "<" ||
                                       t.value == "<=" || t.value == ">" || t.value == ">=")) {
        op = t.value;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && IsName(Look(), "in")) {
        op = "not in";
        Advance();
        Advance();
      } else {
        break;
      }
      PC_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    if (cmp->ops.empty()) return std::move(cmp->args[0]);
    return cmp;
  }

  ExprPtr Binary(ExprKind kind, std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = Make(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // A left-associative binary level: operand (op operand)*.
  template <typename F>
  StatusOr<ExprPtr> ParseLevel(std::initializer_list<std::string_view> ops, F operand) {
    PC_ASSIGN_OR_RETURN(ExprPtr left, operand());
    int chain = 0;
    while (Cur().type == TokenType::kOp &&
           std::find(ops.begin(), ops.end(), Cur().value) != ops.end()) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      Advance();
      PC_ASSIGN_OR_RETURN(ExprPtr right, operand());
      left = Binary(ExprKind::kBinary, op, std::move(left), std::move(right), line);
      // Each operator adds a level the evaluator recurses through.
      if (++chain > max_depth_) return Fail("expression too long");
    }
    return left;
  }

  StatusOr<ExprPtr> ParseMath1() {
    return ParseLevel({"+", "-"}, [this] { return ParseConcat(); });
  }
  StatusOr<ExprPtr> ParseConcat() {
    return ParseLevel({"~"}, [this] { return ParseMath2(); });
  }
  StatusOr<ExprPtr> ParseMath2() {
    return ParseLevel({"*", "/", "//", "%"}, [this] { return ParsePow(); });
  }
  StatusOr<ExprPtr> ParsePow() {
    return ParseLevel({"**"}, [this] { return ParseUnary(true); });
  }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(&depth_);
    PC_RETURN_IF_ERROR(CheckDepth());
    const int line = Cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const bool neg = IsOp("-");
      Advance();
      PC_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = Make(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      node->args.push_back(std::move(operand));
    } else {
      PC_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    PC_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      PC_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  StatusOr<ExprPtr> ParsePrimary() {
    DepthGuard guard(&depth_);
    PC_RETURN_IF_ERROR(CheckDepth());
    const Token& t = Cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        auto e = Make(ExprKind::kConst, line);
        if (t.value == "true" || t.value == "True") {
          e->value = Value(true);
        } else if (t.value == "false" || t.value == "False") {
          e->value = Value(false);
        } else if (t.value == "none" || t.value == "None") {
          e->value = Value::None();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.value;
          for (MacroDef* m : macros_) {
            if (t.value == "varargs") m->uses_varargs = true;
            if (t.value == "kwargs") m->uses_kwargs = true;
            if (t.value == "caller") m->uses_caller = true;
          }
        }
        Advance();
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Advance();
        }
        auto e = Make(ExprKind::kConst, line);
        e->value = Value(std::move(s));
        return e;
      }
      case TokenType::kInt:
      case TokenType::kFloat: {
        auto e = Make(ExprKind::kConst, line);
        e->value = t.type == TokenType::kInt ? Value(t.int_value) : Value(t.float_value);
        Advance();
        return e;
      }
      case TokenType::kOp: {
        if (t.value == "(") {
          Advance();
          PC_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(false, true, {}, true));
          PC_RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.value == "[") {
          Advance();
          auto e = Make(ExprKind::kList, line);
          while (!IsOp("]")) {
            if (!e->args.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            PC_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          Advance();
          return e;
        }
        if (t.value == "{") {
          Advance();
          auto e = Make(ExprKind::kDict, line);
          while (!IsOp("}")) {
            if (!e->args.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            PC_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            PC_RETURN_IF_ERROR(ExpectOp(":"));
            PC_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          Advance();
          return e;
        }
        break;
      }
      default:
        break;
    }
    return Fail("unexpected '" + Describe(t) + "'");
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    int chain = 0;
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        PC_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        PC_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
      if (++chain > max_depth_) return Fail("expression too long");
    }
  }

  StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    int chain = 0;
    while (true) {
      if (IsOp("|")) {
        PC_ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
      } else if (IsName("is")) {
        PC_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        PC_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
      if (++chain > max_depth_) return Fail("expression too long");
    }
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = Cur().line;
    if (SkipOp(".")) {
      const Token& a = Cur();
      if (a.type == TokenType::kName) {
        auto e = Make(ExprKind::kGetAttr, line);
        e->name = a.value;
        e->args.push_back(std::move(node));
        Advance();
        return e;
      }
      if (a.type != TokenType::kInt) return Expected("name or number");
      auto e = Make(ExprKind::kGetItem, line);
      auto idx = Make(ExprKind::kConst, line);
      idx->value = Value(a.int_value);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(idx));
      Advance();
      return e;
    }
    Advance();  // [
    std::vector<ExprPtr> subs;
    while (!IsOp("]")) {
      if (!subs.empty()) PC_RETURN_IF_ERROR(ExpectOp(","));
      PC_ASSIGN_OR_RETURN(ExprPtr s, ParseSubscribed(line));
      subs.push_back(std::move(s));
    }
    Advance();
    if (subs.size() == 1 && subs[0]->kind == ExprKind::kSlice) {
      subs[0]->args[0] = std::move(node);
      return std::move(subs[0]);
    }
    auto e = Make(ExprKind::kGetItem, line);
    e->args.push_back(std::move(node));
    if (subs.size() == 1) {
      e->args.push_back(std::move(subs[0]));
    } else {
      auto t = Make(ExprKind::kTuple, line);
      for (auto& s : subs) {
        if (s->kind == ExprKind::kSlice) return Fail("slices in a tuple index are not supported");
        t->args.push_back(std::move(s));
      }
      e->args.push_back(std::move(t));
    }
    return e;
  }

  // An index or a slice `a:b:c`; a slice comes back as kSlice with args[0] left empty.
  StatusOr<ExprPtr> ParseSubscribed(int line) {
    std::vector<ExprPtr> parts;
    if (IsOp(":")) {
      Advance();
      parts.push_back(nullptr);
    } else {
      PC_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      if (!IsOp(":")) return e;
      Advance();
      parts.push_back(std::move(e));
    }
    auto slice_end = [this] { return IsOp("]") || IsOp(","); };
    if (IsOp(":") || slice_end()) {
      parts.push_back(nullptr);
    } else {
      PC_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      parts.push_back(std::move(e));
    }
    if (SkipOp(":")) {
      if (slice_end()) {
        parts.push_back(nullptr);
      } else {
        PC_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
        parts.push_back(std::move(e));
      }
    } else {
      parts.push_back(nullptr);
    }
    auto s = Make(ExprKind::kSlice, line);
    s->args.push_back(nullptr);
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  Status ParseCallArgs(Expr* e) {
    const int line = Cur().line;
    PC_RETURN_IF_ERROR(ExpectOp("("));
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        PC_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*")) {
        if (e->star_args || e->star_kwargs) return Fail("invalid syntax for function call", line);
        Advance();
        PC_ASSIGN_OR_RETURN(e->star_args, ParseExpression(true));
      } else if (IsOp("**")) {
        if (e->star_kwargs) return Fail("invalid syntax for function call", line);
        Advance();
        PC_ASSIGN_OR_RETURN(e->star_kwargs, ParseExpression(true));
      } else if (Cur().type == TokenType::kName && IsOp(Look(), "=")) {
        if (e->star_kwargs) return Fail("invalid syntax for function call", line);
        std::string key = Cur().value;
        Advance();
        Advance();
        PC_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (e->star_args || e->star_kwargs || !e->kwargs.empty()) {
          return Fail("invalid syntax for function call", line);
        }
        PC_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        e->args.push_back(std::move(v));
      }
      require_comma = true;
    }
    Advance();
    return Status::Ok();
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = Make(ExprKind::kCall, Cur().line);
    e->args.push_back(std::move(callee));
    PC_RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  // `| name(args) | name ...`; with `start_inline` the first filter has no pipe before it.
  StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Advance();
      start_inline = false;
      const int line = Cur().line;
      PC_ASSIGN_OR_RETURN(std::string name, ExpectAnyName());
      while (SkipOp(".")) {
        PC_ASSIGN_OR_RETURN(std::string part, ExpectAnyName());
        name += "." + part;
      }
      if (!IsFilterName(name)) unknown_.push_back({name, line, true, soft_});
      auto f = Make(ExprKind::kFilter, line);
      f->name = std::move(name);
      f->args.push_back(std::move(node));
      if (IsOp("(")) PC_RETURN_IF_ERROR(ParseCallArgs(f.get()));
      node = std::move(f);
    }
    return node;
  }

  StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = Cur().line;
    Advance();  // is
    const bool negated = SkipName("not");
    PC_ASSIGN_OR_RETURN(std::string name, ExpectAnyName());
    while (SkipOp(".")) {
      PC_ASSIGN_OR_RETURN(std::string part, ExpectAnyName());
      name += "." + part;
    }
    if (!IsTestName(name)) unknown_.push_back({name, line, false, soft_});
    auto t = Make(ExprKind::kTest, line);
    t->name = std::move(name);
    t->args.push_back(std::move(node));
    const Token& c = Cur();
    if (IsOp("(")) {
      PC_RETURN_IF_ERROR(ParseCallArgs(t.get()));
    } else if ((c.type == TokenType::kName || c.type == TokenType::kString ||
                c.type == TokenType::kInt || c.type == TokenType::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Fail("You cannot chain multiple tests with is");
      // One bare argument: `x is divisibleby 3`, `x is sameas none`.
      PC_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      PC_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      t->args.push_back(std::move(arg));
    }
    if (!negated) return t;
    auto n = Make(ExprKind::kNot, line);
    n->args.push_back(std::move(t));
    return n;
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::string name_;
  int max_depth_;
  int depth_ = 0;
  int loop_depth_ = 0;
  // Inside an if statement or a conditional expression (Jinja2's "soft" frame), where an
  // unknown filter or test is an error only when called.
  bool soft_ = false;
  struct SoftScope {
    SoftScope(bool* flag, bool value) : flag(flag), saved(*flag) { *flag = value; }
    ~SoftScope() { *flag = saved; }
    bool* flag;
    bool saved;
  };
  struct Unknown {
    std::string name;
    int line;
    bool filter;
    bool soft;
  };
  std::vector<Unknown> unknown_;
  std::vector<MacroDef*> macros_;
};

}  // namespace

StatusOr<std::shared_ptr<Program>> ParseProgram(std::vector<Token> tokens, std::string name,
                                                int max_depth) {
  return Parser(std::move(tokens), std::move(name), max_depth).Run();
}

}  // namespace polychip::jinja::internal
