// The grammars that force a tool call (tool_choice "required" or a named function) in each
// family's format: the call text is what the family's template shows the model, and the
// arguments satisfy the function's JSON Schema (JSON arguments through the schema's grammar,
// XML-like parameters one by one, each value through its property's schema).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "server/tools.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;
using grammar::EbnfLiteral;

std::string Lit(std::string_view s) { return EbnfLiteral(s); }

// Adds the grammar of `schema` under `prefix`; returns its root rule's name.
StatusOr<std::string> SchemaRule(const ordered& schema, const std::string& prefix,
                                 std::string* rules) {
  PC_ASSIGN_OR_RETURN(std::string ebnf, grammar::JsonSchemaToEbnf(schema));
  *rules += grammar::PrefixRuleNames(ebnf, prefix);
  return prefix + "root";
}

// Parameters written one at a time, in the schema's order (a required one must be there):
// `param(key, value_rule, is_string)` is the text of one.
template <typename ParamFn>
StatusOr<std::string> XmlParams(const ToolSpec& t, const std::string& prefix, std::string* rules,
                                ParamFn param) {
  const ordered& props =
      t.parameters.contains("properties") ? t.parameters["properties"] : ordered::object();
  std::vector<std::string> required;
  if (t.parameters.contains("required") && t.parameters["required"].is_array()) {
    for (const auto& r : t.parameters["required"]) {
      if (r.is_string()) required.push_back(r.template get<std::string>());
    }
  }
  std::string seq;
  size_t k = 0;
  for (const auto& item : props.items()) {
    // Named, not a structured binding: the lambda below captures it (C++20 forbids capturing
    // a binding; clang refuses it).
    const std::string& key = item.key();
    const auto& schema = item.value();
    const std::string p = fmt::format("{}p{}-", prefix, k++);
    std::string value;
    bool is_string = false;
    if (schema.is_object() && schema.contains("type") && schema["type"] == "string" &&
        !schema.contains("enum") && !schema.contains("const")) {
      // As written, up to the closing tag, within the schema's length bounds (characters).
      auto bound = [&](const char* k, int64_t dflt) {
        return schema.contains(k) && schema[k].is_number_integer()
                   ? schema[k].template get<int64_t>()
                   : dflt;
      };
      const int64_t min = bound("minLength", 0), max = bound("maxLength", -1);
      if (min < 0 || (max >= 0 && max < min) || min > 100000 || max > 100000) {
        return InvalidArgument("'" + key + "': bad minLength/maxLength");
      }
      value = p + "text";
      *rules += value + " ::= [^<]" +
                (max >= 0 ? fmt::format("{{{},{}}}", min, max) : fmt::format("{{{},}}", min)) +
                "\n";
      is_string = true;
    } else if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() &&
               !schema["enum"].empty() && schema["enum"][0].is_string()) {
      std::string alts;
      for (const auto& e : schema["enum"]) {
        if (!e.is_string()) continue;
        alts += (alts.empty() ? "" : " | ") + Lit(e.template get<std::string>());
      }
      value = "(" + alts + ")";
      is_string = true;
    } else {
      PC_ASSIGN_OR_RETURN(value, SchemaRule(schema, p, rules));
    }
    const bool req = std::find(required.begin(), required.end(), key) != required.end();
    const std::string one = param(key, value, is_string);
    seq += (seq.empty() ? "" : " ") + (req ? "(" + one + ")" : "(" + one + ")?");
  }
  return seq.empty() ? std::string("\"\"") : seq;
}

