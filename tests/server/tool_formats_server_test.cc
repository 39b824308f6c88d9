// Forced tool calls through the whole chat route, in every family's format: the HTTP server
// in-process over the fake runner (its logits pick arbitrary tokens, like random weights) and
// a byte-level codec that says the model writes calls in the format under test. With
// tool_choice "required" the grammar must make whatever the model samples a call that parses
// back, as JSON arguments that validate against the schema, streamed and not alike.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "common/fake_runner.h"
#include "common/sse.h"
#include "server/http_server.h"
#include "byte_codec.h"

namespace polychip::server {
namespace {

using engine::testing::FakeRunner;
using testing::ByteCodec;
using testing::ByteCodecOptions;
using nlohmann::json;

constexpr int64_t kVocab = 300;


struct Server {
  explicit Server(OutputFormat format)
      : codec(ByteCodecOptions{.prompt_suffix = "assistant: ", .output_format = format}) {
    runner = std::make_unique<FakeRunner>(kVocab, 2048, 4, 1024);
    engine = std::make_unique<engine::Engine>(
        runner.get(), engine::EngineOptions{}, [this](int32_t t) { return codec.Piece(t); },
        codec.EogTokens());
    engine->Start();
    ServerOptions so;
    so.port = 0;
    so.http_threads = 8;
    http = std::make_unique<HttpServer>(so, engine.get(), &codec);
    EXPECT_TRUE(http->Bind().ok());
    thread = std::thread([this] { http->Run(); });
    client = std::make_unique<httplib::Client>("127.0.0.1", http->port());
    client->set_read_timeout(60, 0);
  }
  ~Server() {
    http->Stop();
    thread.join();
    engine->Stop();
  }
  ByteCodec codec;
  std::unique_ptr<FakeRunner> runner;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  std::unique_ptr<httplib::Client> client;
};

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]},
                   "days": {"type": "integer"}},
    "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "get_time",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}])");

// The arguments satisfy the function's schema (written out for the two test functions).
void ExpectValid(const std::string& name, const std::string& arguments) {
  const json a = json::parse(arguments, nullptr, false);
  ASSERT_TRUE(a.is_object()) << arguments;
  if (name == "get_time") {
    EXPECT_TRUE(a.empty()) << arguments;
    return;
  }
  ASSERT_EQ(name, "get_weather");
  ASSERT_TRUE(a.contains("city") && a["city"].is_string()) << arguments;
  // maxLength counts characters: at most 12 code points, so at most 48 bytes.
  EXPECT_LE(a["city"].get<std::string>().size(), 48u) << arguments;
  ASSERT_TRUE(a.contains("unit")) << arguments;
  EXPECT_TRUE(a["unit"] == "c" || a["unit"] == "f") << arguments;
  if (a.contains("days")) EXPECT_TRUE(a["days"].is_number_integer()) << arguments;
  for (const auto& [k, v] : a.items()) {
    EXPECT_TRUE(k == "city" || k == "unit" || k == "days") << arguments;
  }
}

TEST(ToolFormatsServer, ForcedCallsParseBackInEveryFormat) {
  for (ToolFormat f :
       {ToolFormat::kGeneric, ToolFormat::kHermes, ToolFormat::kQwen3Coder, ToolFormat::kLlama3,
        ToolFormat::kMistral, ToolFormat::kMistralArgs, ToolFormat::kDeepSeekR1,
        ToolFormat::kDeepSeekV31, ToolFormat::kDeepSeekDsml, ToolFormat::kGptOss,
        ToolFormat::kFunctionaryV31, ToolFormat::kFunctionaryV32, ToolFormat::kCommandR,
        ToolFormat::kCommandR7b, ToolFormat::kGranite, ToolFormat::kKimiK2, ToolFormat::kGlm4}) {
    SCOPED_TRACE(std::string(ToolFormatName(f)));
    OutputFormat format;
    format.tools = f;
    if (f == ToolFormat::kGptOss) format.reasoning = ReasoningFormat::kGptOss;
    Server s(format);
    for (int seed : {3, 4})
      for (const json& choice : {json("required"), json{{"type", "function"},
                                                        {"function", {{"name", "get_weather"}}}}}) {
        json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Oslo?"}}}},
                     {"tools", kTools},
                     {"tool_choice", choice},
                     {"temperature", 1},
                     {"seed", seed},
                     {"max_tokens", 1200}};
        auto r = s.client->Post("/v1/chat/completions", body.dump(), "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json whole = json::parse(r->body);
        const json& message = whole["choices"][0]["message"];
        EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls") << r->body;
        ASSERT_TRUE(message.contains("tool_calls")) << r->body;
        ASSERT_GE(message["tool_calls"].size(), 1u);
        for (const json& c : message["tool_calls"]) {
          ExpectValid(c["function"]["name"], c["function"]["arguments"]);
          if (choice.is_object()) EXPECT_EQ(c["function"]["name"], "get_weather");
        }
        // Streamed with the same seed: the same tokens, so the deltas add up to the same calls.
        body["stream"] = true;
        auto st = s.client->Post("/v1/chat/completions", body.dump(), "application/json");
        ASSERT_TRUE(st);
        ASSERT_EQ(st->status, 200);
        bool done = false;
        json calls = json::array();
        std::string finish;
        for (const json& e : polychip::testing::SseEvents(st->body, &done)) {
          const json& ch = e["choices"][0];
          if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
          if (!ch["delta"].contains("tool_calls")) continue;
          for (const json& d : ch["delta"]["tool_calls"]) {
            const size_t i = d["index"];
            if (i == calls.size()) calls.push_back({{"name", ""}, {"arguments", ""}});
            ASSERT_LT(i, calls.size());
            if (d["function"].contains("name")) calls[i]["name"] = d["function"]["name"];
            calls[i]["arguments"] = calls[i]["arguments"].get<std::string>() +
                                    d["function"]["arguments"].get<std::string>();
          }
        }
        EXPECT_TRUE(done);
        EXPECT_EQ(finish, "tool_calls");
        ASSERT_EQ(calls.size(), message["tool_calls"].size()) << st->body;
        for (size_t i = 0; i < calls.size(); ++i) {
          EXPECT_EQ(calls[i]["name"], message["tool_calls"][i]["function"]["name"]);
          EXPECT_EQ(
              json::parse(calls[i]["arguments"].get<std::string>()),
              json::parse(message["tool_calls"][i]["function"]["arguments"].get<std::string>()));
        }
      }
  }
}

}  // namespace
}  // namespace polychip::server
