// The launch builder (launch/launch.h): a config file that refuses mistakes, the option table's
// checks and aliases, and how the context and the KV cache are sized.
#include "launch/launch.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "launch/launch_options.h"

namespace polychip::launch {
namespace {

namespace fs = std::filesystem;

// A YAML file in the test's temporary folder.
std::string WriteConfig(const std::string& name, const std::string& text) {
  const fs::path dir =
      fs::temp_directory_path() / ("polychip-launch-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

Status Apply(const std::string& text, LaunchSpec* spec, Sources* sources = nullptr) {
  return ApplyConfigFile(WriteConfig("c.yaml", text), kScopeServe, {}, spec, sources);
}

TEST(LaunchConfig, UnknownKeyNamesItAndTheNearestKnownOne) {
  LaunchSpec spec;
  const Status s =
      Apply("port: 30519\nmax_runing_requests: 3\nserve: {context-length: 128}\n", &spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key 'max_runing_requests'"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("did you mean 'max_running_requests'"), std::string::npos)
      << s.message();
}

TEST(LaunchConfig, TopLevelAndServeSectionAreOneSetOfKeys) {
  LaunchSpec spec;
  Sources sources;
  ASSERT_TRUE(
      Apply("port: 30519\nmax_running_requests: 3\nserve: {context-length: 128}\n", &spec, &sources)
          .ok());
  EXPECT_EQ(spec.port, 30519);
  EXPECT_EQ(spec.max_running_requests, 3);
  EXPECT_EQ(spec.context_length, 128);
  EXPECT_EQ(sources["port"].rfind("config ", 0), 0u);
  const Status twice = Apply("port: 1\nserve: {port: 2}\n", &spec);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.message().find("'port' is given twice"), std::string::npos) << twice.message();
}

TEST(LaunchConfig, ValuesGoThroughTheFlagsChecks) {
  LaunchSpec spec;
  Status s = Apply("port: 70000\n", &spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("port: expected an integer in [0, 65535], not '70000'"),
            std::string::npos)
      << s.message();
  s = Apply("kv_cache_dtype: q9\n", &spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected one of auto, f16, bf16, f32"), std::string::npos)
      << s.message();
  s = Apply("mem_fraction_static: 1.5\n", &spec);
  EXPECT_FALSE(s.ok());
  s = Apply("disable_radix_cache: maybe\n", &spec);
  EXPECT_FALSE(s.ok());
  ASSERT_TRUE(Apply("disable_radix_cache: true\nkv_cache_dtype: auto\n", &spec).ok());
  EXPECT_TRUE(spec.disable_radix_cache);
  EXPECT_EQ(spec.kv_cache_dtype, "f16");
}

TEST(LaunchConfig, RuntimeSectionsAreCheckedToo) {
  LaunchSpec spec;
  ASSERT_TRUE(Apply("backend: {name: cpu, params: {threads: 2}}\nmemory: {arena_mb: 64}\n"
                    "devices: [0]\nop_fallback: cpu\nplugin_path: /x\n",
                    &spec)
                  .ok());
  const Status s = Apply("backend: {nmae: cpu}\n", &spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown key 'nmae' (did you mean 'name'?)"), std::string::npos)
      << s.message();
}

TEST(LaunchConfig, EveryOptionIsAKeyAndPrintConfigReadsBack) {
  LaunchSpec spec;
  spec.port = 1234;
  spec.api_key = "secret";
  spec.context_length = 8192;
  Sources sources{{"port", "flag"}};
  const std::string text = PrintConfig(spec, kScopeServe, sources);
  EXPECT_NE(text.find("port: 1234"), std::string::npos) << text;
  EXPECT_NE(text.find("# flag"), std::string::npos) << text;
  EXPECT_EQ(text.find("secret"), std::string::npos) << text;  // keys are masked
  EXPECT_NE(text.find("mem_fraction_static: auto"), std::string::npos) << text;
  for (const Option& o : Options()) {
    if (o.scope & kScopeServe) {
      std::string key = o.name;
      std::replace(key.begin(), key.end(), '-', '_');
      EXPECT_NE(text.find("\n" + key + ": "), std::string::npos) << key;
    }
  }
  // The printed file, secrets aside, is a valid config giving the same values.
  std::string readable;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("<set>") == std::string::npos) readable += line + "\n";
  }
  LaunchSpec back;
  ASSERT_TRUE(Apply(readable, &back).ok()) << readable;
  EXPECT_EQ(back.port, 1234);
  EXPECT_EQ(back.context_length, 8192);
  EXPECT_EQ(back.mem_fraction_static, LaunchSpec::kAuto);
}

TEST(LaunchOptions, VllmAndSglangSpellingsAreAliases) {
  auto has_alias = [](const std::string& name, const std::string& alias) {
    const Option* o = FindOption(name);
    return o != nullptr &&
           std::find(o->aliases.begin(), o->aliases.end(), alias) != o->aliases.end();
  };
  EXPECT_TRUE(has_alias("model-path", "--model"));
  EXPECT_TRUE(has_alias("tp-size", "--tensor-parallel-size"));
  EXPECT_TRUE(has_alias("pp-size", "--pipeline-parallel-size"));
  EXPECT_TRUE(has_alias("mem-fraction-static", "--gpu-memory-utilization"));
  EXPECT_TRUE(has_alias("context-length", "--max-model-len"));
  EXPECT_NE(FindOption("served_model_name"), nullptr);
  EXPECT_NE(FindOption("api-key"), nullptr);
  EXPECT_NE(FindOption("log-level"), nullptr);
  EXPECT_NE(FindOption("enable-metrics"), nullptr);
}

TEST(LaunchOptions, EveryOptionIsInTheDocs) {
  std::ifstream in(fs::path(POLYCHIP_SOURCE_DIR) / "docs" / "configuration.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  for (const Option& o : Options()) {
    EXPECT_NE(doc.find("`--" + o.name + "`"), std::string::npos) << o.name;
    for (const std::string& alias : o.aliases) {
      EXPECT_NE(doc.find("`" + alias + "`"), std::string::npos) << alias;
    }
  }
}

TEST(LaunchOptions, NearestFindsTyposOnly) {
  EXPECT_EQ(Nearest("max_runing_requests", {"max_running_requests", "port"}),
            "max_running_requests");
  EXPECT_EQ(Nearest("contextlength", {"context_length", "port"}), "context_length");
  EXPECT_EQ(Nearest("zzzzzzzzzzzz", {"port", "host"}), "");
}

model::ModelFile Model32k() {
  model::ModelFile m;
  m.config.n_layer = 4;
  m.config.n_head_kv = 2;
  m.config.head_dim = 64;
  m.config.head_dim_v = 64;
  m.config.n_ctx_train = 32768;
  return m;
}

TEST(LaunchResolve, ContextIsTheTrainedOneWhenTheCacheHoldsIt) {
  LaunchSpec spec;
  spec.max_total_tokens = 100000;
  auto r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kv.context_length, 32768);
  EXPECT_EQ(r->runner.context_length, 32768);
  EXPECT_EQ(r->engine.context_length, 32768);
  EXPECT_EQ(r->kv.kv_tokens, 100000);
  EXPECT_EQ(r->kv.concurrency(), 3);
  // 4 layers x 2 heads x (64 + 64) x 2 bytes
  EXPECT_EQ(r->kv.token_bytes, 4u * 2 * 128 * 2);
  EXPECT_NE(r->kv.Describe().find("the model's trained context"), std::string::npos);
}

TEST(LaunchResolve, ContextIsBoundedByTheCacheAndSaysSo) {
  LaunchSpec spec;
  spec.max_total_tokens = 8200;
  auto r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kv.context_length, 8192);  // whole pages
  EXPECT_NE(r->kv.context_why.find("bounded by the KV cache"), std::string::npos);
  // An explicit context wins, and the cache grows to hold one sequence of it.
  spec.context_length = 16384;
  r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kv.context_length, 16384);
  EXPECT_EQ(r->kv.kv_tokens, 16384);
}

// A quantized KV cache counts its real bytes per token (a block's scale included), so a budget
// holds more tokens; K and V are chosen apart, each defaulting to --kv-cache-dtype.
TEST(LaunchResolve, KvTypesCountTheirBytesPerToken) {
  LaunchSpec spec;
  spec.max_total_tokens = 4096;
  ASSERT_TRUE(Options().size() > 0);
  auto set = [&](const std::string& name, const std::string& value) {
    for (const Option& o : Options())
      if (o.name == name) return o.set(spec, value);
    return InvalidArgument("no option " + name);
  };
  ASSERT_TRUE(set("kv-cache-dtype", "q8_0").ok());
  auto r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // 4 layers x 2 heads x (K + V) x 2 blocks of 34 bytes per head of 64
  EXPECT_EQ(r->kv.token_bytes, 4u * 2 * 2 * 2 * 34);
  EXPECT_EQ(r->runner.kv_dtypes, (model::KvCacheDtypes{DType::kQ8_0, DType::kQ8_0}));
  // f16 takes 2048 bytes a token: q8_0 holds 2048 / 1088 = 1.88x the tokens in one budget.
  EXPECT_GT(2048.0 / double(r->kv.token_bytes), 1.8);

  ASSERT_TRUE(set("kv-cache-dtype-v", "q4_0").ok());
  ASSERT_TRUE(set("kv-cache-dtype-k", "fp8").ok());  // vLLM's spelling of fp8_e4m3
  EXPECT_EQ(spec.kv_cache_dtype_k, "fp8_e4m3");
  r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->runner.kv_dtypes, (model::KvCacheDtypes{DType::kFP8_E4M3, DType::kQ4_0}));
  EXPECT_EQ(r->kv.token_bytes, 4u * 2 * 2 * (33 + 18));
  EXPECT_EQ(model::KvCacheDtypesText(r->runner.kv_dtypes), "k=fp8_e4m3 v=q4_0");

