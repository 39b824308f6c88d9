// The parsers of a chat answer in each family's format (tool_format.h): reasoning, content and
// tool calls. One function parses both a finished answer and the beginning of one (`partial`);
// the streamer (tools.cc) parses the answer again as it grows and sends what is new, so a
// streamed answer always ends as the finished one parses.
#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "server/tools.h"

namespace polychip::server {
namespace {

using nlohmann::json;

enum class Scan { kOk, kNeedMore, kBad };

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// A read position in the answer. Every matcher says kNeedMore when the text ends before it
// can tell, which a partial parse waits on and a finished one treats as a cut-off answer.
struct In {
  std::string_view s;
  size_t i = 0;

  bool AtEnd() const { return i >= s.size(); }
  std::string_view Rest() const { return s.substr(std::min(i, s.size())); }
  void Ws() {
    while (i < s.size() && IsSpace(s[i])) ++i;
  }
  Scan Lit(std::string_view l) {
    const size_t n = std::min(l.size(), s.size() - i);
    if (s.substr(i, n) != l.substr(0, n)) return Scan::kBad;
    if (n < l.size()) return Scan::kNeedMore;
    i += n;
    return Scan::kOk;
  }
  // Whitespace, then `l`.
  Scan WsLit(std::string_view l) {
    Ws();
    return Lit(l);
  }
  // The text up to `close`, and past it. kNeedMore: *out is the text so far, less what may be
  // the beginning of `close`.
  Scan Until(std::string_view close, std::string_view* out) {
    const size_t at = s.find(close, i);
    if (at == std::string_view::npos) {
      *out = s.substr(i, s.size() - i - PartialTag(Rest(), close));
      return Scan::kNeedMore;
    }
    *out = s.substr(i, at - i);
    i = at + close.size();
    return Scan::kOk;
  }
};

#define PC_SCAN(expr)                              \
  do {                                             \
    if (Scan pc_s_ = (expr); pc_s_ != Scan::kOk) { \
      return pc_s_;                                \
    }                                              \
  } while (0)

// The end of the JSON value at in->i (not checked beyond its brackets and strings).
Scan SkipJson(In* in) {
  const std::string_view s = in->s;
  size_t i = in->i;
  if (i >= s.size()) return Scan::kNeedMore;
  const char c0 = s[i];
  if (c0 != '{' && c0 != '[' && c0 != '"') {
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '.' ||
                            s[i] == '-' || s[i] == '+')) {
      ++i;
    }
    if (i == in->i) return Scan::kBad;
    if (i == s.size()) return Scan::kNeedMore;  // "12" may go on
    in->i = i;
    return Scan::kOk;
  }
  int depth = 0;
  bool in_string = false, escape = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) {
          in->i = i + 1;
          return Scan::kOk;
        }
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) {
        in->i = i + 1;
        return Scan::kOk;
      }
      if (depth < 0) return Scan::kBad;
    }
  }
  return Scan::kNeedMore;
}

