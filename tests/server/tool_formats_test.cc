// Each family's tool-call and reasoning format without a model: the format recognised from the
// real templates (llama.cpp's models/templates), an answer written in it by the test parsed to
// the right calls, content and reasoning, finished and streamed in pieces of every size, and
// the forcing grammar accepting the family's call text and nothing else.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "grammar/cache.h"
#include "server/tools.h"
#include "grammar_accepts.h"

namespace polychip::server {
namespace {

using testing::GrammarAccepts;

using nlohmann::json;
using ordered = nlohmann::ordered_json;
namespace fs = std::filesystem;

ToolRequest Tools(ToolRequest::Choice choice) {
  ToolRequest t;
  t.choice = choice;
  ToolSpec w;
  w.name = "get_weather";
  w.parameters = ordered::parse(R"({"type":"object","properties":{
      "city":{"type":"string"},"unit":{"enum":["c","f"]},"days":{"type":"integer"}},
      "required":["city"]})");
  t.tools.push_back(w);
  ToolSpec c;
  c.name = "get_time";
  c.parameters = ordered::parse(R"({"type":"object","properties":{}})");
  t.tools.push_back(c);
  return t;
}

struct Call {
  std::string name;
  ordered args;
};

std::string Dump(const ordered& j) { return j.dump(); }

