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
  ToolCallStreamer parser(format, tools);
  std::vector<ToolCallDelta> unused;
  std::string ignored;
  parser.Feed(text, /*finished=*/true, &ignored, &unused);
  *content = parser.content();
  return parser.calls();
}

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ToolCallStreamer::ToolCallStreamer(std::string_view chat_format, const ToolRequest& tools)
    : llama3_(Llama3(chat_format)),
      tools_(&tools),
      state_(llama3_ ? State::kStart : State::kText) {}

void ToolCallStreamer::Feed(std::string_view text, bool finished, std::string* content,
                            std::vector<ToolCallDelta>* deltas) {
  buf_.append(text);
  Step(finished, content, deltas);
  if (finished) {
    // The whitespace held back belongs to the content unless it only surrounded calls.
    if (!held_ws_.empty() && (content_seen_ || calls_.empty())) {
      *content += held_ws_;
      content_ += held_ws_;
    }
    held_ws_.clear();
    if (!content_seen_ && !calls_.empty()) content_.clear();
  }
}

void ToolCallStreamer::EmitContent(std::string_view text, std::string* content) {
  size_t end = text.size();
  while (end > 0 && IsSpace(text[end - 1])) --end;
  if (end == 0) {
    held_ws_.append(text);
    return;
  }
  std::string out = held_ws_;
  out.append(text.substr(0, end));
  held_ws_ = std::string(text.substr(end));
  content_seen_ = true;
  *content += out;
  content_ += out;
}

ToolCallStreamer::Head ToolCallStreamer::ParseHead(size_t* value_begin, std::string* name) const {
  size_t i = pos_;
  auto ws = [&] {
    while (i < buf_.size() && IsSpace(buf_[i])) ++i;
  };
  // Matches `lit` at i; kNeedMore when the text ends inside it.
  auto lit = [&](std::string_view l) {
    const size_t n = std::min(l.size(), buf_.size() - i);
    if (std::string_view(buf_).substr(i, n) != l.substr(0, n)) return Head::kBad;
    if (n < l.size()) return Head::kNeedMore;
    i += n;
    return Head::kOk;
  };
  Head h;
  ws();
  if ((h = lit("{")) != Head::kOk) return h;
  ws();
  if ((h = lit("\"name\"")) != Head::kOk) return h;
  ws();
  if ((h = lit(":")) != Head::kOk) return h;
  ws();
  if ((h = lit("\"")) != Head::kOk) return h;
  const size_t name_begin = i - 1;
  for (bool esc = false;; ++i) {
    if (i >= buf_.size()) return Head::kNeedMore;
    if (esc) {
      esc = false;
    } else if (buf_[i] == '\\') {
      esc = true;
    } else if (buf_[i] == '"') {
      break;
    }
  }
  ++i;
  const json n = json::parse(buf_.substr(name_begin, i - name_begin), nullptr, false);
  if (!n.is_string()) return Head::kBad;
  ws();
  if ((h = lit(",")) != Head::kOk) return h;
  ws();
  if (i >= buf_.size()) return Head::kNeedMore;
  // "arguments" (Hermes) or "parameters" (llama-3): tell them apart by their second letter.
  if (buf_.size() - i < 2) return Head::kNeedMore;
  if ((h = lit(buf_[i + 1] == 'p' ? "\"parameters\"" : "\"arguments\"")) != Head::kOk) return h;
  ws();
  if ((h = lit(":")) != Head::kOk) return h;
  ws();
  if (i >= buf_.size()) return Head::kNeedMore;
  *value_begin = i;
  *name = n.get<std::string>();
  return Head::kOk;
}

void ToolCallStreamer::EndCall(bool valid) {
  if (valid && json::accept(current_.arguments)) calls_.push_back(current_);
  current_ = ToolCall();
}