const ToolSpec* FindTool(const ToolRequest& tools, std::string_view name) {
  for (const auto& t : tools.tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// What one block of calls produced. `open`: the last call is not complete yet (partial parse).
struct Calls {
  std::vector<ToolCall> calls;
  bool open = false;
};

struct Ctx {
  const ToolRequest& tools;
  bool partial;
};

// A JSON value given as a call's arguments: its text, or a string's value (some models write
// the arguments as a JSON string). Empty while a string is still incomplete.
std::string ArgsText(std::string_view raw, bool complete) {
  if (raw.empty() || raw[0] != '"') return std::string(raw);
  if (!complete) return "";
  const json v = json::parse(raw, nullptr, false);
  return v.is_string() ? v.get<std::string>() : std::string(raw);
}

// A call written as a JSON object: {"name": N, "arguments": {...}} and the like. Other keys
// (an id) are skipped. A partial parse reports the call once its name is known.
Scan CallObject(const Ctx& ctx, In* in, std::initializer_list<std::string_view> name_keys,
                std::initializer_list<std::string_view> args_keys, Calls* out) {
  PC_SCAN(in->WsLit("{"));
  std::string name;
  std::string_view args;
  bool have_args = false;
  // The text ends inside the object: the call so far, once its name is known.
  auto need_more = [&](std::string_view partial_args) {
    if (ctx.partial && !name.empty()) {
      out->calls.push_back(
          {"", name, have_args ? ArgsText(args, true) : ArgsText(partial_args, false)});
      out->open = !have_args;
    }
    return Scan::kNeedMore;
  };
  for (bool first = true;; first = false) {
    in->Ws();
    if (in->AtEnd()) return need_more("");
    if (in->s[in->i] == '}') {
      ++in->i;
      break;
    }
    if (!first) {
      const Scan c = in->Lit(",");
      if (c == Scan::kNeedMore) return need_more("");
      PC_SCAN(c);
      in->Ws();
    }
    const size_t key_begin = in->i;
    if (in->AtEnd()) return need_more("");
    if (in->s[in->i] != '"') return Scan::kBad;
    Scan k_scan = SkipJson(in);
    if (k_scan == Scan::kNeedMore) return need_more("");
    PC_SCAN(k_scan);
    const json key = json::parse(in->s.substr(key_begin, in->i - key_begin), nullptr, false);
    if (!key.is_string()) return Scan::kBad;
    const std::string k = key.get<std::string>();
    k_scan = in->WsLit(":");
    if (k_scan == Scan::kNeedMore) return need_more("");
    PC_SCAN(k_scan);
    in->Ws();
    const size_t value_begin = in->i;
    const Scan v = SkipJson(in);
    const bool is_name = std::find(name_keys.begin(), name_keys.end(), k) != name_keys.end();
    const bool is_args = std::find(args_keys.begin(), args_keys.end(), k) != args_keys.end();
    if (v == Scan::kBad) return v;
    if (v == Scan::kNeedMore) return need_more(is_args ? in->s.substr(value_begin) : "");
    const std::string_view value = in->s.substr(value_begin, in->i - value_begin);
    if (is_name) {
      const json n = json::parse(value, nullptr, false);
      if (!n.is_string() || !FindTool(ctx.tools, n.get<std::string>())) return Scan::kBad;
      name = n.get<std::string>();
    } else if (is_args) {
      args = value;
      have_args = true;
    }
  }
  if (name.empty()) return Scan::kBad;
  std::string a = have_args ? ArgsText(args, true) : "{}";
  if (!json::accept(a)) return Scan::kBad;
  out->calls.push_back({"", name, std::move(a)});
  out->open = false;
  return Scan::kOk;
}

// Adds a complete call `name` with `args` (JSON text), or says why not.
Scan AddCall(const Ctx& ctx, std::string name, std::string_view args, Calls* out) {
  if (!FindTool(ctx.tools, name) || !json::accept(args)) return Scan::kBad;
  out->calls.push_back({"", std::move(name), std::string(args)});
  out->open = false;
  return Scan::kOk;
}

// Reads the JSON arguments at in->i as the arguments of `name`: streamed while they grow.
Scan JsonArgs(const Ctx& ctx, In* in, const std::string& name, Calls* out) {
  if (!FindTool(ctx.tools, name)) return Scan::kBad;
  in->Ws();
  const size_t begin = in->i;
  const Scan s = SkipJson(in);
  if (s == Scan::kNeedMore) {
    if (ctx.partial) {
      out->calls.push_back({"", name, ArgsText(in->s.substr(begin), false)});
      out->open = true;
    }
    return s;
  }
  PC_SCAN(s);
  return AddCall(ctx, name, ArgsText(in->s.substr(begin, in->i - begin), true), out);
}

// Parameters written one by one (XML-like formats) become a JSON object, sent a parameter at
// a time: the text so far is always a prefix of the final arguments.
class ArgsBuilder {
 public:
  explicit ArgsBuilder(const ToolSpec* tool) : tool_(tool) {}

  // `raw`: the value as written; `is_string`: what the format says of it (nullopt: the schema
  // decides, and text that is not JSON is a string).
  void Add(std::string_view key, std::string_view raw, std::optional<bool> is_string) {
    text_ += text_.empty() ? "{" : ", ";
    text_ += json(std::string(key)).dump() + ": ";
    bool str = is_string.value_or(false);
    if (!is_string) {
      str = true;
      if (tool_ && tool_->parameters.contains("properties") &&
          tool_->parameters["properties"].contains(std::string(key))) {
        const auto& p = tool_->parameters["properties"][std::string(key)];
        str = p.contains("type") && p["type"] == "string";
        if (!p.contains("type")) str = !json::accept(raw);
      } else {
        str = !json::accept(raw);
      }
      if (!str && !json::accept(raw)) str = true;
    }
    text_ += str ? json(std::string(raw)).dump() : std::string(Trim(raw));
  }
  std::string Partial() const { return text_.empty() ? "{" : text_; }
  std::string Final() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  const ToolSpec* tool_;
  std::string text_;
};

void OpenCall(const std::string& name, const ArgsBuilder& args, Calls* out) {
  out->calls.push_back({"", name, args.Partial()});
  out->open = true;
}

// Skips to past `close`: a block that is not a valid call is content up to there.
Scan BadUntil(In* in, std::string_view close) {
  const size_t at = in->s.find(close, in->i);
  in->i = at == std::string_view::npos ? std::string_view::npos : at + close.size();
  return Scan::kBad;
}

// A call whose arguments are still being written stays open while streaming (`s`: kNeedMore).
void KeepOpen(const Ctx& ctx, Scan s, Calls* out) {
  if (s == Scan::kNeedMore && !out->calls.empty() && ctx.partial) out->open = true;
}

// Gives up on the block read since `begin`: its calls are dropped and the text up to `close`
// is skipped (it stays content).
Scan Refuse(In* in, size_t begin, std::string_view close, Calls* out) {
  out->calls.clear();
  in->i = begin;
  return BadUntil(in, close);
}

// ---- One block of calls, read from just after its start marker. ----

Scan Hermes(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  Scan s = CallObject(ctx, in, {"name"}, {"arguments", "parameters"}, out);
  if (s == Scan::kOk) s = in->WsLit("</tool_call>");
  return s == Scan::kBad ? Refuse(in, begin, "</tool_call>", out) : s;
}

// <function=NAME>\n<parameter=P>\nv\n</parameter>\n...</function>\n</tool_call>
Scan Qwen3Coder(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  auto bad = [&] { return Refuse(in, begin, "</tool_call>", out); };
  Scan s = in->WsLit("<function=");
  if (s != Scan::kOk) return s == Scan::kBad ? bad() : s;
  std::string_view name;
  if (in->Until(">", &name) != Scan::kOk) return Scan::kNeedMore;
  const ToolSpec* tool = FindTool(ctx.tools, name);
  if (!tool) return bad();
  ArgsBuilder args(tool);
  for (;;) {
    in->Ws();
    const Scan end = in->Lit("</function>");
    if (end == Scan::kOk) break;
    s = end == Scan::kNeedMore ? end : in->Lit("<parameter=");
    if (s == Scan::kNeedMore) {
      if (ctx.partial) OpenCall(std::string(name), args, out);
      return s;
    }
    if (s == Scan::kBad) return bad();
    std::string_view key, value;
    if (in->Until(">", &key) != Scan::kOk || in->Until("</parameter>", &value) != Scan::kOk) {
      if (ctx.partial) OpenCall(std::string(name), args, out);
      return Scan::kNeedMore;
    }
    // The template writes a newline on each side of the value.
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    args.Add(key, value, std::nullopt);
  }
  s = in->WsLit("</tool_call>");
  if (s == Scan::kBad) return bad();
  if (AddCall(ctx, std::string(name), args.Final(), out) != Scan::kOk) return bad();
  return s;
}

// NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n...</tool_call>
Scan Glm4(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  auto bad = [&] { return Refuse(in, begin, "</tool_call>", out); };
  in->Ws();
  const size_t name_begin = in->i;
  while (!in->AtEnd() && in->s[in->i] != '\n' && in->s[in->i] != '<') ++in->i;
  if (in->AtEnd()) return Scan::kNeedMore;
  const std::string name(Trim(in->s.substr(name_begin, in->i - name_begin)));
  const ToolSpec* tool = FindTool(ctx.tools, name);
  if (!tool) return bad();
  ArgsBuilder args(tool);
  for (;;) {
    in->Ws();
    const Scan end = in->Lit("</tool_call>");
    if (end == Scan::kOk) break;
    Scan s = end == Scan::kNeedMore ? end : in->Lit("<arg_key>");
    std::string_view key, value;
    if (s == Scan::kOk) s = in->Until("</arg_key>", &key);
    if (s == Scan::kOk) s = in->WsLit("<arg_value>");
    if (s == Scan::kOk) s = in->Until("</arg_value>", &value);
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) {
      if (ctx.partial) OpenCall(name, args, out);
      return s;
    }
    args.Add(key, value, std::nullopt);
  }
  return AddCall(ctx, name, args.Final(), out) == Scan::kOk ? Scan::kOk : bad();
}

// <｜DSML｜invoke name="N">\n<｜DSML｜parameter name="P" string="true">v</｜DSML｜parameter>\n...
// </｜DSML｜invoke>\n ... </｜DSML｜function_calls>
Scan Dsml(const Ctx& ctx, In* in, Calls* out) {
  constexpr std::string_view kClose = "</｜DSML｜function_calls>";
  const size_t begin = in->i;
  auto bad = [&] { return Refuse(in, begin, kClose, out); };
  for (;;) {
    in->Ws();
    const Scan end = in->Lit(kClose);
    if (end == Scan::kOk) return out->calls.empty() ? bad() : Scan::kOk;
    if (end == Scan::kNeedMore) return end;
    std::string_view name;
    Scan s = in->Lit("<｜DSML｜invoke name=\"");
    if (s == Scan::kOk) s = in->Until("\">", &name);
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) return s;
    const ToolSpec* tool = FindTool(ctx.tools, name);
    if (!tool) return bad();
    ArgsBuilder args(tool);
    for (;;) {
      in->Ws();
      const Scan end_invoke = in->Lit("</｜DSML｜invoke>");
      if (end_invoke == Scan::kOk) break;
      std::string_view key, attrs, value;
      s = end_invoke == Scan::kNeedMore ? end_invoke : in->Lit("<｜DSML｜parameter name=\"");
      if (s == Scan::kOk) s = in->Until("\"", &key);
      if (s == Scan::kOk) s = in->Until(">", &attrs);
      if (s == Scan::kOk) s = in->Until("</｜DSML｜parameter>", &value);
      if (s == Scan::kBad) return bad();
      if (s == Scan::kNeedMore) {
        if (ctx.partial) OpenCall(std::string(name), args, out);
        return s;
      }
      std::optional<bool> is_string;
      if (attrs.find("string=\"true\"") != std::string_view::npos) is_string = true;
      if (attrs.find("string=\"false\"") != std::string_view::npos) is_string = false;
      args.Add(key, value, is_string);
    }
    if (AddCall(ctx, std::string(name), args.Final(), out) != Scan::kOk) return bad();
  }
}

