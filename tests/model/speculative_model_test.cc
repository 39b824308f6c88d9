// Speculative decoding on real forward passes: for each architecture a tiny F16 model is
// synthesized (llama's 32,000-token SentencePiece vocabulary: a small output layer), and a draft
// made of its first layer (the same seed writes the same weights for the tensors both have).
// Through the engine on the cpu plugin, greedy output with speculation (the draft being the model
// itself, the truncated draft, n-gram lookup) is the output without it, for several requests
// batched together; and a draft sharing the model's vocabulary is accepted while another vocabulary
// is refused. Also here, on the same models: an adapter of qwen3moe's experts batched with base
// requests, on the device (MOE's low-rank terms) and on the host; adapters of a batch each as
// one LORA launch per matrix, against the launches it stands for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "launch/launch.h"
#include "model/arch.h"
#include "model/lora.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "test_models.h"

namespace polychip::model {
namespace {

bool CpuBuilt() {
#ifdef POLYCHIP_HAVE_CPU_PLUGIN
  return true;
#else
  return false;
#endif
}

// `shape` made `arch`'s, with `layers` layers; the model file's path.
std::string Synth(const std::string& arch, const std::string& shape, int layers) {
  SynthOptions o;
  o.config = *ShapePreset(shape);
  const StatusOr<Arch> a = ArchFromName(arch);
  if (!a.ok()) return "error: " + a.status().ToString();
  if (o.config.arch != *a) {
    if (Status s = AdoptArch(*a, o.config); !s.ok()) return "error: " + s.ToString();
  }
  o.config.n_layer = layers;
  o.type = DType::kF16;
  o.weight_std = 0.08f;
  o.seed = 7;
  o.progress = false;
  const std::string qwen2 = testing::VocabPath();
  o.vocab_path = qwen2.substr(0, qwen2.rfind('/')) + "/ggml-vocab-llama-spm.gguf";
  const std::string out = std::string(POLYCHIP_BUILD_DIR) + "/test-models/spec_" + arch + "_" +
                          shape + "_l" + std::to_string(layers) + ".gguf";
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  const Status s = SynthesizeModel(o, out);
  return s.ok() ? out : "error: " + s.ToString();
}

struct Loaded {
  ModelFile file;
  std::shared_ptr<runtime::Device> device;
  std::unique_ptr<TransformerRunner> runner;
};

std::unique_ptr<Loaded> Load(const std::string& path) {
  auto f = OpenModelFile(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.status().ToString();
  if (!f.ok()) return nullptr;
  auto dev = testing::OpenTestDevice("cpu");
  if (!dev) return nullptr;
  RunnerOptions o;
  o.context_length = 256;
  o.kv_tokens = 1024;
  o.block_size = 16;
  o.max_tokens_per_step = 128;
  auto r = TransformerRunner::Create(*f->file, f->config, dev, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return nullptr;
  auto l = std::make_unique<Loaded>();
  l->file = std::move(*f);
  l->device = dev;
  l->runner = std::move(*r);
  return l;
}

// A LoRA adapter every request of Generate runs, and whether the draft applies it too.
struct WithAdapter {
  std::shared_ptr<const LoraAdapter> adapter;
  bool draft_takes_adapters = false;
};

std::vector<std::vector<int32_t>> Generate(engine::ModelRunner* target,
                                           engine::SpecAlgorithm algorithm,
                                           engine::ModelRunner* draft,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           int n, engine::EngineStats* stats = nullptr,
                                           const WithAdapter& lora = {}) {
  engine::EngineOptions eo;
  eo.chunked_prefill_size = 32;
  eo.speculative.algorithm = algorithm;
  eo.speculative.draft_takes_adapters = lora.draft_takes_adapters;
  eo.speculative.num_draft_tokens = 4;
  eo.speculative.disable_batch_size = 8;
  engine::Engine engine(target, eo, [](int32_t) { return std::string("x"); }, {}, draft);
  std::vector<engine::GenerateInput> inputs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    inputs[i].prompt = prompts[i];
    inputs[i].params.max_tokens = n;
    inputs[i].adapter = lora.adapter;
  }
  std::vector<std::vector<int32_t>> out = testing::GenerateAll(engine, inputs);
  EXPECT_EQ(engine.Stats().kv_blocks_held, 0);
  if (stats) *stats = engine.Stats();
  return out;
}

struct ArchCase {
  std::string arch, shape;
};
void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.arch; }

class SpeculativeModelTest : public ::testing::TestWithParam<ArchCase> {
 protected:
  void SetUp() override {
    if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
  }
};

TEST_P(SpeculativeModelTest, GreedyOutputIsTheSameWithAndWithoutSpeculation) {
  const ArchCase& c = GetParam();
  const std::string target_path = Synth(c.arch, c.shape, 2);
  const std::string draft_path = Synth(c.arch, c.shape, 1);
  ASSERT_EQ(target_path.rfind("error", 0), std::string::npos) << target_path;
  ASSERT_EQ(draft_path.rfind("error", 0), std::string::npos) << draft_path;
  auto target = Load(target_path);
  auto self = Load(target_path);  // the model drafting for itself: its own KV pool
  auto truncated = Load(draft_path);
  ASSERT_TRUE(target && self && truncated);
  // Three requests batched; the last one is the first, its output and itself again, so that
  // n-gram lookup finds drafts.
  std::vector<std::vector<int32_t>> prompts = {
      {9, 1200, 33, 870, 4501, 77, 12, 3000, 640, 5},
      {18, 902, 2222, 71, 19, 400, 8, 615, 90, 1717, 44, 6000, 13},
  };
  constexpr int kTokens = 16;
  const auto first = Generate(target->runner.get(), engine::SpecAlgorithm::kNone, nullptr,
                              {prompts[0]}, kTokens);
  ASSERT_EQ(first.size(), 1u);
  std::vector<int32_t> echo = prompts[0];
  echo.insert(echo.end(), first[0].begin(), first[0].end());
  echo.insert(echo.end(), prompts[0].begin(), prompts[0].end());
  prompts.push_back(echo);
  const auto want = Generate(target->runner.get(), engine::SpecAlgorithm::kNone, nullptr,
                             prompts, kTokens);
  ASSERT_EQ(want.size(), 3u);
  for (const auto& t : want) ASSERT_EQ(t.size(), size_t(kTokens));

  engine::EngineStats st;
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kDraft, self->runner.get(),
                     prompts, kTokens, &st),
            want)
      << "draft = the model";
  EXPECT_GT(st.spec_verify_steps, 0);
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);  // the model agrees with itself
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kDraft,
                     truncated->runner.get(), prompts, kTokens, &st),
            want)
      << "draft = the first layer";
  EXPECT_GT(st.spec_verify_steps, 0);
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kNgram, nullptr, prompts,
                     kTokens, &st),
            want)
      << "n-gram";
  // Lookup drafts once a generated token (not the last) occurred before in its sequence; a
  // model that never repeats itself (phi3-tiny here) gets none.
  bool repeats = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> seq = prompts[i];
    for (size_t j = 0; j + 1 < want[i].size(); ++j) {
      repeats |= std::find(seq.begin(), seq.end(), want[i][j]) != seq.end();
      seq.push_back(want[i][j]);
    }
  }
  if (repeats) EXPECT_GT(st.spec_verify_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Archs, SpeculativeModelTest,
                         ::testing::Values(ArchCase{"llama", "tiny"}, ArchCase{"qwen2", "tiny"},
                                           ArchCase{"qwen3", "qwen3-tiny"},
                                           ArchCase{"qwen3moe", "qwen3moe-tiny"},
                                           ArchCase{"phi3", "phi3-tiny"},
                                           ArchCase{"gemma3", "gemma3-tiny"},
                                           ArchCase{"mistral3", "mistral3-tiny"}),
                         [](const auto& info) { return info.param.arch; });

