#include "server/tools.h"

#include <fmt/format.h>

#include "grammar/grammar.h"
#include "server/response_util.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;

ApiError Bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

bool Llama3(std::string_view format) { return format == "llama3"; }

std::string ContentText(const json& m) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  std::string out;
  if (it->is_array()) {
    for (const auto& part : *it) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) {
        out += part["text"].get<std::string>();
      }
    }
  }
  return out;
}

std::string ToolJson(const ToolSpec& t) {
  ordered fn = {{"name", t.name}};
  if (!t.description.empty()) fn["description"] = t.description;
  fn["parameters"] = t.parameters;
  return ordered{{"type", "function"}, {"function", fn}}.dump();
}

// The text a model of the family writes for one call.
std::string CallText(std::string_view format, const std::string& name,
                     const std::string& arguments) {
  if (Llama3(format)) {
    return "{\"name\": " + json(name).dump() + ", \"parameters\": " + arguments + "}";
  }
  return "<tool_call>\n{\"name\": " + json(name).dump() + ", \"arguments\": " + arguments +
         "}\n</tool_call>";
}

}  // namespace

std::optional<ApiError> ParseTools(const json& body, std::string_view raw_body, ToolRequest* out) {
  auto tools = body.find("tools");
  if (tools == body.end() || tools->is_null()) {
    if (body.contains("tool_choice") && !body["tool_choice"].is_null() &&
        body["tool_choice"] != "none" && body["tool_choice"] != "auto") {
      return Bad("tool_choice", "'tool_choice' needs 'tools'");
    }
    return std::nullopt;
  }
  if (!tools->is_array()) return Bad("tools", "'tools' must be an array");
  // The schemas again from the raw body, with their keys in order.
  const auto raw = ordered::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      return Bad("tools",
                 "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    ToolSpec spec;
    spec.name = t["function"]["name"].get<std::string>();
    if (t["function"].contains("description") && t["function"]["description"].is_string()) {
      spec.description = t["function"]["description"].get<std::string>();
    }
    spec.parameters = ordered{{"type", "object"}, {"properties", ordered::object()}};
    if (raw.is_object() && raw.contains("tools") && raw["tools"].size() > i) {
      const ordered& fn = raw["tools"][i]["function"];
      if (fn.contains("parameters") && fn["parameters"].is_object()) {
        spec.parameters = fn["parameters"];
      }
    }
    out->tools.push_back(std::move(spec));
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "auto")
        out->choice = ToolRequest::Choice::kAuto;
      else if (c == "none")
        out->choice = ToolRequest::Choice::kNone;
      else if (c == "required")
        out->choice = ToolRequest::Choice::kRequired;
      else
        return Bad("tool_choice", "'tool_choice' must be auto, none, required or a function");
    } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
               (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
      out->choice = ToolRequest::Choice::kNamed;
      out->named = (*it)["function"]["name"].get<std::string>();
      bool known = false;
      for (const auto& t : out->tools) known = known || t.name == out->named;
      if (!known)
        return Bad("tool_choice", "'tool_choice' names an unknown function '" + out->named + "'");
    } else {
      return Bad("tool_choice", "'tool_choice' must be auto, none, required or a function");
    }
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return Bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    out->parallel = it->get<bool>();
  }
  return std::nullopt;
}