// The family's text for each call, as its template writes an assistant's tool_calls.
std::string Write(ToolFormat f, const std::vector<Call>& calls) {
  std::string out;
  auto xml_value = [](const ordered& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  switch (f) {
    case ToolFormat::kHermes:
      for (const auto& c : calls) {
        out += "<tool_call>\n{\"name\": \"" + c.name + "\", \"arguments\": " + Dump(c.args) +
               "}\n</tool_call>\n";
      }
      return out;
    case ToolFormat::kQwen3Coder:
      for (const auto& c : calls) {
        out += "<tool_call>\n<function=" + c.name + ">\n";
        for (const auto& [k, v] : c.args.items()) {
          out += "<parameter=" + k + ">\n" + xml_value(v) + "\n</parameter>\n";
        }
        out += "</function>\n</tool_call>\n";
      }
      return out;
    case ToolFormat::kGlm4:
      for (const auto& c : calls) {
        out += "<tool_call>" + c.name + "\n";
        for (const auto& [k, v] : c.args.items()) {
          out += "<arg_key>" + k + "</arg_key>\n<arg_value>" + xml_value(v) + "</arg_value>\n";
        }
        out += "</tool_call>";
      }
      return out;
    case ToolFormat::kDeepSeekDsml:
      out = "<｜DSML｜function_calls>\n";
      for (const auto& c : calls) {
        out += "<｜DSML｜invoke name=\"" + c.name + "\">\n";
        for (const auto& [k, v] : c.args.items()) {
          out += "<｜DSML｜parameter name=\"" + k + "\" string=\"" +
                 (v.is_string() ? "true" : "false") + "\">" + xml_value(v) +
                 "</｜DSML｜parameter>\n";
        }
        out += "</｜DSML｜invoke>\n";
      }
      return out + "</｜DSML｜function_calls>";
    case ToolFormat::kLlama3:
      return "{\"name\": \"" + calls[0].name + "\", \"parameters\": " + Dump(calls[0].args) + "}";
    case ToolFormat::kGeneric:
      return "{\"name\": \"" + calls[0].name + "\", \"arguments\": " + Dump(calls[0].args) + "}";
    case ToolFormat::kMistral:
    case ToolFormat::kGranite:
      out = f == ToolFormat::kMistral ? "[TOOL_CALLS][" : "<|tool_call|>[";
      for (size_t i = 0; i < calls.size(); ++i) {
        out += std::string(i ? ", " : "") + "{\"name\": \"" + calls[i].name +
               "\", \"arguments\": " + Dump(calls[i].args) + ", \"id\": \"abc123xyz\"}";
      }
      return out + "]";
    case ToolFormat::kMistralArgs:
      for (const auto& c : calls) out += "[TOOL_CALLS]" + c.name + "[ARGS]" + Dump(c.args);
      return out;
    case ToolFormat::kDeepSeekR1:
      out = "<｜tool▁calls▁begin｜>";
      for (size_t i = 0; i < calls.size(); ++i) {
        out += std::string(i ? "\n" : "") + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>" +
               calls[i].name + "\n```json\n" + Dump(calls[i].args) + "\n```<｜tool▁call▁end｜>";
      }
      return out + "<｜tool▁calls▁end｜>";
    case ToolFormat::kDeepSeekV31:
      out = "<｜tool▁calls▁begin｜>";
      for (const auto& c : calls) {
        out += "<｜tool▁call▁begin｜>" + c.name + "<｜tool▁sep｜>" + Dump(c.args) +
               "<｜tool▁call▁end｜>";
      }
      return out + "<｜tool▁calls▁end｜>";
    case ToolFormat::kKimiK2:
      out = "<|tool_calls_section_begin|>";
      for (size_t i = 0; i < calls.size(); ++i) {
        out += "<|tool_call_begin|>functions." + calls[i].name + ":" + std::to_string(i) +
               "<|tool_call_argument_begin|>" + Dump(calls[i].args) + "<|tool_call_end|>";
      }
      return out + "<|tool_calls_section_end|>";
    case ToolFormat::kGptOss:
      for (const auto& c : calls) {
        out += "<|start|>assistant<|channel|>commentary to=functions." + c.name +
               " <|constrain|>json<|message|>" + Dump(c.args) + "<|call|>";
      }
      return out;
    case ToolFormat::kFunctionaryV31:
      for (const auto& c : calls) out += "<function=" + c.name + ">" + Dump(c.args) + "</function>";
      return out;
    case ToolFormat::kFunctionaryV32:
      for (size_t i = 0; i < calls.size(); ++i) {
        out += (i ? ">>>" : "") + calls[i].name + "\n" + Dump(calls[i].args);
      }
      return out;
    case ToolFormat::kCommandR:
    case ToolFormat::kCommandR7b:
      out = f == ToolFormat::kCommandR ? "Action:\n```json\n[\n" : "<|START_ACTION|>[\n";
      for (size_t i = 0; i < calls.size(); ++i) {
        out += std::string(i ? ",\n" : "") + "    {\"tool_call_id\": \"" + std::to_string(i) +
               "\", \"tool_name\": \"" + calls[i].name +
               "\", \"parameters\": " + Dump(calls[i].args) + "}";
      }
      return out + (f == ToolFormat::kCommandR ? "\n]\n```" : "\n]<|END_ACTION|>");
  }
  return out;
}

// Formats whose answer is one call and nothing else.
bool SingleCall(ToolFormat f) {
  return f == ToolFormat::kLlama3 || f == ToolFormat::kGeneric || f == ToolFormat::kGptOss;
}

const std::vector<ToolFormat> kAllFormats = {
    ToolFormat::kGeneric,    ToolFormat::kHermes,         ToolFormat::kQwen3Coder,
    ToolFormat::kLlama3,     ToolFormat::kMistral,        ToolFormat::kMistralArgs,
    ToolFormat::kDeepSeekR1, ToolFormat::kDeepSeekV31,    ToolFormat::kDeepSeekDsml,
    ToolFormat::kGptOss,     ToolFormat::kFunctionaryV31, ToolFormat::kFunctionaryV32,
    ToolFormat::kCommandR,   ToolFormat::kCommandR7b,     ToolFormat::kGranite,
    ToolFormat::kKimiK2,     ToolFormat::kGlm4,
};

OutputFormat Format(ToolFormat tools, ReasoningFormat reasoning = ReasoningFormat::kNone) {
  OutputFormat f;
  f.tools = tools;
  f.reasoning = reasoning;
  return f;
}

struct Streamed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  size_t argument_deltas = 0;
};

