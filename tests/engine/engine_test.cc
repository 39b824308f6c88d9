// The scheduler over a fake runner whose outputs depend on the KV content it reads back.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <numeric>

#include "common/fake_runner.h"

namespace polychip::engine {
namespace {

using testing::FakeRunner;
constexpr int64_t kVocab = 97;

std::string Piece(int32_t t) { return std::string(1, static_cast<char>('a' + t % 26)); }

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 1 + (seed * 31 + i * 7) % (kVocab - 1);
  return p;
}

GenerateInput Input(std::vector<int32_t> prompt, int max_tokens, int priority = 0) {
  GenerateInput in;
  in.prompt = std::move(prompt);
  in.params.max_tokens = max_tokens;
  in.priority = priority;
  return in;
}

// Collects everything a stream produced so far; returns true once it finished.
struct Result {
  std::vector<int32_t> tokens;
  std::string text;
  StreamEvent last;
  bool finished = false;
};
void Drain(RequestStream& s, Result* r) {
  for (auto& ev : s.Pop(std::chrono::milliseconds(0))) {
    r->tokens.insert(r->tokens.end(), ev.tokens.begin(), ev.tokens.end());
    r->text += ev.text;
    if (ev.finished) {
      r->finished = true;
      r->last = ev;
    }
  }
}

TEST(Engine, SingleRequestMatchesTheModel) {
  FakeRunner runner(kVocab, 256, 4, 64);
  Engine engine(&runner, {}, Piece, {0});
  auto prompt = Prompt(10, 1);
  auto s = engine.Submit(Input(prompt, 12));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  engine.RunUntilIdle();
  Result r;
  Drain(**s, &r);
  ASSERT_TRUE(r.finished);
  EXPECT_TRUE(r.last.error.ok()) << r.last.error.ToString();
  EXPECT_EQ(r.tokens, FakeRunner::Reference(prompt, 12, kVocab));
  EXPECT_EQ(r.last.finish, FinishReason::kLength);
  EXPECT_EQ(r.last.prompt_tokens, 10);
  EXPECT_EQ(r.last.completion_tokens, 12);
  EXPECT_EQ(r.text.size(), 12u);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
}

TEST(Engine, ContinuousBatchingWithChunkedPrefill) {
  FakeRunner runner(kVocab, 512, 4, 256);
  EngineOptions opt;
  opt.chunked_prefill_size = 16;
  Engine engine(&runner, opt, Piece, {0});
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> lens = {5, 40, 3, 70, 17, 9, 33, 1};
  for (size_t i = 0; i < lens.size(); ++i) {
    prompts.push_back(Prompt(lens[i], static_cast<int>(i)));
    auto s = engine.Submit(Input(prompts.back(), 8 + static_cast<int>(i)));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
    // Requests join while others run.
    if (i % 2 == 1) engine.Step();
  }
  engine.RunUntilIdle();
  int64_t alone_steps = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 8 + static_cast<int>(i), kVocab))
        << "request " << i;
    alone_steps += (lens[i] + 15) / 16 + 8 + static_cast<int>(i) - 1;
  }
  EXPECT_LE(runner.max_step_tokens(), 16 + static_cast<int64_t>(lens.size()));
  EXPECT_GT(runner.mixed_steps(), 0);  // prefill chunks shared steps with decodes
  EXPECT_GT(runner.max_batch(), 1);
  EXPECT_LT(runner.steps(), alone_steps / 2);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
}

TEST(Engine, PreemptionWithTooFewBlocksKeepsOutputs) {
  // 12 blocks of 4 tokens; each request needs 8 blocks (12 prompt + 20 generated).
  FakeRunner runner(kVocab, 64, 4, 12);
  EngineOptions opt;
  opt.chunked_prefill_size = 8;
  Engine engine(&runner, opt, Piece, {0});
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Prompt(12, 100 + i));
    auto s = engine.Submit(Input(prompts.back(), 20));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  engine.RunUntilIdle(100000);
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished) << i;
    EXPECT_TRUE(r.last.error.ok()) << r.last.error.ToString();
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 20, kVocab)) << "request " << i;
  }
  const EngineStats st = engine.Stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.requests_finished, 6);
  EXPECT_EQ(st.kv_blocks_held, 0);
}