// <｜tool▁call▁begin｜>[function<｜tool▁sep｜>NAME\n```json\n{...}\n```|NAME<｜tool▁sep｜>{...}]
// <｜tool▁call▁end｜> ... <｜tool▁calls▁end｜>
Scan DeepSeek(const Ctx& ctx, In* in, Calls* out, bool r1) {
  constexpr std::string_view kClose = "<｜tool▁calls▁end｜>";
  const size_t begin = in->i;
  auto bad = [&] { return Refuse(in, begin, kClose, out); };
  for (;;) {
    in->Ws();
    const Scan end = in->Lit(kClose);
    if (end == Scan::kOk) return out->calls.empty() ? bad() : Scan::kOk;
    if (end == Scan::kNeedMore) return end;
    Scan s = in->Lit("<｜tool▁call▁begin｜>");
    std::string_view name;
    if (r1) {
      std::string_view type;
      if (s == Scan::kOk) s = in->Until("<｜tool▁sep｜>", &type);
      if (s == Scan::kOk) s = in->Until("\n", &name);
      if (s == Scan::kOk) s = in->Lit("```json\n");
    } else if (s == Scan::kOk) {
      s = in->Until("<｜tool▁sep｜>", &name);
    }
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) return s;
    s = JsonArgs(ctx, in, std::string(Trim(name)), out);
    if (s == Scan::kOk && r1) s = in->WsLit("```");
    if (s == Scan::kOk) s = in->WsLit("<｜tool▁call▁end｜>");
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) {
      KeepOpen(ctx, s, out);
      return s;
    }
  }
}

