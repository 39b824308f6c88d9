// The embedding C API in process, against libpolychip.so of this build: concurrent
// generations share the engine's steps, callbacks cancel, tokenization round-trips, and
// errors carry the command line's messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/command.h"
#include "polychip/polychip.h"

namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

constexpr char kPrompt[] = "In the beginning";

// The message of `error` (freed), "" for success.
std::string Take(polychip_error_t* error) {
  std::string message = error ? polychip_error_message(error) : "";
  polychip_error_free(error);
  return message;
}

struct ModelDeleter {
  void operator()(polychip_model_t* m) const { polychip_model_free(m); }
};
using ModelPtr = std::unique_ptr<polychip_model_t, ModelDeleter>;

// What one generation streamed, with the time of its first and last token.
struct Stream {
  std::vector<int32_t> tokens;
  std::string text;
  Clock::time_point first, last;
  int32_t cancel_after = -1;  // >= 0: the callback cancels after this many tokens
};

int32_t Record(void* user_data, int32_t token, const char* piece, size_t piece_len) {
  auto* s = static_cast<Stream*>(user_data);
  if (token >= 0) {
    if (s->tokens.empty()) s->first = Clock::now();
    s->last = Clock::now();
    s->tokens.push_back(token);
  }
  s->text.append(piece, piece_len);
  return s->cancel_after >= 0 && static_cast<int32_t>(s->tokens.size()) >= s->cancel_after;
}

class CApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!POLYCHIP_HAS_CPU_PLUGIN) return;
    polychip_model_params_t params;
    polychip_model_params_init(&params);
    params.device = "cpu:0";
    const polychip_param_t settings[] = {{"threads", "2"}, {"max_running_requests", "16"}};
    params.params = settings;
    params.n_params = 2;
    polychip_model_t* m = nullptr;
    load_error_ = new std::string(Take(polychip_model_load(POLYCHIP_TINY_MODEL, &params, &m)));
    model_ = m;
  }
  static void TearDownTestSuite() {
    polychip_model_free(model_);
    model_ = nullptr;
    delete load_error_;
  }
  void SetUp() override {
    if (!POLYCHIP_HAS_CPU_PLUGIN) GTEST_SKIP() << "the cpu plugin is not part of this build";
    ASSERT_NE(model_, nullptr) << *load_error_;
  }

  // Generates greedily from kPrompt; the error message, "" on success.
  static std::string Generate(Stream* stream, int32_t max_tokens, polychip_result_t* result,
                              bool ignore_eos = true) {
    polychip_sampling_t sampling;
    polychip_sampling_init(&sampling);
    sampling.max_tokens = max_tokens;
    sampling.ignore_eos = ignore_eos;
    polychip_request_t request;
    polychip_request_init(&request);
    request.prompt = kPrompt;
    request.prompt_len = std::strlen(kPrompt);
    request.sampling = &sampling;
    request.on_token = Record;
    request.user_data = stream;
    result->struct_size = sizeof(*result);
    return Take(polychip_generate(model_, &request, result));
  }

  static polychip_model_t* model_;
  static std::string* load_error_;
};
polychip_model_t* CApiTest::model_ = nullptr;
std::string* CApiTest::load_error_ = nullptr;

TEST_F(CApiTest, VersionIsTheHeaders) {
  uint32_t major = 0, minor = 0;
  polychip_api_version(&major, &minor);
  EXPECT_EQ(major, POLYCHIP_API_MAJOR);
  EXPECT_EQ(minor, POLYCHIP_API_MINOR);
}

TEST_F(CApiTest, EightConcurrentGenerationsShareTheEngineSteps) {
  constexpr int kRequests = 8, kTokens = 24;
  Stream alone;
  polychip_result_t alone_result{};
  ASSERT_EQ(Generate(&alone, kTokens, &alone_result), "");
  ASSERT_EQ(alone.tokens.size(), size_t{kTokens});

  std::vector<Stream> streams(kRequests);
  std::vector<polychip_result_t> results(kRequests);
  std::vector<std::string> errors(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] { errors[i] = Generate(&streams[i], kTokens, &results[i]); });
  }
  for (auto& t : threads) t.join();
  Clock::time_point latest_first = Clock::time_point::min();
  Clock::time_point earliest_last = Clock::time_point::max();
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(errors[i], "");
    EXPECT_EQ(results[i].finish, POLYCHIP_FINISH_LENGTH);
    EXPECT_EQ(results[i].completion_tokens, kTokens);
    EXPECT_GT(results[i].prompt_tokens, 0);
    // Greedy: batching with the others changes nothing.
    EXPECT_EQ(streams[i].tokens, alone.tokens);
    latest_first = std::max(latest_first, streams[i].first);
    earliest_last = std::min(earliest_last, streams[i].last);
  }
  // Run one after another, some request would finish before the last one began; in the same
  // engine steps, every request has its first token before any has its last.
  EXPECT_LT(latest_first, earliest_last);
}

