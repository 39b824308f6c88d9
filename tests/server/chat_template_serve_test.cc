// The model's own chat template end to end: `polychip serve` on a model whose GGUF carries a
// real model's template (llama.cpp's models/templates), checked against Python's jinja2 as
// transformers renders it: /apply-template, chat_template_kwargs, /v1/tokenize with messages,
// a chat completion's prompt, a template's refusal as a 400 naming its line, and
// `polychip template`.
#include <gtest/gtest.h>

#include <fstream>

#include "serve_process.h"

namespace polychip::server::testing {
namespace {

using ojson = nlohmann::ordered_json;

fs::path TemplatesDir() { return LlamaCppDir() / "models" / "templates"; }

void WriteFile(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// The reference: tests/jinja/render_one.py (jinja2 set up as transformers sets it up).
// nullopt when the template raised.
std::optional<std::string> Reference(const fs::path& jinja, const ojson& variables) {
  const fs::path vars = BuildDir() / "test-data" / ("hf-vars-" + std::to_string(getpid()) + ".json");
  WriteFile(vars, variables.dump());
  const auto r = RunCommand("python3 " POLYCHIP_SOURCE_DIR "/tests/jinja/render_one.py " +
                            polychip::testing::ShellQuote(jinja.string()) + " " + vars.string());
  fs::remove(vars);
  if (r.exit_code != 0) return std::nullopt;
  return r.out;
}

// A tiny synthesized model (qwen2 vocabulary) whose tokenizer.chat_template is `jinja`.
fs::path ModelWithTemplate(const fs::path& jinja, std::string* why) {
  const fs::path vocab = LlamaCppDir() / "models" / "ggml-vocab-qwen2.gguf";
  const fs::path model = BuildDir() / "test-data" / ("tiny-qwen2-" + jinja.stem().string() + ".gguf");
  if (fs::exists(model)) return model;
  if (!fs::exists(vocab) || !fs::exists(jinja)) {
    *why = "llama.cpp's vocabulary or templates not found: run tests/setup/setup-test-deps.sh";
    return {};
  }
  fs::create_directories(model.parent_path());
  const fs::path tmp = model.string() + ".tmp" + std::to_string(getpid());
  const std::string cmd = PolychipBinary().string() + " gguf synth --vocab " + vocab.string() +
                          " --shape tiny --type Q8_0 --seed 7 -q --chat-template-file " +
                          polychip::testing::ShellQuote(jinja.string()) + " --out " + tmp.string();
  if (RunCommand(cmd).exit_code != 0) {
    *why = "model synthesis failed: " + cmd;
    return {};
  }
  fs::rename(tmp, model);
  return model;
}

bool HavePythonJinja() {
  return RunCommand("python3 -c 'import jinja2'").exit_code == 0;
}

// A conversation with a system prompt, tools, a call, its result and non-ASCII text.
const char* kConversation = R"({
  "messages": [
    {"role": "system", "content": "Réponds en français."},
    {"role": "user", "content": "Quel temps fait-il à Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"c\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"t\": 21}"},
    {"role": "user", "content": "Et demain? \"quotes\" and \\backslash"}
  ],
  "tools": [{"type": "function", "function": {"name": "get_weather",
    "description": "Current weather", "parameters": {"type": "object",
    "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}},
    "required": ["city"]}}}]
})";

// The variables transformers gives the template for a request body.
ojson ReferenceVariables(const ojson& body, const ojson& kwargs = ojson::object()) {
  ojson v = ojson::object();
  v["messages"] = body["messages"];
  for (auto& m : v["messages"]) {
    if (!m.contains("tool_calls")) continue;
    for (auto& c : m["tool_calls"]) {
      c["function"]["arguments"] = ojson::parse(c["function"]["arguments"].get<std::string>());
    }
  }
  if (body.contains("tools")) v["tools"] = body["tools"];
  v["add_generation_prompt"] = true;
  v["bos_token"] = "<|endoftext|>";
  v["eos_token"] = "<|im_end|>";
  for (const auto& [k, x] : kwargs.items()) v[k] = x;
  return v;
}

TEST(ChatTemplateServe, TheModelsOwnTemplateRendersAsTransformersDoes) {
  if (!fs::exists(PolychipBinary()) || !fs::exists(CpuPlugin())) GTEST_SKIP() << "not built";
  if (!HavePythonJinja()) GTEST_SKIP() << "python3-jinja2 is not installed";
  const fs::path jinja = TemplatesDir() / "Qwen-Qwen3-0.6B.jinja";
  std::string why;
  const fs::path model = ModelWithTemplate(jinja, &why);
  if (model.empty()) GTEST_SKIP() << why;
  ServeProcess s(model.string(), {"--context-length", "1024"});
  ASSERT_TRUE(s.ok());

  const ojson body = ojson::parse(kConversation);
  auto [status, out] = s.PostRaw("/apply-template", body.dump());
  ASSERT_EQ(status, 200) << out.dump();
  const auto expected = Reference(jinja, ReferenceVariables(body));
  ASSERT_TRUE(expected.has_value());
  EXPECT_EQ(out["prompt"].get<std::string>(), *expected);

  // chat_template_kwargs reach the template: Qwen3 closes an empty <think> block itself.
  ojson no_think = body;
  no_think["chat_template_kwargs"] = {{"enable_thinking", false}};
  auto [status2, out2] = s.PostRaw("/apply-template", no_think.dump());
  ASSERT_EQ(status2, 200) << out2.dump();
  const auto expected2 =
      Reference(jinja, ReferenceVariables(body, {{"enable_thinking", false}}));
  ASSERT_TRUE(expected2.has_value());
  EXPECT_EQ(out2["prompt"].get<std::string>(), *expected2);
  EXPECT_NE(*expected2, *expected);

  // /v1/tokenize with messages counts the prompt a chat completion is given.
  auto [status3, tokens] = s.PostRaw("/v1/tokenize", body.dump());
  ASSERT_EQ(status3, 200) << tokens.dump();
  ojson chat = body;
  chat["max_tokens"] = 2;
  auto [status4, completion] = s.PostRaw("/v1/chat/completions", chat.dump());
  ASSERT_EQ(status4, 200) << completion.dump();
  EXPECT_EQ(completion["usage"]["prompt_tokens"], tokens["count"]);
  // "<|im_start|>" is one control token, not text.
  auto [status5, plain] = s.Post("/tokenize", {{"text", out["prompt"].get<std::string>()}});
  ASSERT_EQ(status5, 200);
  EXPECT_LT(tokens["count"].get<int>(), plain["count"].get<int>());
}

TEST(ChatTemplateServe, ATemplatesRefusalIsA400NamingItsLine) {
  if (!fs::exists(PolychipBinary()) || !fs::exists(CpuPlugin())) GTEST_SKIP() << "not built";
  const fs::path jinja = TemplatesDir() / "google-gemma-2-2b-it.jinja";
  if (!fs::exists(jinja)) GTEST_SKIP() << "llama.cpp's templates not found";
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256", "--chat-template-file", jinja.string()});
  ASSERT_TRUE(s.ok());
  const json body = {{"messages", {{{"role", "system"}, {"content", "x"}},
                                   {{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 2}};
  auto [status, out] = s.Post("/v1/chat/completions", body);
  EXPECT_EQ(status, 400) << out.dump();
  const std::string message = out["error"]["message"];
  EXPECT_NE(message.find("System role not supported"), std::string::npos) << message;
  EXPECT_NE(message.find("line "), std::string::npos) << message;
  // The server still answers what the template accepts.
  auto [ok_status, ok_out] = s.Post(
      "/v1/chat/completions",
      {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}});
  EXPECT_EQ(ok_status, 200) << ok_out.dump();
}

TEST(ChatTemplateCli, TemplateCommandPrintsWhatTheReferenceRenders) {
  if (!fs::exists(PolychipBinary())) GTEST_SKIP() << "polychip binary not built";
  if (!HavePythonJinja()) GTEST_SKIP() << "python3-jinja2 is not installed";
  const fs::path jinja = TemplatesDir() / "meta-llama-Llama-3.1-8B-Instruct.jinja";
  if (!fs::exists(jinja)) GTEST_SKIP() << "llama.cpp's templates not found";
  const ojson body = ojson::parse(kConversation);
  fs::create_directories(BuildDir() / "test-data");
  const fs::path conv = BuildDir() / "test-data" / ("conv-" + std::to_string(getpid()) + ".json");
  WriteFile(conv, body.dump());
  ojson vars = ReferenceVariables(body);
  vars["bos_token"] = "<|begin_of_text|>";
  vars["eos_token"] = "<|eot_id|>";
  const auto expected = Reference(jinja, vars);
  ASSERT_TRUE(expected.has_value());
  const auto r = RunCommand(PolychipBinary().string() + " template --template-file " +
                            jinja.string() + " --messages " + conv.string() +
                            " --bos '<|begin_of_text|>' --eos '<|eot_id|>'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Llama 3.1 writes today's date (strftime_now): compare the rest.
  auto without_date = [](std::string s) {
    return std::regex_replace(s, std::regex("Today Date: [^\n]*"), "Today Date: X");
  };
  EXPECT_EQ(without_date(r.out), without_date(*expected));
  EXPECT_NE(r.out.find("Environment: ipython"), std::string::npos) << r.out;

  // A template that refuses the conversation: a non-zero exit and the reason.
  const auto refused = RunCommand(PolychipBinary().string() + " template --template-file " +
                                  (TemplatesDir() / "google-gemma-2-2b-it.jinja").string() +
                                  " --messages " + conv.string());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("System role not supported"), std::string::npos) << refused.err;
  fs::remove(conv);
}

}  // namespace
}  // namespace polychip::server::testing