// <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|> ...
// <|tool_calls_section_end|>
Scan Kimi(const Ctx& ctx, In* in, Calls* out) {
  constexpr std::string_view kClose = "<|tool_calls_section_end|>";
  const size_t begin = in->i;
  auto bad = [&] { return Refuse(in, begin, kClose, out); };
  for (;;) {
    in->Ws();
    const Scan end = in->Lit(kClose);
    if (end == Scan::kOk) return out->calls.empty() ? bad() : Scan::kOk;
    if (end == Scan::kNeedMore) return end;
    std::string_view id;
    Scan s = in->Lit("<|tool_call_begin|>");
    if (s == Scan::kOk) s = in->Until("<|tool_call_argument_begin|>", &id);
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) return s;
    // "functions.NAME:INDEX"
    id = Trim(id);
    if (id.substr(0, 10) == "functions.") id.remove_prefix(10);
    if (const size_t colon = id.rfind(':'); colon != std::string_view::npos) {
      id = id.substr(0, colon);
    }
    s = JsonArgs(ctx, in, std::string(id), out);
    if (s == Scan::kOk) s = in->WsLit("<|tool_call_end|>");
    if (s == Scan::kBad) return bad();
    if (s == Scan::kNeedMore) {
      KeepOpen(ctx, s, out);
      return s;
    }
  }
}

// A JSON list of call objects: [{...}, {...}] (Mistral, Granite, Command-R).
Scan CallList(const Ctx& ctx, In* in, std::initializer_list<std::string_view> name_keys,
              std::initializer_list<std::string_view> args_keys, Calls* out) {
  PC_SCAN(in->WsLit("["));
  for (bool first = true;; first = false) {
    in->Ws();
    if (in->AtEnd()) return Scan::kNeedMore;
    if (in->s[in->i] == ']') {
      ++in->i;
      return out->calls.empty() ? Scan::kBad : Scan::kOk;
    }
    if (!first) PC_SCAN(in->Lit(","));
    const Scan s = CallObject(ctx, in, name_keys, args_keys, out);
    KeepOpen(ctx, s, out);
    PC_SCAN(s);
  }
}