TEST_F(CApiTest, ACallbackReturningNonZeroCancels) {
  Stream stream;
  stream.cancel_after = 3;
  polychip_result_t result{};
  ASSERT_EQ(Generate(&stream, 64, &result), "");
  EXPECT_EQ(result.finish, POLYCHIP_FINISH_CANCELLED);
  EXPECT_EQ(stream.tokens.size(), 3u);  // no callback after the one that cancelled
  // The engine is still serving.
  Stream next;
  ASSERT_EQ(Generate(&next, 4, &result), "");
  EXPECT_EQ(next.tokens.size(), 4u);
}

TEST_F(CApiTest, TokenizeRoundTripsAndReportsTheSizeNeeded) {
  const std::string text = "Hello world, hello polychip";
  size_t n = 0;
  int32_t one = 0;
  polychip_error_t* small =
      polychip_tokenize(model_, text.data(), text.size(), 0, 0, &one, 1, &n);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(polychip_error_code(small), POLYCHIP_CODE_RESOURCE_EXHAUSTED);
  polychip_error_free(small);
  ASSERT_GT(n, 1u);
  std::vector<int32_t> ids(n);
  ASSERT_EQ(Take(polychip_tokenize(model_, text.data(), text.size(), 0, 0, ids.data(), n, &n)),
            "");
  for (int32_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, polychip_model_vocab_size(model_));
  }
  std::string back(4 * text.size(), '\0');
  size_t len = 0;
  ASSERT_EQ(Take(polychip_detokenize(model_, ids.data(), ids.size(), 0, back.data(), back.size(),
                                     &len)),
            "");
  back.resize(len);
  EXPECT_EQ(back, text);
  const int32_t bad = polychip_model_vocab_size(model_);
  EXPECT_THAT(Take(polychip_detokenize(model_, &bad, 1, 0, back.data(), back.size(), &len)),
              HasSubstr("outside the vocabulary"));
}

TEST_F(CApiTest, ARegisteredPluginIsListedWithItsOrigin) {
  char* text = nullptr;
  ASSERT_EQ(Take(polychip_list_plugins(POLYCHIP_LIST_JSON, &text)), "");
  const std::string listing = text;
  polychip_string_free(text);
  // cpu was loaded by the model's device, not registered.
  EXPECT_THAT(listing, HasSubstr("\"name\": \"cpu\""));
  EXPECT_THAT(listing, HasSubstr("\"origin\": \"discovered\""));
  EXPECT_THAT(listing, ::testing::Not(HasSubstr("registered by the program")));
  // Registering the file it came from returns the plugin already loaded, which from then on
  // counts as the program's.
  const std::string path = POLYCHIP_BUILD_DIR "/lib/polychip/libpolychip_backend_cpu.so";
  ASSERT_EQ(Take(polychip_register_backend_path(path.c_str(), nullptr, 0)), "");
  ASSERT_EQ(Take(polychip_list_plugins(0, &text)), "");
  const std::string rendered = text;
  polychip_string_free(text);
  EXPECT_THAT(rendered, HasSubstr("backend cpu "));
  EXPECT_THAT(rendered, HasSubstr("origin: registered by the program"));
}