// One call of tool `t` in `format`: the EBNF of its text.
StatusOr<std::string> CallRule(ToolFormat format, const ToolSpec& t, size_t index,
                               std::string* rules) {
  const std::string prefix = fmt::format("t{}-", index);
  const std::string name = json(t.name).dump();  // quoted, escaped
  auto args = [&]() { return SchemaRule(t.parameters, prefix, rules); };
  switch (format) {
    case ToolFormat::kQwen3Coder: {
      PC_ASSIGN_OR_RETURN(
          std::string params,
          XmlParams(t, prefix, rules, [](const std::string& k, const std::string& v, bool) {
            return Lit("<parameter=" + k + ">\n") + " " + v + " " + Lit("\n</parameter>\n");
          }));
      return Lit("<tool_call>\n<function=" + t.name + ">\n") + " " + params + " " +
             Lit("</function>\n</tool_call>");
    }
    case ToolFormat::kGlm4: {
      PC_ASSIGN_OR_RETURN(
          std::string params,
          XmlParams(t, prefix, rules, [](const std::string& k, const std::string& v, bool) {
            return Lit("<arg_key>" + k + "</arg_key>\n<arg_value>") + " " + v + " " +
                   Lit("</arg_value>\n");
          }));
      return Lit("<tool_call>" + t.name + "\n") + " " + params + " " + Lit("</tool_call>");
    }
    case ToolFormat::kDeepSeekDsml: {
      PC_ASSIGN_OR_RETURN(
          std::string params,
          XmlParams(t, prefix, rules, [](const std::string& k, const std::string& v, bool str) {
            return Lit("<｜DSML｜parameter name=\"" + k + "\" string=\"" +
                       (str ? "true" : "false") + "\">") +
                   " " + v + " " + Lit("</｜DSML｜parameter>\n");
          }));
      return Lit("<｜DSML｜invoke name=\"" + t.name + "\">\n") + " " + params + " " +
             Lit("</｜DSML｜invoke>\n");
    }
    default:
      break;
  }
  PC_ASSIGN_OR_RETURN(std::string a, args());
  auto wrap = [&](std::string before, std::string after) {
    return Lit(before) + " " + a + (after.empty() ? "" : " " + Lit(after));
  };
  switch (format) {
    case ToolFormat::kHermes:
      return wrap("<tool_call>\n{\"name\": " + name + ", \"arguments\": ", "}\n</tool_call>");
    case ToolFormat::kLlama3:
      return wrap("{\"name\": " + name + ", \"parameters\": ", "}");
    case ToolFormat::kGeneric:
    case ToolFormat::kMistral:
    case ToolFormat::kGranite:
      return wrap("{\"name\": " + name + ", \"arguments\": ", "}");
    case ToolFormat::kMistralArgs:
      return wrap("[TOOL_CALLS]" + t.name + "[ARGS]", "");
    case ToolFormat::kDeepSeekR1:
      return wrap("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + t.name + "\n```json\n",
                  "\n```<｜tool▁call▁end｜>");
    case ToolFormat::kDeepSeekV31:
      return wrap("<｜tool▁call▁begin｜>" + t.name + "<｜tool▁sep｜>", "<｜tool▁call▁end｜>");
    case ToolFormat::kKimiK2:
      return Lit("<|tool_call_begin|>functions." + t.name + ":") + " [0-9] " +
             Lit("<|tool_call_argument_begin|>") + " " + a + " " + Lit("<|tool_call_end|>");
    case ToolFormat::kGptOss:
      return wrap("<|channel|>commentary to=functions." + t.name + " <|constrain|>json<|message|>",
                  "");
    case ToolFormat::kFunctionaryV31:
      return wrap("<function=" + t.name + ">", "</function>");
    case ToolFormat::kFunctionaryV32:
      return wrap(t.name + "\n", "");
    case ToolFormat::kCommandR:
      return wrap("Action:\n```json\n[\n    {\n        \"tool_name\": " + name +
                      ",\n        \"parameters\": ",
                  "\n    }\n]\n```");
    case ToolFormat::kCommandR7b:
      return wrap("<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": " + name +
                      ", \"parameters\": ",
                  "}\n]<|END_ACTION|>");
    default:
      break;
  }
  return Internal("no call grammar for this format");
}

}  // namespace

StatusOr<std::optional<std::string>> ToolCallGrammar(const OutputFormat& format,
                                                     const ToolRequest& tools,
                                                     bool starts_in_reasoning) {
  using Choice = ToolRequest::Choice;
  if (tools.choice != Choice::kRequired && tools.choice != Choice::kNamed) {
    return std::optional<std::string>();
  }
  std::string rules, alts;
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const ToolSpec& t = tools.tools[i];
    if (tools.choice == Choice::kNamed && t.name != tools.named) continue;
    auto call = CallRule(format.tools, t, i, &rules);
    if (!call.ok()) {
      return Status(call.status().code(),
                    "tool '" + t.name + "' parameters: " + call.status().message());
    }
    alts += (alts.empty() ? "" : " | ") + ("(" + *call + ")");
  }
  // How calls follow each other, and what surrounds them.
  const bool many = tools.parallel;
  std::string body;
  auto repeat = [&](std::string_view sep) {
    return many ? "call (" + std::string(sep.empty() ? "" : Lit(sep) + " ") + "call){0,3}"
                : std::string("call");
  };
  switch (format.tools) {
    case ToolFormat::kHermes:
    case ToolFormat::kQwen3Coder:
    case ToolFormat::kGlm4:
      body = repeat("\n");
      break;
    case ToolFormat::kMistral:
      body = Lit("[TOOL_CALLS][") + " " + repeat(", ") + " " + Lit("]");
      break;
    case ToolFormat::kGranite:
      body = Lit("<|tool_call|>[") + " " + repeat(", ") + " " + Lit("]");
      break;
    case ToolFormat::kMistralArgs:
      body = repeat("");
      break;
    case ToolFormat::kDeepSeekR1:
      body = Lit("<｜tool▁calls▁begin｜>") + " " + repeat("\n") + " " + Lit("<｜tool▁calls▁end｜>");
      break;
    case ToolFormat::kDeepSeekV31:
      body = Lit("<｜tool▁calls▁begin｜>") + " " + repeat("") + " " + Lit("<｜tool▁calls▁end｜>");
      break;
    case ToolFormat::kDeepSeekDsml:
      body = Lit("<｜DSML｜function_calls>\n") + " " + repeat("") + " " +
             Lit("</｜DSML｜function_calls>");
      break;
    case ToolFormat::kKimiK2:
      body = Lit("<|tool_calls_section_begin|>") + " " + repeat("") + " " +
             Lit("<|tool_calls_section_end|>");
      break;
    case ToolFormat::kFunctionaryV32:
      body = repeat("\n>>>");
      break;
    default:  // one call is the whole answer
      body = "call";
      break;
  }
  // A model whose prompt opened its reasoning closes it first (and thinks no further).
  auto [open, close] = ReasoningTags(format.reasoning);
  if (starts_in_reasoning && !close.empty()) body = Lit(std::string(close) + "\n\n") + " " + body;
  return std::optional<std::string>("root ::= " + body + "\ncall ::= " + alts + "\n" + rules);
}

}  // namespace polychip::server