// A block that is only a JSON list: a bad one is content to its end.
Scan ListBlock(const Ctx& ctx, In* in, std::initializer_list<std::string_view> name_keys,
               std::initializer_list<std::string_view> args_keys, std::string_view close,
               Calls* out) {
  const size_t begin = in->i;
  Scan s = CallList(ctx, in, name_keys, args_keys, out);
  if (s == Scan::kOk && !close.empty()) s = in->WsLit(close);
  KeepOpen(ctx, s, out);
  if (s != Scan::kBad) return s;
  out->calls.clear();
  in->i = begin;
  if (!close.empty()) return BadUntil(in, close);
  // Without a closing marker, the list's own end (or the answer's) ends it.
  in->i = begin;
  in->Ws();
  if (SkipJson(in) != Scan::kOk) in->i = std::string_view::npos;
  return Scan::kBad;
}

// NAME[ARGS]{...}, repeated (with or without [TOOL_CALLS] between calls).
Scan MistralArgs(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  for (;;) {
    std::string_view name;
    Scan s = in->Until("[ARGS]", &name);
    if (s == Scan::kNeedMore) return s;
    std::string n(Trim(name));
    if (const size_t id = n.find("[CALL_ID]"); id != std::string::npos) n.resize(id);
    s = JsonArgs(ctx, in, n, out);
    if (s == Scan::kNeedMore) {
      KeepOpen(ctx, s, out);
      return s;
    }
    if (s == Scan::kBad) {
      out->calls.clear();
      in->i = begin;
      in->Until("[ARGS]", &name);
      in->Ws();
      if (SkipJson(in) != Scan::kOk) in->i = std::string_view::npos;
      return Scan::kBad;
    }
    const In save = *in;
    in->Ws();
    if (in->AtEnd()) {
      *in = save;
      if (ctx.partial) {
        out->open = true;  // "[TOOL_CALLS]" may follow
        return Scan::kNeedMore;
      }
      return Scan::kOk;
    }
    if (in->Lit("[TOOL_CALLS]") != Scan::kOk) {
      if (PartialTag(in->Rest(), "[TOOL_CALLS]") == in->Rest().size() && ctx.partial) {
        out->open = true;
        return Scan::kNeedMore;
      }
      *in = save;
      return Scan::kOk;
    }
  }
}

// NAME>{...}</function>  (after "<function=")
Scan FunctionaryV31(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  std::string_view name;
  if (in->Until(">", &name) != Scan::kOk) return Scan::kNeedMore;
  Scan s = JsonArgs(ctx, in, std::string(name), out);
  if (s == Scan::kOk) s = in->WsLit("</function>");
  KeepOpen(ctx, s, out);
  return s != Scan::kBad ? s : Refuse(in, begin, "</function>", out);
}

// Command-R+: ```json\n[...]\n``` after "Action:".
Scan CommandR(const Ctx& ctx, In* in, Calls* out) {
  const size_t begin = in->i;
  Scan s = in->WsLit("```json");
  if (s == Scan::kOk) s = CallList(ctx, in, {"tool_name"}, {"parameters"}, out);
  if (s == Scan::kOk) s = in->WsLit("```");
  KeepOpen(ctx, s, out);
  if (s != Scan::kBad) return s;
  out->calls.clear();
  in->i = begin;
  in->Ws();
  if (in->Lit("```json") == Scan::kOk) return BadUntil(in, "```");
  in->i = begin;
  return Scan::kBad;
}

// ---- Drivers ----

struct Block {
  std::string_view marker;
  Scan (*parse)(const Ctx&, In*, Calls*);
};