// A LoRA adapter loaded with the model (the `lora` setting) and chosen per request: its text is
// `polychip run --lora`'s, the base model's when the request names none, and both kinds share
// the engine's steps unchanged; an unknown adapter is NOT_FOUND naming the loaded ones.
TEST_F(CApiTest, LoraAdaptersLoadWithTheModelAndAreChosenPerRequest) {
  const std::string binary = POLYCHIP_BUILD_DIR "/bin/polychip";
  const std::string adapter = ::testing::TempDir() + "c-api-lora-" + std::to_string(getpid()) +
                              ".gguf";
  ASSERT_EQ(polychip::testing::RunCommand(binary + " gguf synth --lora-for " POLYCHIP_TINY_MODEL
                                          " --lora-rank 8 --type F16 --weight-std 0.5 -q"
                                          " --seed 11 --out " + adapter)
                .exit_code,
            0);
  polychip_model_params_t params;
  polychip_model_params_init(&params);
  params.device = "cpu:0";
  const std::string lora = "sql=" + adapter;
  const polychip_param_t settings[] = {
      {"threads", "2"}, {"lora", lora.c_str()}, {"max_loras_per_batch", "1"}};
  params.params = settings;
  params.n_params = 3;
  polychip_model_t* raw = nullptr;
  ASSERT_EQ(Take(polychip_model_load(POLYCHIP_TINY_MODEL, &params, &raw)), "");
  ModelPtr model(raw);

  polychip_sampling_t sampling;
  polychip_sampling_init(&sampling);
  sampling.max_tokens = 16;
  sampling.ignore_eos = 1;
  auto generate = [&](const char* name, Stream* out) {
    polychip_request_t request;
    polychip_request_init(&request);
    request.prompt = kPrompt;
    request.prompt_len = std::strlen(kPrompt);
    request.sampling = &sampling;
    request.on_token = Record;
    request.user_data = out;
    request.lora = name;
    polychip_result_t result{};
    result.struct_size = sizeof(result);
    return Take(polychip_generate(model.get(), &request, &result));
  };
  Stream base, sql, by_path;
  ASSERT_EQ(generate(nullptr, &base), "");
  ASSERT_EQ(generate("sql", &sql), "");
  ASSERT_EQ(generate(adapter.c_str(), &by_path), "");
  EXPECT_NE(sql.tokens, base.tokens);
  EXPECT_EQ(by_path.tokens, sql.tokens);
  const polychip::testing::CommandResult run = polychip::testing::RunCommand(
      binary + " run -m " POLYCHIP_TINY_MODEL " --device cpu:0 -t 2 -n 16 --ignore-eos --lora " +
      lora + " -p '" + kPrompt + "'");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, sql.text + "\n");

  // Base and adapter requests at once (one resident adapter: the base needs none).
  std::vector<Stream> streams(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { errors[i] = generate(i % 2 ? "sql" : nullptr, &streams[i]); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(errors[i], "");
    EXPECT_EQ(streams[i].tokens, i % 2 ? sql.tokens : base.tokens) << i;
  }

  polychip_request_t request;
  polychip_request_init(&request);
  request.prompt = kPrompt;
  request.prompt_len = std::strlen(kPrompt);
  request.lora = "nosuch";
  polychip_error_t* error = polychip_generate(model.get(), &request, nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(polychip_error_code(error), POLYCHIP_CODE_NOT_FOUND);
  EXPECT_THAT(Take(error), HasSubstr("no LoRA adapter 'nosuch' (loaded with the model: sql)"));
  std::remove(adapter.c_str());
}

// A quantized KV cache set through the model's settings (kv_cache_dtype, and K and V apart)
// generates what `polychip run --kv-cache-dtype` does on the same model and prompt. The model has
// random weights large enough that each cache type's rounding changes the greedy tokens (checked
// against f16's), so a setting that did not take effect would show. A type the cache does not
// offer is INVALID_ARGUMENT naming the ones it does.
TEST_F(CApiTest, AQuantizedKvCacheGeneratesWhatTheCommandLineDoes) {
  const std::string binary = POLYCHIP_BUILD_DIR "/bin/polychip";
  const std::string path =
      ::testing::TempDir() + "c-api-kv-" + std::to_string(getpid()) + ".gguf";
  ASSERT_EQ(polychip::testing::RunCommand(binary + " gguf synth --vocab " POLYCHIP_TINY_MODEL
                                          " --shape tiny --type F16 --weight-std 1.0 --seed 1"
                                          " -q --out " + path)
                .exit_code,
            0);
  auto cli = [&](const std::string& flags) {
    const polychip::testing::CommandResult run = polychip::testing::RunCommand(
        binary + " run -m " + path + " --device cpu:0 -t 2 -n 24 --ignore-eos " + flags +
        " -p '" + kPrompt + "'");
    EXPECT_EQ(run.exit_code, 0) << run.err;
    return run.out;
  };
  const std::string f16 = cli("");
  struct Case {
    std::vector<polychip_param_t> settings;
    std::string flags;
  };
  const Case cases[] = {
      {{{"threads", "2"}, {"kv_cache_dtype", "q8_0"}}, "--kv-cache-dtype q8_0"},
      {{{"threads", "2"}, {"kv_cache_dtype_k", "q8_0"}, {"kv_cache_dtype_v", "q4_0"}},
       "--kv-cache-dtype-k q8_0 --kv-cache-dtype-v q4_0"},
  };
  for (const Case& c : cases) {
    polychip_model_params_t params;
    polychip_model_params_init(&params);
    params.device = "cpu:0";
    params.params = c.settings.data();
    params.n_params = c.settings.size();
    polychip_model_t* raw = nullptr;
    ASSERT_EQ(Take(polychip_model_load(path.c_str(), &params, &raw)), "") << c.flags;
    ModelPtr model(raw);
    polychip_sampling_t sampling;
    polychip_sampling_init(&sampling);
    sampling.max_tokens = 24;
    sampling.ignore_eos = 1;
    polychip_request_t request;
    polychip_request_init(&request);
    request.prompt = kPrompt;
    request.prompt_len = std::strlen(kPrompt);
    request.sampling = &sampling;
    request.on_token = Record;
    Stream stream;
    request.user_data = &stream;
    polychip_result_t result{};
    result.struct_size = sizeof(result);
    ASSERT_EQ(Take(polychip_generate(model.get(), &request, &result)), "") << c.flags;
    EXPECT_EQ(stream.tokens.size(), 24u) << c.flags;
    const std::string expected = cli(c.flags);
    EXPECT_NE(expected, f16) << c.flags << ": the model does not tell this cache type from f16";
    EXPECT_EQ(stream.text + "\n", expected) << c.flags;
  }

  polychip_model_params_t params;
  polychip_model_params_init(&params);
  params.device = "cpu:0";
  const polychip_param_t bad[] = {{"kv_cache_dtype", "q3_0"}};
  params.params = bad;
  params.n_params = 1;
  polychip_model_t* m = nullptr;
  polychip_error_t* error = polychip_model_load(path.c_str(), &params, &m);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(m, nullptr);
  EXPECT_EQ(polychip_error_code(error), POLYCHIP_CODE_INVALID_ARGUMENT);
  EXPECT_THAT(Take(error), HasSubstr("q8_0"));
  std::remove(path.c_str());
}

TEST_F(CApiTest, ErrorsCarryTheCommandLinesMessages) {
  polychip_model_params_t params;
  polychip_model_params_init(&params);
  params.device = "nosuch:0";
  polychip_model_t* m = nullptr;
  polychip_error_t* error = polychip_model_load(POLYCHIP_TINY_MODEL, &params, &m);
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(polychip_error_code(error), POLYCHIP_CODE_NOT_FOUND);
  const std::string message = Take(error);
  EXPECT_EQ(m, nullptr);
  const polychip::testing::CommandResult cli = polychip::testing::RunCommand(
      "env -u POLYCHIP_DEVICE_BACKEND " POLYCHIP_BUILD_DIR "/bin/polychip run -m " +
          std::string(POLYCHIP_TINY_MODEL) + " -p hi -n 1 --device nosuch:0",
      polychip::testing::Stderr::kMerged);
  EXPECT_NE(cli.exit_code, 0);
  // The same sentences (the search paths differ: the library adds its own plugin folder).
  for (const char* part :
       {"backend 'nosuch' not found; paths tried:", "/libpolychip_backend_nosuch.so: no such file",
        "available backend plugins: ", "(selected by --device nosuch:0)"}) {
    EXPECT_THAT(message, HasSubstr(part));
    EXPECT_THAT(cli.out, HasSubstr(part));
  }
  EXPECT_THAT(message, HasSubstr(POLYCHIP_BUILD_DIR "/lib/polychip/libpolychip_backend_nosuch.so"));

  polychip_model_params_init(&params);
  const polychip_param_t unknown[] = {{"no_such_setting", "1"}};
  params.params = unknown;
  params.n_params = 1;
  EXPECT_THAT(Take(polychip_model_load(POLYCHIP_TINY_MODEL, &params, &m)),
              HasSubstr("unknown model parameter 'no_such_setting'"));
  EXPECT_THAT(Take(polychip_model_load("/nonexistent/m.gguf", nullptr, &m)),
              HasSubstr("/nonexistent/m.gguf"));
}

}  // namespace