void ToolCallStreamer::Step(bool finished, std::string* content,
                            std::vector<ToolCallDelta>* deltas) {
  for (;;) {
    const std::string_view rest = std::string_view(buf_).substr(pos_);
    switch (state_) {
      case State::kStart: {  // llama-3: the answer is a call if it begins like one
        size_t i = 0;
        while (i < rest.size() && IsSpace(rest[i])) ++i;
        const std::string_view after = rest.substr(i);
        if (after.empty() || (!finished && kPythonTag.substr(0, after.size()) == after)) {
          if (finished) {
            EmitContent(rest, content);
            pos_ = buf_.size();
          }
          return;
        }
        call_begin_ = pos_;
        if (after.substr(0, kPythonTag.size()) == kPythonTag) {
          pos_ += i + kPythonTag.size();
          state_ = State::kHead;
        } else if (after[0] == '{') {
          state_ = State::kHead;
        } else {
          state_ = State::kPlainText;
        }
        continue;
      }
      case State::kPlainText:
        EmitContent(rest, content);
        pos_ = buf_.size();
        return;
      case State::kText: {
        const size_t open = rest.find(kOpen);
        if (open == std::string_view::npos) {
          const size_t keep = finished ? 0 : PartialTag(rest, kOpen);
          EmitContent(rest.substr(0, rest.size() - keep), content);
          pos_ += rest.size() - keep;
          return;
        }
        EmitContent(rest.substr(0, open), content);
        call_begin_ = pos_ + open;
        pos_ += open + kOpen.size();
        state_ = State::kHead;
        continue;
      }
      case State::kHead: {
        size_t value = 0;
        std::string name;
        Head h = ParseHead(&value, &name);
        bool known = false;
        for (const auto& t : tools_->tools) known |= t.name == name;
        if (h == Head::kOk && !known) h = Head::kBad;
        if (h == Head::kNeedMore && !finished) return;
        if (h != Head::kOk) {
          state_ = State::kBadCall;
          continue;
        }
        current_ = ToolCall{RandomId("call_"), name, ""};
        ToolCallDelta d;
        d.index = started_++;
        d.first = true;
        d.id = current_.id;
        d.name = name;
        deltas->push_back(std::move(d));
        pos_ = args_begin_ = value;
        args_kind_ = buf_[value] == '{' || buf_[value] == '[' ? buf_[value]
                     : buf_[value] == '"'                     ? '"'
                                                              : 's';
        depth_ = 0;
        in_string_ = escape_ = false;
        state_ = State::kArgs;
        continue;
      }
      case State::kBadCall: {  // not a call after all: its text is content
        if (llama3_) {
          state_ = State::kPlainText;
          pos_ = call_begin_;
          continue;
        }
        const size_t close = buf_.find(kClose, call_begin_);
        if (close == std::string::npos && !finished) return;
        const size_t end = close == std::string::npos ? buf_.size() : close + kClose.size();
        EmitContent(std::string_view(buf_).substr(call_begin_, end - call_begin_), content);
        pos_ = end;
        state_ = State::kText;
        continue;
      }
      case State::kArgs: {
        size_t i = pos_;
        bool done = false;
        for (; i < buf_.size() && !done; ++i) {
          const char c = buf_[i];
          if (args_kind_ == 's') {
            if (c == ',' || c == '}' || IsSpace(c)) {
              done = true;
              break;
            }
            continue;
          }
          if (in_string_) {
            if (escape_) {
              escape_ = false;
            } else if (c == '\\') {
              escape_ = true;
            } else if (c == '"') {
              in_string_ = false;
              if (args_kind_ == '"') done = true;
            }
            continue;
          }
          if (c == '"') {
            in_string_ = true;
          } else if (c == '{' || c == '[') {
            ++depth_;
          } else if (c == '}' || c == ']') {
            if (--depth_ == 0) done = true;
          }
        }
        const std::string_view fragment = std::string_view(buf_).substr(pos_, i - pos_);
        current_.arguments.append(fragment);
        // A string value is sent decoded, once complete; nested values as they come.
        if (args_kind_ != '"' && !fragment.empty()) {
          ToolCallDelta d;
          d.index = started_ - 1;
          d.arguments = std::string(fragment);
          deltas->push_back(std::move(d));
        }
        pos_ = i;
        if (!done && !(finished && args_kind_ == 's')) {
          if (finished) EndCall(false);  // cut off (max_tokens) inside the arguments
          return;
        }
        if (args_kind_ == '"') {
          const json v = json::parse(current_.arguments, nullptr, false);
          current_.arguments = v.is_string() ? v.get<std::string>() : current_.arguments;
          ToolCallDelta d;
          d.index = started_ - 1;
          d.arguments = current_.arguments;
          deltas->push_back(std::move(d));
        }
        state_ = State::kTail;
        continue;
      }
      case State::kTail: {  // `}` and the closing tag (Hermes) or the end of the answer
        size_t i = 0;
        while (i < rest.size() && IsSpace(rest[i])) ++i;
        if (i == rest.size() && !finished) return;
        if (i == rest.size() || rest[i] != '}') {
          EndCall(false);
          state_ = llama3_ ? State::kPlainText : State::kText;
          continue;
        }
        ++i;
        if (llama3_) {
          while (i < rest.size() && IsSpace(rest[i])) ++i;
          if (i < rest.size()) {  // text after the call: not a call answer
            EndCall(false);
            pos_ += i;
            state_ = State::kPlainText;
            continue;
          }
          if (!finished) return;
          EndCall(true);
          pos_ = buf_.size();
          return;
        }
        const std::string_view tail = rest.substr(i);
        size_t j = 0;
        while (j < tail.size() && IsSpace(tail[j])) ++j;
        const std::string_view tag = tail.substr(j);
        if (tag.size() < kClose.size() && kClose.substr(0, tag.size()) == tag && !finished) {
          return;
        }
        const bool closed = tag.substr(0, kClose.size()) == kClose;
        EndCall(closed || tag.empty());
        pos_ += i + j + (closed ? kClose.size() : 0);
        state_ = State::kText;
        continue;
      }
    }
  }
}

}  // namespace polychip::server