// Content with blocks of calls anywhere in it, each opened by a marker. A block that is not a
// valid call is content.
void ParseTagged(const Ctx& ctx, std::string_view s, std::initializer_list<Block> blocks,
                 ParsedAnswer* out) {
  size_t pos = 0;
  for (;;) {
    size_t at = std::string_view::npos;
    const Block* block = nullptr;
    for (const Block& b : blocks) {
      const size_t f = s.find(b.marker, pos);
      if (f < at) {
        at = f;
        block = &b;
      }
    }
    if (!block) {
      size_t keep = 0;
      if (ctx.partial) {
        for (const Block& b : blocks) keep = std::max(keep, PartialTag(s.substr(pos), b.marker));
      }
      out->content.append(s.substr(pos, s.size() - pos - keep));
      return;
    }
    out->content.append(s.substr(pos, at - pos));
    In in{s, at + block->marker.size()};
    Calls calls;
    const Scan r = block->parse(ctx, &in, &calls);
    if (r == Scan::kOk) {
      for (auto& c : calls.calls) out->calls.push_back(std::move(c));
      pos = in.i;
      continue;
    }
    if (r == Scan::kNeedMore) {
      if (!ctx.partial && calls.open) calls.calls.pop_back();  // cut off inside a call
      for (auto& c : calls.calls) out->calls.push_back(std::move(c));
      out->last_call_open = ctx.partial && calls.open;
      return;
    }
    // Not a call: content, once its end is known.
    if (in.i == std::string_view::npos || in.i > s.size()) {
      if (!ctx.partial) out->content.append(s.substr(at));
      return;
    }
    out->content.append(s.substr(at, in.i - at));
    pos = in.i;
  }
}

// A whole answer that is one call or several (Llama 3.x, the generic format): a JSON object,
// or after <|python_tag|>; anything else is content.
void ParseWholeJson(const Ctx& ctx, std::string_view s, std::string_view args_key,
                    ParsedAnswer* out) {
  In in{s, 0};
  in.Ws();
  if (in.AtEnd()) {
    if (!ctx.partial) out->content.assign(s);
    return;
  }
  Scan tag = in.Lit("<|python_tag|>");
  if (tag == Scan::kNeedMore) {
    if (!ctx.partial) out->content.assign(s);
    return;
  }
  if (tag == Scan::kBad && in.s[in.i] != '{') {
    out->content.assign(s);
    return;
  }
  Calls calls;
  for (;;) {
    const Scan r = CallObject(ctx, &in, {"name"}, {args_key, "arguments", "parameters"}, &calls);
    if (r == Scan::kNeedMore) {
      if (ctx.partial) {
        out->calls = std::move(calls.calls);
        out->last_call_open = !out->calls.empty();
      } else if (calls.open) {
        calls.calls.pop_back();
        out->calls = std::move(calls.calls);
      }
      return;
    }
    if (r == Scan::kBad) break;
    in.Ws();
    if (in.AtEnd()) {
      out->calls = std::move(calls.calls);
      out->last_call_open = ctx.partial;
      return;
    }
    if (in.s[in.i] == ';') {
      ++in.i;
      continue;
    }
    break;
  }
  out->content.assign(s);  // not a call answer
}

// >>>NAME\n{...} (v3.2): the answer starts after the prompt's ">>>"; "all" is content.
void ParseFunctionaryV32(const Ctx& ctx, std::string_view s, ParsedAnswer* out) {
  size_t pos = 0;
  for (bool first = true;; first = false) {
    if (!first) {
      const size_t at = s.find(">>>", pos);
      if (at == std::string_view::npos) return;
      pos = at + 3;
    }
    const size_t segment = pos;
    const size_t nl = s.find('\n', pos);
    if (nl == std::string_view::npos) {
      if (!ctx.partial) out->content.append(s.substr(pos));
      return;
    }
    const std::string name(Trim(s.substr(pos, nl - pos)));
    pos = nl + 1;
    const size_t next = s.find(">>>", pos);
    const size_t end = next == std::string_view::npos ? s.size() : next;
    std::string_view body = s.substr(pos, end - pos);
    if (next == std::string_view::npos && ctx.partial) body.remove_suffix(PartialTag(body, ">>>"));
    if (name == "all" || !FindTool(ctx.tools, name)) {
      out->content.append(name == "all" ? body : s.substr(segment, pos + body.size() - segment));
    } else {
      In in{s.substr(0, end), pos};
      Calls calls;
      const Scan r = JsonArgs(ctx, &in, name, &calls);
      if (r == Scan::kNeedMore) {
        if (ctx.partial) {
          for (auto& c : calls.calls) out->calls.push_back(std::move(c));
        }
        return;
      }
      if (r == Scan::kOk) {
        for (auto& c : calls.calls) out->calls.push_back(std::move(c));
      } else {
        out->content.append(body);
      }
    }
    if (next == std::string_view::npos) return;
  }
}