// A request's LoRA adapter: the model verifies with it, so the output is the adapter's with
// any draft. A draft with the model's matrices (launch's draft_takes_adapters: here the model
// itself) proposes with the adapter too and agrees with every token; proposing from its own
// weights it disagrees where the adapter moves the model. A draft of other shapes (the first
// layer) never takes adapters.
TEST(SpeculativeLora, TheDraftProposesWithTheRequestsAdapter) {
  if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
  const std::string target_path = Synth("llama", "tiny", 2);
  const std::string draft_path = Synth("llama", "tiny", 1);
  ASSERT_EQ(target_path.rfind("error", 0), std::string::npos) << target_path;
  ASSERT_EQ(draft_path.rfind("error", 0), std::string::npos) << draft_path;
  auto target = Load(target_path);
  auto self = Load(target_path);
  auto truncated = Load(draft_path);
  ASSERT_TRUE(target && self && truncated);
  const std::string adapter_path = target_path + ".lora.gguf";
  LoraSynthOptions lo;
  lo.rank = 8;
  lo.std = 0.3f;  // enough to move the greedy tokens
  ASSERT_TRUE(SynthesizeLora(*target->file.file, lo, adapter_path).ok());
  LoraRegistry registry(target->file.config);
  auto adapter = registry.Load({"a", adapter_path, 1});
  ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();

  const std::vector<std::vector<int32_t>> prompts = {
      {9, 1200, 33, 870, 4501, 77, 12, 3000, 640, 5},
      {18, 902, 2222, 71, 19, 400, 8, 615, 90, 1717, 44, 6000, 13},
  };
  constexpr int kTokens = 16;
  const auto base = Generate(target->runner.get(), engine::SpecAlgorithm::kNone, nullptr,
                             prompts, kTokens);
  const auto want = Generate(target->runner.get(), engine::SpecAlgorithm::kNone, nullptr,
                             prompts, kTokens, nullptr, {*adapter});
  ASSERT_EQ(want.size(), prompts.size());
  EXPECT_NE(want, base) << "the adapter does not change the greedy tokens";

  engine::EngineStats st;
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kDraft, self->runner.get(),
                     prompts, kTokens, &st, {*adapter, true}),
            want);
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_EQ(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kDraft, self->runner.get(),
                     prompts, kTokens, &st, {*adapter, false}),
            want);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(Generate(target->runner.get(), engine::SpecAlgorithm::kDraft,
                     truncated->runner.get(), prompts, kTokens, &st, {*adapter, false}),
            want);

  // Launch decides by the draft's matrices.
  launch::LaunchSpec spec;
  spec.max_total_tokens = 1024;
  spec.speculative_draft_model = target_path;
  auto r = launch::Resolve(spec, target->file, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->engine.speculative.draft_takes_adapters);
  spec.speculative_draft_model = draft_path;
  r = launch::Resolve(spec, target->file, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->engine.speculative.draft_takes_adapters);
}