  EXPECT_FALSE(set("kv-cache-dtype-k", "q5_1").ok());  // not a KV cache type
  // A head size the blocks do not divide is refused by name.
  const Status odd = model::CheckKvCacheDtypes({DType::kQ8_0, DType::kF16}, 80, 80);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.message().find("q8_0 of K quantizes blocks of 32"), std::string::npos)
      << odd.message();
}

TEST(LaunchResolve, StepBudgetAndEngineOptionsComeFromOnePlace) {
  LaunchSpec spec;
  spec.max_total_tokens = 4096;
  spec.chunked_prefill_size = 256;
  spec.max_running_requests = 8;
  spec.disable_radix_cache = true;
  auto r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->runner.max_tokens_per_step, 256 + 8);
  EXPECT_EQ(r->engine.chunked_prefill_size, 256);
  EXPECT_EQ(r->engine.max_running_requests, 8);
  EXPECT_FALSE(r->engine.enable_prefix_cache);
  spec.max_tokens_per_step = 7;
  r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->runner.max_tokens_per_step, 7);
}

// Speculation runs with tp x pp ranks (rank 0 drafts, every rank verifies); a speculative flag
// nothing would read is refused naming it, never ignored.
TEST(LaunchResolve, SpeculationWithSeveralRanksAndFlagsNothingReads) {
  LaunchSpec spec;
  spec.max_total_tokens = 4096;
  spec.tp_size = 2;
  spec.pp_size = 2;
  spec.speculative_algorithm = "ngram";
  auto r = Resolve(spec, Model32k(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->engine.speculative.algorithm, engine::SpecAlgorithm::kNgram);
  EXPECT_EQ(r->parallel.tp_size * r->parallel.pp_size, 4);

  spec.speculative_draft_model = "draft.gguf";
  Status s = Validate(spec);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--speculative-draft-model is not used by "
                             "--speculative-algorithm ngram"),
            std::string::npos)
      << s.message();

  LaunchSpec device_only;
  device_only.speculative_draft_device = "cpu:0";
  s = Validate(device_only);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--speculative-draft-device needs --speculative-draft-model"),
            std::string::npos)
      << s.message();

  // bench, perplexity and profile run no engine: each flag given is named.
  EXPECT_TRUE(RefuseSpeculation(LaunchSpec{}, "polychip bench", "why").ok());
  LaunchSpec off;
  off.speculative_algorithm = "none";
  EXPECT_TRUE(RefuseSpeculation(off, "polychip bench", "why").ok());
  LaunchSpec draft;
  draft.speculative_draft_model = "d.gguf";
  draft.speculative_draft_device = "cpu:0";
  s = RefuseSpeculation(draft, "polychip bench", "it times plain decode");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("polychip bench does not speculate (it times plain decode): drop "
                             "--speculative-draft-model, --speculative-draft-device"),
            std::string::npos)
      << s.message();
  s = RefuseSpeculation(spec, "polychip perplexity", "why");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--speculative-algorithm ngram"), std::string::npos) << s.message();
}

TEST(LaunchModelPath, NonGgufPathsSayGgufOnlyAndHowToConvert) {
  const fs::path dir = fs::temp_directory_path() / ("polychip-hf-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors") << "{\"not\": \"gguf\"}";
  std::ofstream(dir / "config.json") << "{}";  // shorter than GGUF's magic
  for (const std::string& path :
       {dir.string(), (dir / "model.safetensors").string(), (dir / "config.json").string(),
        std::string("Qwen/Qwen2.5-7B")}) {
    const Status s = CheckModelPath(path);
    ASSERT_FALSE(s.ok()) << path;
    EXPECT_NE(s.message().find("GGUF only"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("convert_hf_to_gguf.py"), std::string::npos) << s.message();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polychip::launch
