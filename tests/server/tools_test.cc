// Tool calls without a model: the forcing grammar accepts exactly the family's call text with
// valid arguments, and the parser finds the calls in an answer.
#include "server/tools.h"

#include <gtest/gtest.h>

#include "grammar/cache.h"
#include "grammar_accepts.h"

namespace polychip::server {
namespace {

using testing::GrammarAccepts;

using nlohmann::json;

ToolRequest Weather(ToolRequest::Choice choice) {
  ToolRequest t;
  t.choice = choice;
  ToolSpec w;
  w.name = "get_weather";
  w.parameters = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city"]})");
  t.tools.push_back(w);
  ToolSpec c;
  c.name = "get_time";
  t.tools.push_back(c);
  t.tools.back().parameters = nlohmann::ordered_json::parse(R"({"type":"object","properties":{}})");
  return t;
}

TEST(Tools, RequiredGrammarForcesValidCalls) {
  const auto tools = Weather(ToolRequest::Choice::kRequired);
  auto g = ToolCallGrammar("chatml", tools);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_TRUE(GrammarAccepts(**g,
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                      "\"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(GrammarAccepts(**g,
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", "
                      "\"unit\": \"f\"}}\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(
      **g,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(**g, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(GrammarAccepts(**g, "Sure!"));
}

TEST(Tools, NamedGrammarLlama3) {
  auto tools = Weather(ToolRequest::Choice::kNamed);
  tools.named = "get_time";
  auto g = ToolCallGrammar("llama3", tools);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_TRUE(GrammarAccepts(**g, "{\"name\": \"get_time\", \"parameters\": {}}"));
  EXPECT_FALSE(GrammarAccepts(**g, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}"));
  auto none = ToolCallGrammar("chatml", Weather(ToolRequest::Choice::kAuto));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());  // auto is parsed, not forced
}

TEST(Tools, ParseCallsAndContent) {
  const auto tools = Weather(ToolRequest::Choice::kAuto);
  std::string content;
  auto calls = ParseToolCalls("chatml", tools,
                              "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                              "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
                              &content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(calls[0].arguments), json::parse(R"({"city":"Oslo"})"));
  EXPECT_EQ(calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(content, "Let me check.");  // the layout before the call is not content
  calls = ParseToolCalls("chatml", tools, "no calls here", &content);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, "no calls here");
  calls = ParseToolCalls("llama3", tools, R"({"name": "get_time", "parameters": {}})", &content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, "{}");
}

// Streams `text` in pieces of `step` bytes; returns the reassembled calls and content.
struct Streamed {
  std::vector<ToolCall> calls;
  std::string content;
  std::vector<size_t> argument_deltas;  // per call
};
Streamed Stream(const std::string& format, const ToolRequest& tools, const std::string& text,
                size_t step) {
  ToolCallStreamer s(format, tools);
  Streamed out;
  for (size_t i = 0; i < text.size(); i += step) {
    std::vector<ToolCallDelta> deltas;
    const bool last = i + step >= text.size();
    s.Feed(std::string_view(text).substr(i, step), last, &out.content, &deltas);
    for (const ToolCallDelta& d : deltas) {
      if (d.first) {
        EXPECT_EQ(d.index, out.calls.size());
        EXPECT_EQ(d.id.rfind("call_", 0), 0u);
        out.calls.push_back({d.id, d.name, d.arguments});
        out.argument_deltas.push_back(0);
        continue;
      }
      EXPECT_TRUE(d.id.empty() && d.name.empty());
      EXPECT_LT(d.index, out.calls.size());
      if (d.index >= out.calls.size()) continue;
      out.calls[d.index].arguments += d.arguments;
      ++out.argument_deltas[d.index];
    }
  }
  return out;
}

TEST(Tools, StreamedCallsReassembleToTheParsedOnes) {
  const auto tools = Weather(ToolRequest::Choice::kAuto);
  const std::vector<std::pair<std::string, std::string>> answers = {
      {"chatml", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                 "{\"city\": \"Oslo, the capital {with} \\\"braces\\\"\", \"unit\": \"c\"}}\n"
                 "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
                 "</tool_call>"},
      {"chatml", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"
                 "\n</tool_call>\n"},
      {"chatml", "a < b <tool_ and text only"},
      {"chatml", "<tool_call>\n{\"name\": \"unknown\", \"arguments\": {}}\n</tool_call> tail"},
      {"llama3", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}"},
      {"llama3", "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}"},
      {"llama3", "{not a call} but text"},
  };
  for (const auto& [format, text] : answers) {
    std::string content;
    const auto parsed = ParseToolCalls(format, tools, text, &content);
    for (size_t step : {1, 3, 7, 1000}) {
      const Streamed s = Stream(format, tools, text, step);
      ASSERT_EQ(s.calls.size(), parsed.size()) << text << " step " << step;
      for (size_t k = 0; k < parsed.size(); ++k) {
        EXPECT_EQ(s.calls[k].name, parsed[k].name) << text;
        EXPECT_EQ(s.calls[k].arguments, parsed[k].arguments) << text << " step " << step;
      }
      EXPECT_EQ(s.content, content) << text << " step " << step;
      // Byte by byte, a long argument arrives in many deltas.
      if (step == 1 && !parsed.empty() && parsed[0].arguments.size() > 10) {
        EXPECT_GT(s.argument_deltas[0], 10u) << text;
      }
    }
  }
  // What the parser found, for the first and the unknown-name answers.
  std::string content;
  auto calls = ParseToolCalls("chatml", tools, answers[0].second, &content);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(json::parse(calls[0].arguments)["city"], "Oslo, the capital {with} \"braces\"");
  EXPECT_EQ(calls[1].arguments, "{}");
  EXPECT_EQ(content, "Let me check.");
  calls = ParseToolCalls("chatml", tools, answers[1].second, &content);
  EXPECT_EQ(content, "");  // whitespace around calls is no content
  calls = ParseToolCalls("chatml", tools, answers[3].second, &content);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, answers[3].second);
  calls = ParseToolCalls("llama3", tools, answers[6].second, &content);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, answers[6].second);
}

// Cut off by max_tokens inside the arguments: the deltas sent stay, no complete call.
TEST(Tools, TruncatedCallIsNoCall) {
  const auto tools = Weather(ToolRequest::Choice::kAuto);
  std::string content;
  const auto calls = ParseToolCalls(
      "chatml", tools, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
      &content);
  EXPECT_TRUE(calls.empty());
  const Streamed s = Stream("chatml", tools,
                            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", 4);
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].name, "get_weather");
}

TEST(Tools, MessagesRenderedForTheTemplate) {
  const auto tools = Weather(ToolRequest::Choice::kAuto);
  const json in = json::parse(R"([
    {"role":"user","content":"weather?"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"{\"t\":3}"}])");
  const json out = RenderToolMessages("chatml", tools, in);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0]["role"], "system");
  EXPECT_NE(out[0]["content"].get<std::string>().find("<tools>"), std::string::npos);
  EXPECT_EQ(
      out[2]["content"],
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(out[3]["role"], "user");
  EXPECT_EQ(out[3]["content"], "<tool_response>\n{\"t\":3}\n</tool_response>");
}

}  // namespace
}  // namespace polychip::server