Streamed Stream(const OutputFormat& f, bool starts_in_reasoning, const ToolRequest* tools,
                const std::string& text, size_t step) {
  AnswerStreamer s(f, starts_in_reasoning, tools);
  Streamed out;
  for (size_t i = 0; i < text.size() || i == 0; i += step) {
    std::vector<ToolCallDelta> deltas;
    const bool last = i + step >= text.size();
    s.Feed(std::string_view(text).substr(std::min(i, text.size()), step), last, &out.reasoning,
           &out.content, &deltas);
    for (const ToolCallDelta& d : deltas) {
      if (d.first) {
        EXPECT_EQ(d.index, out.calls.size());
        out.calls.push_back({d.id, d.name, d.arguments});
        continue;
      }
      EXPECT_LT(d.index, out.calls.size());
      if (d.index >= out.calls.size()) continue;
      out.calls[d.index].arguments += d.arguments;
      ++out.argument_deltas;
    }
    if (last) break;
  }
  // What the streamer holds at the end is what it sent.
  EXPECT_EQ(s.final().content, out.content);
  EXPECT_EQ(s.final().reasoning, out.reasoning);
  return out;
}

// The finished parse, and the same answer streamed in pieces of several sizes (byte by byte
// included) adding up to it.
ParsedAnswer ParseBothWays(const OutputFormat& f, bool starts_in_reasoning,
                           const ToolRequest* tools, const std::string& text) {
  const ParsedAnswer parsed = ParseAnswer(f, starts_in_reasoning, tools, text, false);
  for (size_t step : {1, 2, 3, 5, 8, 13, 64, 100000}) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Streamed s = Stream(f, starts_in_reasoning, tools, text, step);
    EXPECT_EQ(s.reasoning, parsed.reasoning);
    EXPECT_EQ(s.content, parsed.content);
    // A call streamed whole or in pieces: the same name and arguments.
    EXPECT_GE(s.calls.size(), parsed.calls.size());
    for (size_t k = 0; k < std::min(s.calls.size(), parsed.calls.size()); ++k) {
      EXPECT_EQ(s.calls[k].name, parsed.calls[k].name);
      EXPECT_EQ(s.calls[k].arguments, parsed.calls[k].arguments);
    }
    if (step == 1 && !parsed.calls.empty() && parsed.calls[0].arguments.size() > 20 &&
        f.tools != ToolFormat::kQwen3Coder && f.tools != ToolFormat::kGlm4 &&
        f.tools != ToolFormat::kDeepSeekDsml) {
      EXPECT_GT(s.argument_deltas, 5u) << "JSON arguments arrive as they are generated";
    }
  }
  return parsed;
}

const ordered kOslo = ordered::parse(R"({"city": "Oslo, \"Norway\" {x}", "unit": "c", "days": 3})");

TEST(ToolFormats, EachFormatParsesItsCallsFinishedAndStreamed) {
  const ToolRequest tools = Tools(ToolRequest::Choice::kAuto);
  for (ToolFormat f : kAllFormats) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    std::vector<Call> calls = {{"get_weather", kOslo}};
    if (!SingleCall(f)) calls.push_back({"get_time", ordered::object()});
    std::string prefix = "Let me check.\n";
    if (SingleCall(f)) prefix = "";
    if (f == ToolFormat::kFunctionaryV32) prefix = "all\nLet me check.\n>>>";
    const std::string text = prefix + Write(f, calls);
    const ParsedAnswer a = ParseBothWays(Format(f), false, &tools, text);
    ASSERT_EQ(a.calls.size(), calls.size()) << text;
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(a.calls[k].name, calls[k].name);
      EXPECT_EQ(json::parse(a.calls[k].arguments), json::parse(calls[k].args.dump())) << text;
    }
    EXPECT_EQ(a.content, SingleCall(f) ? "" : "Let me check.") << text;
    EXPECT_EQ(a.reasoning, "");
  }
}

TEST(ToolFormats, TextThatIsNoCallStaysContent) {
  const ToolRequest tools = Tools(ToolRequest::Choice::kAuto);
  for (ToolFormat f : kAllFormats) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    // An unknown function: its text is content, as is plain text.
    const std::string unknown = Write(f, {{"launch_rocket", ordered::parse(R"({"x": 1})")}});
    for (const std::string& text : {std::string("Just an answer, no <tools> here."), unknown}) {
      if (f == ToolFormat::kFunctionaryV32 && text == unknown) continue;  // its name is a recipient
      const ParsedAnswer a = ParseBothWays(Format(f), false, &tools, text);
      EXPECT_TRUE(a.calls.empty()) << text;
      if (f != ToolFormat::kGptOss || text != unknown) {
        EXPECT_EQ(a.content, text);
      }
    }
  }
}

