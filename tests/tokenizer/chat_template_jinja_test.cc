// ChatTemplate: the model's Jinja template with its variables (bos/eos, tools, kwargs, the
// tool_use variant), the normalisation servers apply to messages, and errors that name the
// template line.
#include <gtest/gtest.h>

#include "model/chat_template.h"

namespace polychip::model {
namespace {

using ojson = nlohmann::ordered_json;

// A Qwen2.5-like template: a default system prompt when none is given, tools listed with
// tojson, tool calls printed from their (object) arguments.
constexpr const char* kQwenLike = R"({%- if messages[0].role == 'system' -%}
<|im_start|>system
{{ messages[0].content }}
{%- else -%}
<|im_start|>system
You are Qwen, created by Alibaba Cloud.
{%- endif %}
{%- if tools %}
# Tools
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
{%- endif %}<|im_end|>
{% for message in messages -%}
{%- if message.role != 'system' -%}
<|im_start|>{{ message.role }}
{% if message.content %}{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}<tool_call>{{ call.function.arguments | tojson }}</tool_call>{% endfor -%}
<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}
{%- endif -%})";

ChatInput UserSays(const std::string& text) {
  ChatInput in;
  in.messages.push_back({{"role", "user"}, {"content", text}});
  return in;
}

TEST(ChatTemplateJinja, TheModelsDefaultSystemPromptIsKept) {
  auto t = ChatTemplate::FromJinja(kQwenLike, "", "<|im_end|>", "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->is_jinja());
  auto out = t->Render(UserSays("Hi"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateJinja, KwargsReachTheTemplateAndARequestOverridesTheDefault) {
  auto t = ChatTemplate::FromJinja(kQwenLike, "", "", "test");
  ASSERT_TRUE(t.ok());
  t->set_default_kwargs({{"enable_thinking", false}});
  auto off = t->Render(UserSays("Hi"));
  ASSERT_TRUE(off.ok());
  EXPECT_NE(off->find("<think>\n\n</think>\n\n"), std::string::npos) << *off;
  ChatInput on = UserSays("Hi");
  on.kwargs = {{"enable_thinking", true}};
  auto rendered = t->Render(on);
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(rendered->find("<think>"), std::string::npos) << *rendered;

  ChatInput bad = UserSays("Hi");
  bad.kwargs = {{"messages", ojson::array()}};
  auto refused = t->Render(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'messages'"), std::string::npos);
}

TEST(ChatTemplateJinja, ToolsAndToolCallArgumentsAreObjectsForTheTemplate) {
  auto t = ChatTemplate::FromJinja(kQwenLike, "", "", "test");
  ASSERT_TRUE(t.ok());
  ChatInput in = UserSays("Weather?");
  // Keys in the client's order, not sorted: templates print schemas as sent.
  in.tools = ojson::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  in.messages.push_back(ojson::parse(
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Zürich\"}"}}]})"));
  auto out = t->Render(in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_NE(out->find(R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})"),
            std::string::npos)
      << *out;
  // The arguments' JSON text became an object, printed without ASCII escapes.
  EXPECT_NE(out->find(R"(<tool_call>{"city": "Zürich"}</tool_call>)"), std::string::npos) << *out;
}

TEST(ChatTemplateJinja, TheToolUseVariantServesRequestsWithTools) {
  auto t = ChatTemplate::FromJinja("plain", "", "", "test", "with tools: {{ tools | length }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render(UserSays("x")), "plain");
  ChatInput in = UserSays("x");
  in.tools = ojson::parse(R"([{"type":"function","function":{"name":"f"}}])");
  EXPECT_EQ(*t->Render(in), "with tools: 1");
}

TEST(ChatTemplateJinja, ARefusalNamesTheTemplateLine) {
  auto t = ChatTemplate::FromJinja(
      "{% for m in messages %}\n{% if m.role == 'system' %}\n"
      "{{ raise_exception('System role not supported') }}\n{% endif %}{% endfor %}",
      "", "", "test");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatInput in;
  in.messages.push_back({{"role", "system"}, {"content", "x"}});
  auto out = t->Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("System role not supported"), std::string::npos);
  EXPECT_NE(out.status().message().find("line 3"), std::string::npos)
      << out.status().message();
}

TEST(ChatTemplateJinja, ATemplateThatDoesNotParseIsAnError) {
  auto t = ChatTemplate::FromJinja("{% if messages %}never closed", "", "", "test");
  EXPECT_FALSE(t.ok());
}

TEST(ChatTemplateJinja, BosWrittenByTheTemplateIsDetected) {
  auto t = ChatTemplate::FromJinja("{{ bos_token }}{{ messages[0].content }}", "<s>", "</s>",
                                   "test");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(UserSays("hi"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<s>hi");
  EXPECT_TRUE(t->StartsWithBos(*out));
  EXPECT_FALSE(t->StartsWithBos("hi"));
}

TEST(ChatTemplateJinja, AFamilyFormatsFilesWithoutATemplate) {
  const ChatTemplate t = ChatTemplate::FromFamily(ChatFormat::kChatMl);
  EXPECT_FALSE(t.is_jinja());
  EXPECT_EQ(*t.Render(UserSays("Hi")), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(NormalizeChatMessages, PartsJoinDeveloperIsSystemArgumentsParse) {
  auto out = NormalizeChatMessages(ojson::parse(R"([
    {"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
    {"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"x\":1}"}},
                                       {"function":{"name":"g","arguments":"not json"}}]}])"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0]["role"], "system");
  EXPECT_EQ((*out)[0]["content"], "ab");
  EXPECT_EQ((*out)[1]["tool_calls"][0]["function"]["arguments"]["x"], 1);
  EXPECT_EQ((*out)[1]["tool_calls"][1]["function"]["arguments"], "not json");
  EXPECT_FALSE(NormalizeChatMessages(ojson::parse(
                   R"([{"role":"user","content":[{"type":"image_url","image_url":{}}]}])"))
                   .ok());
}

}  // namespace
}  // namespace polychip::model
