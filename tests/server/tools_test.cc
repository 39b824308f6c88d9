// Tool calls without a model: the forcing grammar accepts exactly the family's call text with
// valid arguments, and the parser finds the calls in an answer.
#include "server/tools.h"

#include <gtest/gtest.h>

#include "grammar/cache.h"

namespace polychip::server {
namespace {

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

bool Accepts(const std::string& ebnf, const std::string& text) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  grammar::GrammarCache cache(std::make_shared<grammar::TokenVocab>(bytes, std::vector<int32_t>{}));
  auto g = cache.Get(grammar::ConstraintKind::kEbnf, ebnf);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << ebnf;
  if (!g.ok()) return false;
  const int32_t st = (*g)->Advance(0, text);
  return st >= 0 && (*g)->IsAccepting(st);
}

TEST(Tools, RequiredGrammarForcesValidCalls) {
  const auto tools = Weather(ToolRequest::Choice::kRequired);
  auto g = ToolCallGrammar("chatml", tools);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_TRUE(Accepts(**g,
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                      "\"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(Accepts(**g,
                      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\", "
                      "\"unit\": \"f\"}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(
      **g,
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(**g, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(**g, "Sure!"));
}

TEST(Tools, NamedGrammarLlama3) {
  auto tools = Weather(ToolRequest::Choice::kNamed);
  tools.named = "get_time";
  auto g = ToolCallGrammar("llama3", tools);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_TRUE(Accepts(**g, "{\"name\": \"get_time\", \"parameters\": {}}"));
  EXPECT_FALSE(Accepts(**g, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}"));
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
  EXPECT_EQ(content, "Let me check.\n");
  calls = ParseToolCalls("chatml", tools, "no calls here", &content);
  EXPECT_TRUE(calls.empty());
  EXPECT_EQ(content, "no calls here");
  calls = ParseToolCalls("llama3", tools, R"({"name": "get_time", "parameters": {}})", &content);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, "{}");
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