TEST(ToolFormats, CutOffCallIsNoCall) {
  const ToolRequest tools = Tools(ToolRequest::Choice::kAuto);
  for (ToolFormat f : kAllFormats) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    const std::string whole = Write(f, {{"get_weather", kOslo}});
    const std::string cut = whole.substr(0, whole.find("Oslo") + 2);
    const ParsedAnswer a = ParseAnswer(Format(f), false, &tools, cut, false);
    EXPECT_TRUE(a.calls.empty()) << cut;
  }
}

TEST(ToolFormats, ForcingGrammarAcceptsTheFamilysCallOnly) {
  ToolRequest required = Tools(ToolRequest::Choice::kRequired);
  const ordered args = ordered::parse(R"({"city": "Oslo", "unit": "c"})");
  const ordered bad_args = ordered::parse(R"({"unit": "c"})");  // misses the required city
  for (ToolFormat f : kAllFormats) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    auto g = ToolCallGrammar(Format(f), required);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    ASSERT_TRUE(g->has_value());
    std::string call = Write(f, {{"get_weather", args}});
    if (f == ToolFormat::kHermes || f == ToolFormat::kQwen3Coder) call.pop_back();  // "\n"
    if (f == ToolFormat::kGptOss) {  // the prompt wrote <|start|>assistant; <|call|> ends it
      call = call.substr(std::string("<|start|>assistant").size());
      call.resize(call.size() - std::string("<|call|>").size());
    }
    if (f == ToolFormat::kMistral || f == ToolFormat::kGranite) {
      call = (f == ToolFormat::kMistral ? "[TOOL_CALLS][" : "<|tool_call|>[") +
             std::string("{\"name\": \"get_weather\", \"arguments\": ") + args.dump() + "}]";
    }
    if (f == ToolFormat::kCommandR) {
      call =
          "Action:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        "
          "\"parameters\": " +
          args.dump() + "\n    }\n]\n```";
    }
    if (f == ToolFormat::kCommandR7b) {
      call =
          "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", "
          "\"parameters\": " +
          args.dump() + "}\n]<|END_ACTION|>";
    }
    // The JSON writer's layout ({"a":1}) and the grammar's (one space at most) both pass.
    EXPECT_TRUE(GrammarAccepts(**g, call)) << call << "\n" << **g;
    // And what the grammar forces parses back as the call.
    const ParsedAnswer a = ParseAnswer(Format(f), false, &required, call, false);
    ASSERT_EQ(a.calls.size(), 1u) << call;
    EXPECT_EQ(json::parse(a.calls[0].arguments), json::parse(args.dump()));
    // Arguments that break the schema, plain text, and another family's call are refused.
    std::string bad = Write(f, {{"get_weather", bad_args}});
    EXPECT_FALSE(GrammarAccepts(**g, bad)) << bad;
    EXPECT_FALSE(GrammarAccepts(**g, "Sure!"));
    const ToolFormat other = f == ToolFormat::kHermes ? ToolFormat::kLlama3 : ToolFormat::kHermes;
    if (f != ToolFormat::kGeneric || other != ToolFormat::kLlama3) {
      EXPECT_FALSE(GrammarAccepts(**g, Write(other, {{"get_weather", args}})));
    }
  }
  // A named function: only that one.
  ToolRequest named = Tools(ToolRequest::Choice::kNamed);
  named.named = "get_time";
  auto g = ToolCallGrammar(Format(ToolFormat::kMistralArgs), named);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_TRUE(GrammarAccepts(**g, "[TOOL_CALLS]get_time[ARGS]{}"));
  EXPECT_FALSE(GrammarAccepts(**g, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"x\"}"));
}

