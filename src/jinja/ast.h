// The parsed template: expression and statement trees, built by Parse (parser.cc) and walked by
// the evaluator (eval.cc). Nodes keep their template line for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/lexer.h"
#include "jinja/value.h"

namespace polychip::jinja::internal {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind : uint8_t {
  kConst,    // value
  kName,     // name
  kList,     // args
  kTuple,    // args
  kDict,     // args: key, value, key, value, ...
  kGetAttr,  // object.name: args[0], name
  kGetItem,  // object[index]: args[0], args[1]
  kSlice,    // object[a:b:c]: args[0], args[1..3] (null when absent)
  kCall,     // args[0](args[1:], kwargs)
  kFilter,   // args[0] | name(args[1:], kwargs); args[0] null in filter blocks
  kTest,     // args[0] is name(args[1:], kwargs)
  kNeg,      // -args[0]
  kPos,      // +args[0]
  kNot,      // not args[0]
  kBinary,   // args[0] op args[1]: + - * / // % ** ~
  kAnd,
  kOr,
  kCompare,   // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
  kCondExpr,  // args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter, test, op
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // call, filter and test keywords
  ExprPtr star_args, star_kwargs;                       // f(*a, **k)
  std::vector<std::string> ops;                         // kCompare
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

// A macro's signature and body; also a call block's `caller`.
struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with the last params
  Body body;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};

enum class NodeKind : uint8_t {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // exprs: conditions; bodies: one per condition, plus an else body if present
  kFor,          // target, exprs[0] iterable, exprs[1] filter (may be null); bodies[0], else
  kSet,          // target = exprs[0]
  kSetBlock,     // target; bodies[0]; exprs[0]: a filter chain (kFilter, innermost args[0] null)
  kMacro,        // macro
  kCallBlock,    // exprs[0]: the call; macro: the caller
  kFilterBlock,  // exprs[0]: the filter chain; bodies[0]
  kWith,         // targets in exprs (kName) with values in exprs after them; bodies[0]
  kBreak,
  kContinue,
  kScope,  // generation blocks and the like: bodies[0] rendered in place
};

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  ExprPtr target;
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;
  std::shared_ptr<MacroDef> macro;
  bool recursive = false;
};

struct Program {
  std::string name;
  Body body;
};

// The filters and tests the evaluator has (filters.cc). Jinja2 refuses an unknown one when it
// compiles the template, unless it sits in an if statement or a conditional expression, where
// the error waits for the call.
bool IsFilterName(std::string_view name);
bool IsTestName(std::string_view name);

// Tokens to tree; errors name the line and what was expected.
StatusOr<std::shared_ptr<Program>> ParseProgram(std::vector<Token> tokens, std::string name,
                                                int max_depth);

}  // namespace polychip::jinja::internal