TEST(Engine, RunWithKvDroppedPreemptsEveryoneAndOutputsStayTheSame) {
  FakeRunner runner(kVocab, 256, 4, 64);
  EngineOptions opt;
  opt.chunked_prefill_size = 16;
  Engine engine(&runner, opt, Piece, {0});
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(Prompt(10, 300 + i));
    auto s = engine.Submit(Input(prompts.back(), 16));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  for (int i = 0; i < 6; ++i) engine.Step();  // all four prefilled and decoding
  bool ran = false;
  auto preempted = engine.RunWithKvDropped([&] {
    // No sequence holds a block while the "device" is replaced.
    ran = engine.Stats().kv_blocks_held == 0 && engine.Stats().kv_blocks_cached == 0;
    runner.WipeKv();
  });
  ASSERT_TRUE(preempted.ok()) << preempted.status().ToString();
  EXPECT_EQ(*preempted, 4);
  EXPECT_TRUE(ran);
  // A request submitted after the swap runs too, beside the resumed ones.
  prompts.push_back(Prompt(10, 399));
  auto late = engine.Submit(Input(prompts.back(), 16));
  ASSERT_TRUE(late.ok());
  streams.push_back(*late);
  engine.RunUntilIdle(100000);
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished) << i;
    EXPECT_TRUE(r.last.error.ok()) << r.last.error.ToString();
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 16, kVocab)) << "request " << i;
  }
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
}

TEST(Engine, RequestLargerThanTheCacheIsRejected) {
  FakeRunner runner(kVocab, 1024, 4, 8);  // 32 token slots
  Engine engine(&runner, {}, Piece, {0});
  EXPECT_EQ(engine.Submit(Input(Prompt(40, 1), 4)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Submit(Input({}, 4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Submit(Input({1, 2, 500}, 4)).status().code(), StatusCode::kInvalidArgument);
  // max_tokens beyond the room is clipped: the request ends with "length" at 32 tokens.
  auto s = engine.Submit(Input(Prompt(20, 1), 1000));
  ASSERT_TRUE(s.ok());
  engine.RunUntilIdle();
  Result r;
  Drain(**s, &r);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.tokens.size(), 12u);
  EXPECT_EQ(r.last.finish, FinishReason::kLength);
}

TEST(Engine, AbortFreesBlocksAtOnce) {
  FakeRunner runner(kVocab, 256, 4, 64);
  Engine engine(&runner, {}, Piece, {0});
  auto s = engine.Submit(Input(Prompt(30, 3), 100));
  ASSERT_TRUE(s.ok());
  for (int i = 0; i < 5; ++i) engine.Step();
  EXPECT_GT(engine.Stats().kv_blocks_held, 0);
  engine.Abort(*s);
  engine.Step();
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
  EXPECT_EQ(engine.Stats().requests_aborted, 1);
  Result r;
  Drain(**s, &r);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.last.error.code(), StatusCode::kCancelled);
  EXPECT_LT(r.tokens.size(), 100u);
}

// An adapter the engine only tells apart by its id and name.
struct NamedAdapter : Adapter {
  NamedAdapter(int64_t id, std::string name) : id_(id), name_(std::move(name)) {}
  int64_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  int64_t id_;
  std::string name_;
};

// vLLM's vllm:lora_requests_info lists the adapters of the running and of the waiting
// requests (each once) and how many one step may hold; the base model is none of them.
TEST(Engine, LoraRequestsInfoListsRunningAndWaitingAdapters) {
  FakeRunner runner(kVocab, 256, 4, 64);
  EngineOptions options;
  options.max_adapters_per_step = 1;
  Engine engine(&runner, options, Piece, {0});
  const auto x = std::make_shared<NamedAdapter>(1, "x");
  const auto y = std::make_shared<NamedAdapter>(2, "y");
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& adapter : std::vector<std::shared_ptr<const Adapter>>{x, x, nullptr, y}) {
    GenerateInput in = Input(Prompt(8, int(streams.size())), 50);
    in.adapter = adapter;
    auto s = engine.Submit(std::move(in));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  std::string out;
  engine.RenderVllmMetrics("m", &out);
  EXPECT_NE(out.find("vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"\","
                     "waiting_lora_adapters=\"\"} 1\n"),
            std::string::npos)
      << out;
  engine.Step();
  out.clear();
  engine.RenderVllmMetrics("m", &out);
  EXPECT_NE(out.find("vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"x\","
                     "waiting_lora_adapters=\"y\"} 1\n"),
            std::string::npos)
      << out;
  engine.RunUntilIdle();
  out.clear();
  engine.RenderVllmMetrics("m", &out);
  EXPECT_NE(out.find("running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1\n"),
            std::string::npos)
      << out;
}

// A step's sequences reach the runner grouped by adapter and scale (the base model's first),
// whatever order they arrived in, so that per-run launches (an adapter's MOE) are per adapter;
// each request still gets its own tokens.
TEST(Engine, StepRowsAreGroupedByAdapter) {
  FakeRunner runner(kVocab, 512, 4, 256);
  EngineOptions options;
  options.max_adapters_per_step = 4;
  Engine engine(&runner, options, Piece, {0});
  const auto x = std::make_shared<NamedAdapter>(1, "x");
  const auto y = std::make_shared<NamedAdapter>(2, "y");
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(Prompt(6 + i, i));
    GenerateInput in = Input(prompts.back(), 10);
    const std::shared_ptr<const Adapter> adapters[] = {x, y, nullptr};
    in.adapter = adapters[i % 3];
    in.adapter_scale = i % 6 == 1 ? 0.5f : 1.f;  // y at two scales: four runs in all
    auto s = engine.Submit(std::move(in));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  engine.RunUntilIdle();
  EXPECT_EQ(runner.max_batch(), 12);
  EXPECT_EQ(runner.max_adapter_runs(), 4);
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished) << i;
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 10, kVocab)) << i;
  }
}