json RenderToolMessages(std::string_view format, const ToolRequest& tools, const json& messages) {
  json out = json::array();
  std::string tool_block;
  if (tools.active()) {
    std::string list;
    for (const auto& t : tools.tools) list += ToolJson(t) + "\n";
    if (Llama3(format)) {
      tool_block =
          "You have access to the following functions. To call a function, respond with JSON "
          "of the form {\"name\": function name, \"parameters\": dictionary of argument name and "
          "its value}. Do not use variables.\n\n" +
          list;
    } else {
      tool_block =
          "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
          "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
          list +
          "</tools>\n\nFor each function call, return a json object with function name and "
          "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
          "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    }
  }
  bool system_done = tool_block.empty();
  for (const auto& m : messages) {
    if (!m.is_object()) return messages;  // ParseMessages reports it
    const std::string role = m.value("role", "");
    if (!system_done && (role == "system" || role == "developer")) {
      out.push_back({{"role", "system"}, {"content", ContentText(m) + "\n\n" + tool_block}});
      system_done = true;
      continue;
    }
    if (!system_done) {
      const char* preamble = Llama3(format) ? "" : "You are a helpful assistant.\n\n";
      out.push_back({{"role", "system"}, {"content", preamble + tool_block}});
      system_done = true;
    }
    if (role == "assistant" && m.contains("tool_calls") && m["tool_calls"].is_array()) {
      std::string text = ContentText(m);
      for (const auto& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function")) continue;
        const json& fn = call["function"];
        std::string args = "{}";
        if (fn.contains("arguments")) {
          args = fn["arguments"].is_string() ? fn["arguments"].get<std::string>()
                                             : fn["arguments"].dump();
        }
        if (!text.empty()) text += "\n";
        text += CallText(format, fn.value("name", ""), args);
      }
      out.push_back({{"role", "assistant"}, {"content", text}});
    } else if (role == "tool") {
      const std::string text = ContentText(m);
      if (Llama3(format)) {
        out.push_back({{"role", "ipython"}, {"content", text}});
      } else {
        out.push_back(
            {{"role", "user"}, {"content", "<tool_response>\n" + text + "\n</tool_response>"}});
      }
    } else {
      out.push_back(m);
    }
  }
  return out;
}

StatusOr<std::optional<std::string>> ToolCallGrammar(std::string_view format,
                                                     const ToolRequest& tools) {
  using Choice = ToolRequest::Choice;
  if (tools.choice != Choice::kRequired && tools.choice != Choice::kNamed) {
    return std::optional<std::string>();
  }
  std::string rules, alts;
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const ToolSpec& t = tools.tools[i];
    if (tools.choice == Choice::kNamed && t.name != tools.named) continue;
    auto args = grammar::JsonSchemaToEbnf(t.parameters);
    if (!args.ok()) {
      return Status(args.status().code(),
                    "tool '" + t.name + "' parameters: " + args.status().message());
    }
    const std::string prefix = fmt::format("t{}-", i);
    rules += grammar::PrefixRuleNames(*args, prefix);
    const std::string head = "{\"name\": " + json(t.name).dump() +
                             (Llama3(format) ? ", \"parameters\": " : ", \"arguments\": ");
    alts += (alts.empty() ? "" : " | ") + grammar::EbnfLiteral(head) + " " + prefix + "root";
  }
  std::string call = Llama3(format) ? "(" + alts + ") \"}\""
                                    : "\"<tool_call>\\n\" (" + alts + ") \"}\\n</tool_call>\"";
  std::string root = "root ::= call";
  if (tools.parallel && !Llama3(format)) root += " (\"\\n\" call){0,3}";
  return std::optional<std::string>(root + "\ncall ::= " + call + "\n" + rules);
}

std::vector<ToolCall> ParseToolCalls(std::string_view format, const ToolRequest& tools,
                                     std::string_view text, std::string* content) {
  std::vector<ToolCall> calls;
  auto known = [&](const std::string& name) {
    for (const auto& t : tools.tools) {
      if (t.name == name) return true;
    }
    return false;
  };
  // One call object: {"name": ..., "arguments" or "parameters": {...}}.
  auto take = [&](std::string_view body) {
    const auto j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    const std::string name = j["name"].get<std::string>();
    if (!known(name)) return false;
    const json* args = j.contains("arguments")    ? &j["arguments"]
                       : j.contains("parameters") ? &j["parameters"]
                                                  : nullptr;
    std::string a = "{}";
    if (args) a = args->is_string() ? args->get<std::string>() : args->dump();
    calls.push_back({RandomId("call_"), name, a});
    return true;
  };
  content->clear();
  if (Llama3(format)) {
    std::string_view t = text;
    if (t.rfind("<|python_tag|>", 0) == 0) t.remove_prefix(14);
    if (!take(t)) *content = std::string(text);
    return calls;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find("<tool_call>", pos);
    if (open == std::string_view::npos) {
      content->append(text.substr(pos));
      break;
    }
    size_t close = text.find("</tool_call>", open);
    const size_t body_end = close == std::string_view::npos ? text.size() : close;
    const std::string_view body = text.substr(open + 11, body_end - open - 11);
    content->append(text.substr(pos, open - pos));
    if (!take(body)) content->append(text.substr(open, body_end - open));
    pos = close == std::string_view::npos ? text.size() : close + 12;
  }
  // Only whitespace around the calls is no content.
  if (!calls.empty() && content->find_first_not_of(" \t\r\n") == std::string::npos)
    content->clear();
  return calls;
}

}  // namespace polychip::server