// Harmony (gpt-oss): messages <|channel|>NAME[ to=functions.F][ <|constrain|>json]<|message|>
// BODY<|end|>, each after <|start|>assistant but the first. analysis is reasoning, final and
// commentary without a recipient are content, a recipient makes a call.
void ParseHarmony(const Ctx* ctx, bool partial, std::string_view s, ParsedAnswer* out) {
  // Without its markers shown (a vocabulary that hides them), the text is the answer.
  if (s.substr(0, 2) != std::string_view("<|").substr(0, std::min<size_t>(2, s.size()))) {
    out->content.assign(s);
    return;
  }
  size_t pos = 0;
  for (;;) {
    In in{s, pos};
    const In save = in;
    if (in.Lit("<|start|>") == Scan::kOk) {
      std::string_view role;
      // The role runs up to the header's next marker.
      const size_t lt = s.find("<|", in.i);
      if (lt == std::string_view::npos) return;
      role = s.substr(in.i, lt - in.i);
      (void)role;
      in.i = lt;
    } else {
      in = save;
    }
    std::string_view header;
    if (in.AtEnd()) return;
    const Scan h = in.Until("<|message|>", &header);
    if (h == Scan::kNeedMore) return;
    const size_t ch = header.find("<|channel|>");
    std::string_view channel =
        ch == std::string_view::npos ? std::string_view() : header.substr(ch + 11);
    channel = channel.substr(0, std::min(channel.find(' '), channel.find("<|")));
    std::string recipient;
    if (const size_t to = header.find("to=functions."); to != std::string_view::npos) {
      std::string_view r = header.substr(to + 13);
      r = r.substr(0, std::min({r.find(' '), r.find("<|"), r.size()}));
      recipient = std::string(r);
    }
    // The body ends at <|end|>, <|call|> or <|return|> (the last two end the answer and are
    // not shown), or at the end of the answer.
    size_t end = std::string_view::npos;
    size_t after = std::string_view::npos;
    for (std::string_view m : {"<|end|>", "<|call|>", "<|return|>"}) {
      const size_t f = s.find(m, in.i);
      if (f < end) {
        end = f;
        after = f + m.size();
      }
    }
    const bool complete = end != std::string_view::npos || !partial;
    std::string_view body = s.substr(in.i, (end == std::string_view::npos ? s.size() : end) - in.i);
    if (end == std::string_view::npos && partial) {
      size_t keep = 0;
      for (std::string_view m : {"<|end|>", "<|call|>", "<|return|>", "<|start|>"}) {
        keep = std::max(keep, PartialTag(body, m));
      }
      body.remove_suffix(keep);
    }
    if (!recipient.empty()) {
      if (ctx) {
        Calls calls;
        const Ctx c{ctx->tools, !complete};
        In args{body, 0};
        const Scan r = JsonArgs(c, &args, recipient, &calls);
        if (r == Scan::kNeedMore && complete) calls.calls.clear();
        for (auto& call : calls.calls) out->calls.push_back(std::move(call));
        if (!complete) out->last_call_open = !calls.calls.empty();
      }
    } else if (channel == "analysis") {
      out->reasoning.append(body);
    } else {
      out->content.append(body);
    }
    if (end == std::string_view::npos) return;
    pos = after;
  }
}

// Splits reasoning off the front of the answer. Returns the rest (the answer proper).
std::string_view SplitReasoning(ReasoningFormat format, bool starts_in_reasoning, bool partial,
                                std::string_view s, ParsedAnswer* out) {
  auto [open, close] = ReasoningTags(format);
  if (open.empty()) return s;
  In in{s, 0};
  in.Ws();
  const Scan o = in.Lit(open);
  if (o == Scan::kNeedMore && partial) return {};  // may be "<think>"
  if (o != Scan::kOk) {
    if (!starts_in_reasoning) return s;
    in.i = 0;
  }
  std::string_view reasoning;
  const Scan c = in.Until(close, &reasoning);
  if (c == Scan::kNeedMore && !partial) {
    // Never closed: a forced-open block is all reasoning (as vLLM's DeepSeek-R1 parser); an
    // opened-by-the-model one too, the answer was cut off in it.
    reasoning = s.substr(in.i);
  }
  // Surrounding whitespace is layout: the streamed text holds a trailing run back until
  // something follows it.
  size_t lead = 0;
  while (lead < reasoning.size() && IsSpace(reasoning[lead])) ++lead;
  reasoning.remove_prefix(lead);
  out->reasoning.append(c == Scan::kOk || !partial ? Trim(reasoning) : reasoning);
  if (c != Scan::kOk) {
    if (partial) {
      while (!out->reasoning.empty() && IsSpace(out->reasoning.back())) out->reasoning.pop_back();
    }
    return {};
  }
  std::string_view rest = in.Rest();
  while (!rest.empty() && IsSpace(rest.front())) rest.remove_prefix(1);
  return rest;
}

}  // namespace