// An adapter of a mixture of experts' experts runs its rows' routed feed-forward as MOE launches
// of their own with the adapter's low-rank terms (transformer.cc) beside the step's other rows:
// requests of the adapter batched with base requests give each one's tokens alone, and the
// adapter changes them.
TEST(ExpertLora, AdapterRowsBatchedWithBaseRowsGiveTheirTokensAlone) {
  if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
  const std::string path = Synth("qwen3moe", "qwen3moe-tiny", 2);
  ASSERT_EQ(path.rfind("error", 0), std::string::npos) << path;
  auto model = Load(path);
  ASSERT_TRUE(model);
  const std::string adapter_path = path + ".experts-lora.gguf";
  LoraSynthOptions lo;
  lo.rank = 8;
  lo.std = 0.3f;
  lo.targets = {"experts"};
  ASSERT_TRUE(SynthesizeLora(*model->file.file, lo, adapter_path).ok());
  LoraRegistry registry(model->file.config);
  auto adapter = registry.Load({"e", adapter_path, 1});
  ASSERT_TRUE(adapter.ok()) << adapter.status().ToString();

  const std::vector<std::vector<int32_t>> prompts = {
      {9, 1200, 33, 870, 4501, 77, 12, 3000, 640, 5},
      {18, 902, 2222, 71, 19, 400, 8, 615, 90, 1717, 44, 6000, 13},
      {5, 6, 7, 8, 9, 10, 11},
  };
  constexpr int kTokens = 12;
  // Prompt i alone, with and without the adapter.
  std::vector<std::vector<int32_t>> base, with;
  for (const auto& p : prompts) {
    base.push_back(Generate(model->runner.get(), engine::SpecAlgorithm::kNone, nullptr, {p},
                            kTokens)[0]);
    with.push_back(Generate(model->runner.get(), engine::SpecAlgorithm::kNone, nullptr, {p},
                            kTokens, nullptr, {*adapter})[0]);
  }
  EXPECT_NE(with, base) << "the adapter does not change the greedy tokens";
  // Every prompt twice in one batch: once with the adapter, once without, interleaved.
  engine::EngineOptions eo;
  eo.chunked_prefill_size = 32;
  engine::Engine engine(model->runner.get(), eo, [](int32_t) { return std::string("x"); }, {});
  std::vector<engine::GenerateInput> inputs(2 * prompts.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].prompt = prompts[i / 2];
    inputs[i].params.max_tokens = kTokens;
    if (i % 2 == 1) inputs[i].adapter = *adapter;
  }
  const std::vector<std::vector<int32_t>> out = testing::GenerateAll(engine, inputs);
  ASSERT_EQ(out.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(out[i], i % 2 == 1 ? with[i / 2] : base[i / 2]) << "request " << i;
  }
}