TEST(Engine, PriorityPolicyRunsHigherPriorityFirst) {
  FakeRunner runner(kVocab, 256, 4, 64);
  EngineOptions opt;
  opt.policy = SchedulePolicy::kPriority;
  opt.max_running_requests = 1;
  Engine engine(&runner, opt, Piece, {0});
  auto low = engine.Submit(Input(Prompt(5, 1), 5, /*priority=*/0));
  auto high = engine.Submit(Input(Prompt(5, 2), 5, /*priority=*/10));
  ASSERT_TRUE(low.ok() && high.ok());
  Result rl, rh;
  for (int i = 0; i < 100 && !(rl.finished && rh.finished); ++i) {
    engine.Step();
    Drain(**low, &rl);
    Drain(**high, &rh);
    if (!rh.finished) EXPECT_TRUE(rl.tokens.empty()) << "low ran before high finished";
  }
  EXPECT_TRUE(rl.finished && rh.finished);
}

TEST(Engine, PrefixCacheReusesSharedPrompt) {
  for (bool enabled : {true, false}) {
    FakeRunner runner(kVocab, 256, 4, 64);
    EngineOptions opt;
    opt.enable_prefix_cache = enabled;
    Engine engine(&runner, opt, Piece, {0});
    auto system = Prompt(32, 9);
    auto p1 = system, p2 = system;
    p1.push_back(5);
    p2.push_back(6);
    auto s1 = engine.Submit(Input(p1, 3));
    engine.RunUntilIdle();
    const int64_t before = runner.tokens_processed();
    auto s2 = engine.Submit(Input(p2, 3));
    engine.RunUntilIdle();
    Result r2;
    Drain(**s2, &r2);
    ASSERT_TRUE(r2.finished);
    EXPECT_EQ(r2.tokens, FakeRunner::Reference(p2, 3, kVocab));
    const int64_t processed = runner.tokens_processed() - before;
    if (enabled) {
      EXPECT_EQ(r2.last.cached_tokens, 32);
      EXPECT_EQ(processed, 1 + 2);  // one prompt token, then two decodes
      EXPECT_GT(engine.Stats().prefix.hit_rate(), 0.4);
      EXPECT_TRUE(engine.FlushCache());
      EXPECT_EQ(engine.Stats().kv_blocks_cached, 0);
    } else {
      EXPECT_EQ(r2.last.cached_tokens, 0);
      EXPECT_EQ(processed, 33 + 2);
    }
  }
}

