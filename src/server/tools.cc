#include "server/tools.h"

#include <fmt/format.h>

#include "server/response_util.h"

namespace polychip::server {
namespace {

using nlohmann::json;
using ordered = nlohmann::ordered_json;

bool Llama3(std::string_view format) { return format == "llama3"; }

// The string at `key` of `obj`, or "" when `obj` is not an object or the value is not a string
// (json::value would throw on either: the request is validated later, and must get a 400).
std::string StringField(const json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

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

std::optional<ApiError> ParseTools(const json& body, const ordered& ordered_body,
                                   ToolRequest* out) {
  auto tools = body.find("tools");
  if (tools == body.end() || tools->is_null()) {
    if (body.contains("tool_choice") && !body["tool_choice"].is_null() &&
        body["tool_choice"] != "none" && body["tool_choice"] != "auto") {
      return BadRequest("tool_choice", "'tool_choice' needs 'tools'");
    }
    return std::nullopt;
  }
  if (!tools->is_array()) return BadRequest("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function") ||
        !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string()) {
      return BadRequest("tools",
                 "each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    ToolSpec spec;
    spec.name = t["function"]["name"].get<std::string>();
    if (t["function"].contains("description") && t["function"]["description"].is_string()) {
      spec.description = t["function"]["description"].get<std::string>();
    }
    spec.parameters = ordered{{"type", "object"}, {"properties", ordered::object()}};
    // The schema from the ordered body, with its keys in the order they were written.
    if (ordered_body.contains("tools") && ordered_body["tools"].size() > i) {
      const ordered& fn = ordered_body["tools"][i]["function"];
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
        return BadRequest("tool_choice", "'tool_choice' must be auto, none, required or a function");
    } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
               (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
      out->choice = ToolRequest::Choice::kNamed;
      out->named = (*it)["function"]["name"].get<std::string>();
      bool known = false;
      for (const auto& t : out->tools) known = known || t.name == out->named;
      if (!known)
        return BadRequest("tool_choice", "'tool_choice' names an unknown function '" + out->named + "'");
    } else {
      return BadRequest("tool_choice", "'tool_choice' must be auto, none, required or a function");
    }
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return BadRequest("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
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
    const std::string role = StringField(m, "role");
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
        text += CallText(format, StringField(fn, "name"), args);
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

OutputFormat OutputFormatByName(std::string_view name) {
  if (auto f = ToolFormatFromName(name)) {
    OutputFormat out;
    out.tools = *f;
    if (*f == ToolFormat::kGptOss) out.reasoning = ReasoningFormat::kGptOss;
    return out;
  }
  return OutputFormatForChatFamily(name);
}

std::vector<ToolCall> ParseToolCalls(std::string_view format, const ToolRequest& tools,
                                     std::string_view text, std::string* content) {
  ParsedAnswer a = ParseAnswer(OutputFormatByName(format), false, &tools, text, false);
  for (ToolCall& c : a.calls) c.id = RandomId("call_");
  *content = std::move(a.content);
  return std::move(a.calls);
}

AnswerStreamer::AnswerStreamer(const OutputFormat& format, bool starts_in_reasoning,
                               const ToolRequest* tools)
    : format_(format), starts_in_reasoning_(starts_in_reasoning), tools_(tools) {}

namespace {

// Sends what `now` adds to what was sent. A parse that took text back (which the parsers avoid)
// sends nothing rather than contradict what went out.
void SendNew(const std::string& now, std::string* sent, std::string* out) {
  if (now.size() <= sent->size() || now.compare(0, sent->size(), *sent) != 0) return;
  out->append(now, sent->size());
  *sent = now;
}

}  // namespace

void AnswerStreamer::Feed(std::string_view text, bool finished, std::string* reasoning,
                          std::string* content, std::vector<ToolCallDelta>* deltas) {
  buf_.append(text);
  ParsedAnswer now = ParseAnswer(format_, starts_in_reasoning_, tools_, buf_, !finished);
  SendNew(now.reasoning, &reasoning_sent_, reasoning);
  SendNew(now.content, &content_sent_, content);
  for (size_t i = 0; i < now.calls.size(); ++i) {
    ToolCall& call = now.calls[i];
    if (i == started_.size()) {
      started_.push_back({RandomId("call_"), call.name, ""});
      ToolCallDelta d;
      d.index = i;
      d.first = true;
      d.id = started_[i].id;
      d.name = call.name;
      deltas->push_back(std::move(d));
    }
    Started& s = started_[i];
    if (s.name != call.name) continue;
    std::string more;
    SendNew(call.arguments, &s.arguments, &more);
    if (!more.empty()) {
      ToolCallDelta d;
      d.index = i;
      d.arguments = std::move(more);
      deltas->push_back(std::move(d));
    }
    call.id = s.id;
  }
  if (finished) final_ = std::move(now);
}

}  // namespace polychip::server