// Launches of `op` the device has run so far (its plugin's op counters).
uint64_t Launches(const runtime::Device& device, runtime::Op op) {
  auto counters = device.backend()->ReadOpCounters(device);
  if (!counters) return 0;
  for (const runtime::OpCounters& c : *counters)
    if (c.op == static_cast<int32_t>(op)) return c.launches;
  return 0;
}
uint64_t MoeLaunches(const runtime::Device& device) { return Launches(device, runtime::Op::kMoe); }

// An adapter of the experts runs as MOE's low-rank terms (ABI 1.7) on the cpu plugin: a batch of
// base rows and two such adapters (F16 rank 8 at scale 1, Q8_0 rank 32 at scale 0.5, so that
// both of MOE's roundings of a term's input are used) gives the tokens the host path
// (POLYCHIP_LORA_HOST_EXPERTS=1) gives, and the device path did run (more MOE launches: one per
// run of rows of an adapter). Each adapter is loaded twice, under two names, so that each path
// uploads its own copy (the variable is read at upload).
TEST(ExpertLora, DevicePathGivesTheHostPathsTokens) {
  if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
  const std::string path = Synth("qwen3moe", "qwen3moe-tiny", 2);
  ASSERT_EQ(path.rfind("error", 0), std::string::npos) << path;
  auto model = Load(path);
  ASSERT_TRUE(model);
  struct AdapterCase {
    std::string file;
    int64_t rank;
    DType type;
    float scale;
  };
  const AdapterCase cases[] = {{path + ".experts-f16-r8.gguf", 8, DType::kF16, 1.0f},
                               {path + ".experts-q8_0-r32.gguf", 32, DType::kQ8_0, 0.5f}};
  LoraRegistry registry(model->file.config);
  std::shared_ptr<const LoraAdapter> on_host[2], on_device[2];
  for (int i = 0; i < 2; ++i) {
    LoraSynthOptions lo;
    lo.rank = cases[i].rank;
    lo.type = cases[i].type;
    lo.std = 0.3f;
    lo.seed = 11 + uint64_t(i);
    lo.targets = {"experts"};
    ASSERT_TRUE(SynthesizeLora(*model->file.file, lo, cases[i].file).ok());
    auto h = registry.Load({"host" + std::to_string(i), cases[i].file, cases[i].scale});
    auto d = registry.Load({"device" + std::to_string(i), cases[i].file, cases[i].scale});
    ASSERT_TRUE(h.ok() && d.ok());
    on_host[i] = *h;
    on_device[i] = *d;
  }
  const std::vector<std::vector<int32_t>> prompts = {
      {9, 1200, 33, 870, 4501, 77, 12, 3000, 640, 5},
      {18, 902, 2222, 71, 19, 400, 8, 615, 90, 1717, 44, 6000, 13},
      {5, 6, 7, 8, 9, 10, 11},
  };
  constexpr int kTokens = 12;
  // Every prompt three times in one batch: base, first adapter, second adapter.
  auto run = [&](const std::shared_ptr<const LoraAdapter> (&adapters)[2]) {
    engine::EngineOptions eo;
    eo.chunked_prefill_size = 32;
    engine::Engine engine(model->runner.get(), eo, [](int32_t) { return std::string("x"); }, {});
    std::vector<engine::GenerateInput> inputs(3 * prompts.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i].prompt = prompts[i / 3];
      inputs[i].params.max_tokens = kTokens;
      if (i % 3 > 0) {
        inputs[i].adapter = adapters[i % 3 - 1];
        inputs[i].adapter_scale = cases[i % 3 - 1].scale;
      }
    }
    return testing::GenerateAll(engine, inputs);
  };
  setenv("POLYCHIP_LORA_HOST_EXPERTS", "1", 1);
  const uint64_t before_host = MoeLaunches(*model->device);
  const std::vector<std::vector<int32_t>> host = run(on_host);
  const uint64_t host_launches = MoeLaunches(*model->device) - before_host;
  unsetenv("POLYCHIP_LORA_HOST_EXPERTS");
  const std::vector<std::vector<int32_t>> device = run(on_device);
  const uint64_t device_launches = MoeLaunches(*model->device) - before_host - host_launches;
  ASSERT_EQ(host.size(), device.size());
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(device[i], host[i]) << "request " << i << " (adapter " << i % 3 << ")";
    if (i % 3 > 0) EXPECT_NE(host[i], host[i - i % 3]) << "the adapter changes nothing";
  }
  EXPECT_GT(device_launches, host_launches) << "the adapters' rows did not run as MOE launches";
}