TEST(ToolFormats, ForcedCallAfterAnOpenedReasoningBlockClosesIt) {
  const ToolRequest required = Tools(ToolRequest::Choice::kRequired);
  auto g = ToolCallGrammar(Format(ToolFormat::kHermes, ReasoningFormat::kThink), required, true);
  ASSERT_TRUE(g.ok() && g->has_value());
  const std::string text =
      "</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(GrammarAccepts(**g, text));
  const ParsedAnswer a =
      ParseBothWays(Format(ToolFormat::kHermes, ReasoningFormat::kThink), true, &required, text);
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.reasoning, "");
}

TEST(Reasoning, ThinkBlocks) {
  const OutputFormat think = Format(ToolFormat::kHermes, ReasoningFormat::kThink);
  // Written by the model.
  ParsedAnswer a =
      ParseBothWays(think, false, nullptr, "<think>\nI should check.\n</think>\n\nIt is sunny.");
  EXPECT_EQ(a.reasoning, "I should check.");
  EXPECT_EQ(a.content, "It is sunny.");
  // Opened by the generation prompt: only the end tag is in the answer.
  a = ParseBothWays(think, true, nullptr, "I should check.\nTwice.\n</think>\n\nIt is sunny.");
  EXPECT_EQ(a.reasoning, "I should check.\nTwice.");
  EXPECT_EQ(a.content, "It is sunny.");
  // Cut off while thinking: all reasoning.
  a = ParseBothWays(think, true, nullptr, "Still thinking about");
  EXPECT_EQ(a.reasoning, "Still thinking about");
  EXPECT_EQ(a.content, "");
  // No reasoning at all (thinking switched off).
  a = ParseBothWays(think, false, nullptr, "It is sunny.");
  EXPECT_EQ(a.reasoning, "");
  EXPECT_EQ(a.content, "It is sunny.");
  // A thinking model's call after its reasoning.
  const ToolRequest tools = Tools(ToolRequest::Choice::kAuto);
  a = ParseBothWays(think, true, &tools,
                    "Need the time.</think>\n\n<tool_call>\n{\"name\": \"get_time\", "
                    "\"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(a.reasoning, "Need the time.");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.content, "");
  // A format without reasoning keeps the tags in the content.
  a = ParseBothWays(Format(ToolFormat::kHermes), false, nullptr, "<think>x</think>y");
  EXPECT_EQ(a.content, "<think>x</think>y");
}

TEST(Reasoning, OtherFamilies) {
  struct Case {
    ReasoningFormat format;
    std::string text;
  };
  for (const Case& c : std::vector<Case>{
           {ReasoningFormat::kMistral, "[THINK]Hmm.[/THINK]Answer."},
           {ReasoningFormat::kCommandR7b, "<|START_THINKING|>Hmm.<|END_THINKING|>Answer."},
           {ReasoningFormat::kSeed, "<seed:think>Hmm.</seed:think>Answer."},
           {ReasoningFormat::kGptOss,
            "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Answer."},
           {ReasoningFormat::kGptOss,
            "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Answer.<|return|>"},
       }) {
    SCOPED_TRACE(c.text);
    const ToolFormat tools =
        c.format == ReasoningFormat::kGptOss ? ToolFormat::kGptOss : ToolFormat::kHermes;
    const ParsedAnswer a = ParseBothWays(Format(tools, c.format), false, nullptr, c.text);
    EXPECT_EQ(a.reasoning, "Hmm.");
    EXPECT_EQ(a.content, "Answer.");
  }
  // gpt-oss: reasoning, then a call on the commentary channel.
  const ToolRequest tools = Tools(ToolRequest::Choice::kAuto);
  const ParsedAnswer a = ParseBothWays(
      Format(ToolFormat::kGptOss, ReasoningFormat::kGptOss), false, &tools,
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}");
  EXPECT_EQ(a.reasoning, "Need weather.");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, "{\"city\":\"Oslo\"}");
}