// A window pool too small for one request's whole length: the engine must release the window
// shares a sequence has moved past (FakeRunner fails any query whose window was lost).
TEST(Engine, WindowPoolReleasesBlocksOutsideTheWindow) {
  FakeRunner runner(kVocab, 512, 4, 128);
  runner.set_window_pool(/*blocks=*/12, /*window=*/8);
  EngineOptions opt;
  opt.chunked_prefill_size = 64;
  Engine engine(&runner, opt, Piece, {0});
  auto prompt = Prompt(100, 4);
  auto s = engine.Submit(Input(prompt, 60));  // 160 positions: 40 blocks, 3x the pool
  ASSERT_TRUE(s.ok());
  engine.RunUntilIdle(100000);
  Result r;
  Drain(**s, &r);
  ASSERT_TRUE(r.finished);
  ASSERT_TRUE(r.last.error.ok()) << r.last.error.ToString();
  EXPECT_EQ(r.tokens, FakeRunner::Reference(prompt, 60, kVocab));
  // Steps were cut to what the pool holds beside a window (12 blocks: 12 - (8/4 + 3) - 1 = 6
  // blocks of new tokens).
  EXPECT_LE(runner.max_step_tokens(), 6 * 4);
  EXPECT_EQ(engine.Stats().preemptions, 0);
  EXPECT_EQ(engine.Stats().window_blocks_total, 12);
  EXPECT_TRUE(engine.FlushCache());
  EXPECT_EQ(engine.Stats().window_blocks_free, 12);
}

// Many requests with shared prefixes through a small window pool: preemption, prefix matches
// cut to where the window shares remain, and blocks shared by several sequences.
TEST(Engine, WindowPoolWithPrefixCacheAndPreemptionKeepsOutputs) {
  FakeRunner runner(kVocab, 256, 4, 48);
  runner.set_window_pool(/*blocks=*/16, /*window=*/6);
  EngineOptions opt;
  opt.chunked_prefill_size = 12;
  Engine engine(&runner, opt, Piece, {0});
  auto system = Prompt(24, 7);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 10; ++i) {
    auto p = system;
    if (i % 3 == 0) p.resize(12);  // a shorter shared prefix
    for (int k = 0; k < 3 + i; ++k) p.push_back(1 + (i * 13 + k) % (kVocab - 1));
    prompts.push_back(p);
    auto st = engine.Submit(Input(p, 20 + 3 * i));
    ASSERT_TRUE(st.ok());
    streams.push_back(*st);
    if (i % 2 == 1) engine.Step();
  }
  engine.RunUntilIdle(100000);
  int64_t cached = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished) << i;
    ASSERT_TRUE(r.last.error.ok()) << i << ": " << r.last.error.ToString();
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 20 + 3 * static_cast<int>(i), kVocab))
        << "request " << i;
    cached += r.last.cached_tokens;
  }
  EXPECT_GT(cached, 0);  // the prefix cache still served some prompts
  // A follow-up turn: the whole first conversation (prompt and answer) is cached with the
  // window shares of its last blocks, so it is reused.
  Result first;
  auto again = prompts[1];
  {
    auto st = engine.Submit(Input(prompts[1], 8));
    ASSERT_TRUE(st.ok());
    engine.RunUntilIdle(100000);
    Drain(**st, &first);
    ASSERT_TRUE(first.finished);
    again.insert(again.end(), first.tokens.begin(), first.tokens.end());
    again.push_back(3);
  }
  auto st = engine.Submit(Input(again, 4));
  ASSERT_TRUE(st.ok());
  engine.RunUntilIdle(100000);
  Result r;
  Drain(**st, &r);
  ASSERT_TRUE(r.finished);
  ASSERT_TRUE(r.last.error.ok()) << r.last.error.ToString();
  EXPECT_EQ(r.tokens, FakeRunner::Reference(again, 4, kVocab));
  EXPECT_GE(r.last.cached_tokens, static_cast<int32_t>(again.size()) - 1 - 4);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
  EXPECT_TRUE(engine.FlushCache());
  EXPECT_EQ(engine.Stats().window_blocks_free, 16);
}

// Requests submitted together with a shared system prompt: the later ones wait for the first
// one's prefill and reuse its blocks instead of computing the prefix again.
TEST(Engine, SimultaneousSharedPrefixIsComputedOnce) {
  for (bool enabled : {true, false}) {
    FakeRunner runner(kVocab, 512, 4, 256);
    EngineOptions opt;
    opt.enable_prefix_cache = enabled;
    opt.chunked_prefill_size = 1024;
    Engine engine(&runner, opt, Piece, {0});
    const auto system = Prompt(64, 3);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 4; ++i) {
      prompts.push_back(system);
      for (int k = 0; k < 5; ++k) prompts.back().push_back(1 + (i * 5 + k) % (kVocab - 1));
      auto s = engine.Submit(Input(prompts.back(), 2));
      ASSERT_TRUE(s.ok());
      streams.push_back(*s);
    }
    engine.RunUntilIdle();
    int64_t cached = 0;
    for (int i = 0; i < 4; ++i) {
      Result r;
      Drain(*streams[i], &r);
      ASSERT_TRUE(r.finished);
      EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 2, kVocab));
      cached += r.last.cached_tokens;
    }
    // 4 requests of 69 prompt tokens and 2 outputs (1 decode each).
    if (enabled) {
      EXPECT_EQ(cached, 3 * 64);
      EXPECT_EQ(runner.tokens_processed(), 69 + 3 * 5 + 4);
    } else {
      EXPECT_EQ(cached, 0);
      EXPECT_EQ(runner.tokens_processed(), 4 * 69 + 4);
    }
  }
}