// A batch mixing adapters (sequence s runs adapter s % 4, 0 the base model: every adapter's
// rows apart from each other) runs each adapter as one LORA launch per adapted matrix (ABI 1.8)
// on the cpu plugin, and gives the logits and greedy tokens of the MATMUL, SCALE, MATMUL per run
// of rows (POLYCHIP_LORA_COMPOSED=1): a prefill of every sequence, where each adapter's rows
// are runs of several rows, and a decode step, where they are single rows. The adapters: F16
// rank 8 at scale 1, F16 rank 16 at 0.5, Q8_0 rank 32 at 0.75 (a Q8_0 A and B: the product's
// rounding of its input to int8), adapting attention, feed-forward and output.
TEST(LoraOp, MixedBatchGivesTheComposedLogitsAndTokens) {
  if (!CpuBuilt()) GTEST_SKIP() << "no cpu plugin in this tree";
  const std::string path = Synth("llama", "tiny", 2);
  ASSERT_EQ(path.rfind("error", 0), std::string::npos) << path;
  auto model = Load(path);
  ASSERT_TRUE(model);
  struct AdapterCase {
    int64_t rank;
    DType type;
    float scale;
  };
  const AdapterCase cases[] = {
      {8, DType::kF16, 1.0f}, {16, DType::kF16, 0.5f}, {32, DType::kQ8_0, 0.75f}};
  LoraRegistry registry(model->file.config);
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  for (int i = 0; i < 3; ++i) {
    const std::string file = path + ".mixed-" + std::to_string(i) + ".gguf";
    LoraSynthOptions lo;
    lo.rank = cases[i].rank;
    lo.type = cases[i].type;
    lo.std = 0.3f;
    lo.seed = 21 + uint64_t(i);
    ASSERT_TRUE(SynthesizeLora(*model->file.file, lo, file).ok());
    auto a = registry.Load({"m" + std::to_string(i), file, cases[i].scale});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    adapters.push_back(*a);
  }
  constexpr int kSeqs = 8, kPrompt = 5;
  std::vector<std::vector<int32_t>> prompts(kSeqs), blocks(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    for (int i = 0; i < kPrompt; ++i) prompts[s].push_back(100 + 37 * s + 11 * i);
    blocks[s] = {s};
  }
  const int32_t next = 4242;
  // The logits of a prefill of every sequence (all rows), then of a decode step (the last).
  auto forward = [&](bool with_adapters) {
    std::vector<float> out;
    for (bool decode : {false, true}) {
      std::vector<engine::SequenceStep> batch(kSeqs);
      for (int s = 0; s < kSeqs; ++s) {
        engine::SequenceStep& st = batch[size_t(s)];
        st.seq_id = s;
        st.tokens = decode ? std::span<const int32_t>(&next, 1) : prompts[size_t(s)];
        st.start_pos = decode ? kPrompt : 0;
        st.block_table = blocks[size_t(s)];
        st.logits = decode ? engine::LogitsMode::kLast : engine::LogitsMode::kAll;
        if (with_adapters && s % 4 > 0) {
          st.adapter = adapters[size_t(s % 4 - 1)].get();
          st.adapter_scale = cases[s % 4 - 1].scale;
        }
      }
      std::vector<float> logits;
      EXPECT_TRUE(model->runner->Forward(batch, &logits).ok());
      out.insert(out.end(), logits.begin(), logits.end());
    }
    return out;
  };
  auto tokens = [&] {
    engine::EngineOptions eo;
    eo.chunked_prefill_size = 64;
    engine::Engine engine(model->runner.get(), eo, [](int32_t) { return std::string("x"); }, {});
    std::vector<engine::GenerateInput> inputs(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      inputs[size_t(s)].prompt = prompts[size_t(s)];
      inputs[size_t(s)].params.max_tokens = 12;
      if (s % 4 > 0) {
        inputs[size_t(s)].adapter = adapters[size_t(s % 4 - 1)];
        inputs[size_t(s)].adapter_scale = cases[s % 4 - 1].scale;
      }
    }
    return testing::GenerateAll(engine, inputs);
  };
  const std::vector<float> base = forward(false);
  setenv("POLYCHIP_LORA_COMPOSED", "1", 1);
  const uint64_t lora_before = Launches(*model->device, runtime::Op::kLora);
  const std::vector<float> composed = forward(true);
  const std::vector<std::vector<int32_t>> composed_tokens = tokens();
  EXPECT_EQ(Launches(*model->device, runtime::Op::kLora), lora_before)
      << "POLYCHIP_LORA_COMPOSED=1 launched LORA";
  unsetenv("POLYCHIP_LORA_COMPOSED");
  const std::vector<float> op = forward(true);
  const std::vector<std::vector<int32_t>> op_tokens = tokens();
  EXPECT_GT(Launches(*model->device, runtime::Op::kLora), lora_before)
      << "the adapters' rows did not run as LORA launches";
  ASSERT_EQ(op.size(), composed.size());
  ASSERT_EQ(op.size(), base.size());
  // Row r's sequence: the prefill's kPrompt rows of each, then the decode step's one each.
  const size_t V = size_t(model->runner->vocab_size());
  auto sequence = [&](size_t r) {
    return r < size_t(kSeqs * kPrompt) ? int(r / kPrompt) : int(r - kSeqs * kPrompt);
  };
  float scale = 0, moved = 0;
  for (size_t i = 0; i < op.size(); ++i) {
    scale = std::max(scale, std::abs(composed[i]));
    moved = std::max(moved, std::abs(composed[i] - base[i]));
  }
  EXPECT_GT(moved, 0.1f * scale) << "the adapters do not move the logits";
  for (size_t r = 0; r < op.size() / V; ++r) {
    // The two differ in summation order only. Against a Q8_0 adapter that can move an input
    // of the int8 rounding across a step (the same run of rows in another row tile of the
    // kernel), and the logits by a step's worth: 1% of their range rather than 1e-3.
    const bool q8 = sequence(r) % 4 == 3;
    float diff = 0;
    for (size_t j = 0; j < V; ++j)
      diff = std::max(diff, std::abs(op[r * V + j] - composed[r * V + j]));
    EXPECT_LT(diff, q8 ? 0.01f * scale : 1e-3f)
        << "row " << r << " (sequence " << sequence(r) << ")";
  }
  EXPECT_EQ(op_tokens, composed_tokens);
}