fs::path TemplatesDir() {
  const char* env = std::getenv("POLYCHIP_LLAMA_CPP_DIR");
  return fs::path(env && *env ? env : "/root/.cache/polychip/llama.cpp") / "models" / "templates";
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The formats of llama.cpp's real templates, recognised from their source.
TEST(ToolFormats, DetectedFromRealTemplates) {
  if (!fs::exists(TemplatesDir())) GTEST_SKIP() << "no " << TemplatesDir();
  struct Expect {
    const char* file;
    ToolFormat tools;
    ReasoningFormat reasoning;
    bool opens;
  };
  using T = ToolFormat;
  using R = ReasoningFormat;
  const std::vector<Expect> expected = {
      {"Qwen-Qwen2.5-7B-Instruct", T::kHermes, R::kNone, false},
      {"Qwen-Qwen3-0.6B", T::kHermes, R::kThink, false},
      {"Qwen-QwQ-32B", T::kHermes, R::kThink, true},
      {"Qwen3-Coder", T::kQwen3Coder, R::kNone, false},
      {"Qwen3.5-4B", T::kQwen3Coder, R::kThink, true},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", T::kQwen3Coder, R::kThink, true},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", T::kHermes, R::kNone, false},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", T::kHermes, R::kNone, false},
      {"meta-llama-Llama-3.1-8B-Instruct", T::kLlama3, R::kNone, false},
      {"meta-llama-Llama-3.2-3B-Instruct", T::kLlama3, R::kNone, false},
      {"meta-llama-Llama-3.3-70B-Instruct", T::kLlama3, R::kNone, false},
      {"mistralai-Mistral-Nemo-Instruct-2407", T::kMistral, R::kNone, false},
      {"Mistral-Small-3.2-24B-Instruct-2506", T::kMistralArgs, R::kNone, false},
      {"unsloth-mistral-Devstral-Small-2507", T::kMistralArgs, R::kNone, false},
      {"mistralai-Ministral-3-14B-Reasoning-2512", T::kMistralArgs, R::kMistral, false},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", T::kDeepSeekR1, R::kThink, true},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", T::kDeepSeekR1, R::kThink, true},
      {"llama-cpp-deepseek-r1", T::kDeepSeekR1, R::kThink, true},
      {"deepseek-ai-DeepSeek-V3.1", T::kDeepSeekV31, R::kThink, true},
      {"deepseek-ai-DeepSeek-V3.2", T::kDeepSeekDsml, R::kThink, false},
      {"openai-gpt-oss-120b", T::kGptOss, R::kGptOss, false},
      {"meetkai-functionary-medium-v3.1", T::kFunctionaryV31, R::kNone, false},
      {"meetkai-functionary-medium-v3.2", T::kFunctionaryV32, R::kNone, false},
      {"CohereForAI-c4ai-command-r-plus-tool_use", T::kCommandR, R::kNone, false},
      {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", T::kCommandR7b, R::kCommandR7b, false},
      {"ibm-granite-granite-3.3-2B-Instruct", T::kGranite, R::kThink, false},
      {"ibm-granite-granite-4.0", T::kHermes, R::kNone, false},
      {"moonshotai-Kimi-K2", T::kKimiK2, R::kNone, false},
      {"Kimi-K2-Instruct", T::kKimiK2, R::kNone, false},
      {"Kimi-K2-Thinking", T::kKimiK2, R::kThink, false},
      {"GLM-4.6", T::kGlm4, R::kThink, false},
      {"GLM-4.7-Flash", T::kGlm4, R::kThink, true},
      {"google-gemma-2-2b-it", T::kGeneric, R::kNone, false},
  };
  for (const Expect& e : expected) {
    const fs::path p = TemplatesDir() / (std::string(e.file) + ".jinja");
    if (!fs::exists(p)) continue;
    const OutputFormat f = DetectOutputFormat(ReadFile(p));
    EXPECT_EQ(ToolFormatName(f.tools), ToolFormatName(e.tools)) << e.file;
    EXPECT_EQ(ReasoningFormatName(f.reasoning), ReasoningFormatName(e.reasoning)) << e.file;
    EXPECT_EQ(f.reasoning_opens_in_prompt, e.opens) << e.file;
  }
}

}  // namespace
}  // namespace polychip::server