// Prompt chunks that end inside a KV block (3 tokens a step, blocks of 4, as --max-itl-ms
// sizes them): the next chunk continues the same block, only full blocks reach the prefix
// cache, and a shared prefix of 30 tokens is reused for its 7 full blocks.
TEST(Engine, PrefillChunksEndingInsideABlock) {
  FakeRunner runner(kVocab, 512, 4, 256);
  EngineOptions opt;
  opt.chunked_prefill_size = 3;
  Engine engine(&runner, opt, Piece, {0});
  const auto system = Prompt(30, 11);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(system);
    for (int k = 0; k < 5; ++k) prompts.back().push_back(1 + (i * 5 + k + 40) % (kVocab - 1));
    auto s = engine.Submit(Input(prompts.back(), 4));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
    if (i == 3) engine.RunUntilIdle();  // the fifth arrives after the others finished
  }
  engine.RunUntilIdle();
  int64_t cached = 0;
  for (int i = 0; i < 5; ++i) {
    Result r;
    Drain(*streams[i], &r);
    ASSERT_TRUE(r.finished) << i;
    EXPECT_TRUE(r.last.error.ok()) << r.last.error.ToString();
    EXPECT_EQ(r.tokens, FakeRunner::Reference(prompts[i], 4, kVocab)) << "request " << i;
    EXPECT_EQ(r.last.cached_tokens, i == 0 ? 0 : 28) << "request " << i;
    cached += r.last.cached_tokens;
  }
  // The first prompt whole (35), 7 tokens for each later one, 3 decodes per request.
  EXPECT_EQ(runner.tokens_processed(), 35 + 4 * 7 + 5 * 3);
  EXPECT_LE(runner.max_step_tokens(), 3 + 4);  // one chunk of 3 and the decodes
  EXPECT_GT(runner.mixed_steps(), 0);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
}

TEST(Engine, QueueLimitAndStopTokens) {
  FakeRunner runner(kVocab, 256, 4, 64);
  EngineOptions opt;
  opt.max_queued_requests = 2;
  Engine engine(&runner, opt, Piece, {0});
  auto prompt = Prompt(6, 4);
  auto ref = FakeRunner::Reference(prompt, 10, kVocab);
  GenerateInput in = Input(prompt, 10);
  in.params.stop_token_ids = {ref[3]};
  auto a = engine.Submit(in);
  auto b = engine.Submit(Input(prompt, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(engine.Submit(Input(prompt, 2)).status().code(), StatusCode::kUnavailable);
  engine.RunUntilIdle();
  Result r;
  Drain(**a, &r);
  ASSERT_TRUE(r.finished);
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_token, ref[3]);
  // The first occurrence of ref[3] ends the request.
  const auto first = std::find(ref.begin(), ref.end(), ref[3]) - ref.begin();
  EXPECT_EQ(static_cast<int64_t>(r.tokens.size()), first + 1);
  EXPECT_TRUE(engine.Submit(Input(prompt, 2)).ok());  // the queue drained
}

TEST(Engine, ThreadedStreaming) {
  FakeRunner runner(kVocab, 256, 4, 64);
  Engine engine(&runner, {}, Piece, {0});
  engine.Start();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 16; ++i) {
    auto s = engine.Submit(Input(Prompt(8, i), 6));
    ASSERT_TRUE(s.ok());
    streams.push_back(*s);
  }
  for (int i = 0; i < 16; ++i) {
    Result r;
    for (int k = 0; k < 500 && !r.finished; ++k) {
      for (auto& ev : streams[i]->Pop(std::chrono::milliseconds(20))) {
        r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
        if (ev.finished) r.finished = true;
      }
    }
    ASSERT_TRUE(r.finished);
    EXPECT_EQ(r.tokens, FakeRunner::Reference(Prompt(8, i), 6, kVocab));
  }
  engine.Stop();
}

}  // namespace
}  // namespace polychip::engine