ParsedAnswer ParseAnswer(const OutputFormat& format, bool starts_in_reasoning,
                         const ToolRequest* tools, std::string_view text, bool partial) {
  ParsedAnswer out;
  const bool with_tools = tools && tools->active();
  if (format.tools == ToolFormat::kGptOss || format.reasoning == ReasoningFormat::kGptOss) {
    std::optional<Ctx> ctx;
    if (with_tools) ctx.emplace(Ctx{*tools, partial});
    ParseHarmony(ctx ? &*ctx : nullptr, partial, text, &out);
    if (format.reasoning != ReasoningFormat::kGptOss) {
      out.content = out.reasoning + out.content;
      out.reasoning.clear();
    }
  } else {
    const std::string_view rest =
        SplitReasoning(format.reasoning, starts_in_reasoning, partial, text, &out);
    if (!with_tools) {
      out.content.assign(rest);
    } else {
      const Ctx ctx{*tools, partial};
      switch (format.tools) {
        case ToolFormat::kHermes:
          ParseTagged(ctx, rest, {{"<tool_call>", Hermes}}, &out);
          break;
        case ToolFormat::kQwen3Coder:
          ParseTagged(ctx, rest, {{"<tool_call>", Qwen3Coder}}, &out);
          break;
        case ToolFormat::kGlm4:
          ParseTagged(ctx, rest, {{"<tool_call>", Glm4}}, &out);
          break;
        case ToolFormat::kDeepSeekDsml:
          ParseTagged(ctx, rest, {{"<｜DSML｜function_calls>", Dsml}}, &out);
          break;
        case ToolFormat::kDeepSeekR1:
          ParseTagged(ctx, rest,
                      {{"<｜tool▁calls▁begin｜>",
                        [](const Ctx& c, In* in, Calls* o) { return DeepSeek(c, in, o, true); }}},
                      &out);
          break;
        case ToolFormat::kDeepSeekV31:
          ParseTagged(ctx, rest,
                      {{"<｜tool▁calls▁begin｜>",
                        [](const Ctx& c, In* in, Calls* o) { return DeepSeek(c, in, o, false); }}},
                      &out);
          break;
        case ToolFormat::kKimiK2:
          ParseTagged(ctx, rest, {{"<|tool_calls_section_begin|>", Kimi}}, &out);
          break;
        case ToolFormat::kMistral:
          ParseTagged(ctx, rest,
                      {{"[TOOL_CALLS]",
                        [](const Ctx& c, In* in, Calls* o) {
                          return ListBlock(c, in, {"name"}, {"arguments", "parameters"}, "", o);
                        }}},
                      &out);
          break;
        case ToolFormat::kMistralArgs:
          ParseTagged(ctx, rest, {{"[TOOL_CALLS]", MistralArgs}}, &out);
          break;
        case ToolFormat::kGranite:
          ParseTagged(ctx, rest,
                      {{"<|tool_call|>",
                        [](const Ctx& c, In* in, Calls* o) {
                          return ListBlock(c, in, {"name"}, {"arguments", "parameters"}, "", o);
                        }}},
                      &out);
          break;
        case ToolFormat::kCommandR7b:
          ParseTagged(ctx, rest,
                      {{"<|START_ACTION|>",
                        [](const Ctx& c, In* in, Calls* o) {
                          return ListBlock(c, in, {"tool_name"}, {"parameters"}, "<|END_ACTION|>",
                                           o);
                        }}},
                      &out);
          break;
        case ToolFormat::kCommandR:
          ParseTagged(ctx, rest, {{"Action:", CommandR}}, &out);
          break;
        case ToolFormat::kFunctionaryV31:
          ParseTagged(ctx, rest,
                      {{"<function=", FunctionaryV31},
                       {"<|python_tag|>",
                        [](const Ctx& c, In* in, Calls* o) {
                          // Functionary's code interpreter: the rest is Python source.
                          if (!FindTool(c.tools, "python")) return Scan::kBad;
                          const std::string code(in->Rest());
                          if (c.partial) return Scan::kNeedMore;
                          in->i = in->s.size();
                          return AddCall(c, "python", json{{"code", code}}.dump(), o);
                        }}},
                      &out);
          break;
        case ToolFormat::kFunctionaryV32:
          ParseFunctionaryV32(ctx, rest, &out);
          break;
        case ToolFormat::kLlama3:
          ParseWholeJson(ctx, rest, "parameters", &out);
          break;
        case ToolFormat::kGeneric:
        case ToolFormat::kGptOss:
          ParseWholeJson(ctx, rest, "arguments", &out);
          break;
      }
    }
  }
  // Layout around the answer is not content; while streaming, a trailing run waits to see
  // whether text follows it.
  if (partial || !out.calls.empty()) {
    while (!out.content.empty() && IsSpace(out.content.back())) out.content.pop_back();
  }
  return out;
}

}  // namespace polychip::server