TEST(SpeculativeDraftVocabulary, SameVocabularyAcceptedOtherRefused) {
  const std::string a = Synth("llama", "tiny", 1);
  ASSERT_EQ(a.rfind("error", 0), std::string::npos) << a;
  auto fa = OpenModelFile(a);
  ASSERT_TRUE(fa.ok());
  EXPECT_TRUE(launch::CheckDraftVocabulary(*fa->tokenizer, *fa->tokenizer).ok());
  // One token spelled otherwise, and a vocabulary 200 tokens shorter.
  Vocab renamed = fa->tokenizer->vocab();
  renamed.tokens[1000] = "<other>";
  auto t1 = Tokenizer::Create(renamed);
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();
  Status s = launch::CheckDraftVocabulary(*fa->tokenizer, **t1);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("token 1000 is"), std::string::npos) << s.message();
  Vocab shorter = fa->tokenizer->vocab();
  shorter.tokens.resize(shorter.tokens.size() - 200);
  if (!shorter.scores.empty()) shorter.scores.resize(shorter.tokens.size());
  if (!shorter.types.empty()) shorter.types.resize(shorter.tokens.size());
  auto t2 = Tokenizer::Create(shorter);
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  s = launch::CheckDraftVocabulary(*fa->tokenizer, **t2);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("share the model's vocabulary"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace polychip::model
