// What an operator meets first, on the real `polychip serve`: a config file that refuses a
// misspelt key, `--print-config`, vLLM's and SGLang's flag names, the context and KV budget said
// at start, /health's readiness after a failed hot reload, and the metric names (every family
// /metrics exports is in docs/metrics.md, the vllm: ones included).
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "server/serve_process.h"

namespace polychip::server::testing {
namespace {

constexpr char kAdminKey[] = "admin-test-key";

// A private scratch folder (the loader refuses plugins in folders others may write).
fs::path ScratchDir(const std::string& name) {
  const fs::path dir = BuildDir() / "test-data" / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  return dir;
}

polychip::testing::CommandResult Serve(const std::string& args) {
  return RunCommand(PolychipBinary().string() + " serve " + args);
}

TEST(Operator, ConfigWithAMisspeltKeyIsRefusedNamingIt) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path dir = ScratchDir("operator-config");
  const fs::path config = dir / "c.yaml";
  std::ofstream(config) << "port: 30519\nmax_runing_requests: 3\nserve: {context-length: 128}\n";
  const auto r =
      Serve("--config " + config.string() + " --model-path " + model + " --device cpu:0 --port 0");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("unknown key 'max_runing_requests' (did you mean "
                       "'max_running_requests'?)"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("listening"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

TEST(Operator, PrintConfigShowsTheFileTheFlagsAndTheResolvedKv) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path dir = ScratchDir("operator-print");
  const fs::path config = dir / "c.yaml";
  std::ofstream(config) << "port: 30519\nmax_running_requests: 3\nserve: {context-length: 128}\n";
  // vLLM's and SGLang's spellings, the model as the first argument.
  const auto r = Serve(model + " --config " + config.string() +
                       " --device cpu:0 --threads 1 --gpu-memory-utilization 0.5 "
                       "--tensor-parallel-size 1 --kv-cache-dtype auto --log-level warning "
                       "--enable-metrics --served-model-name tiny --api-key sekret "
                       "--max-num-seqs 4 --print-config");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string& out = r.out;
  auto has = [&](const std::string& re) {
    return std::regex_search(out, std::regex(re, std::regex::multiline));
  };
  EXPECT_TRUE(has("^port: 30519 +# config .*c\\.yaml$")) << out;
  EXPECT_TRUE(has("^context_length: 128 +# config")) << out;
  EXPECT_TRUE(has("^max_running_requests: 4 +# flag$")) << out;  // the flag wins
  EXPECT_TRUE(has("^mem_fraction_static: 0\\.5 +# flag$")) << out;
  EXPECT_TRUE(has("^kv_cache_dtype: f16 +# flag$")) << out;
  EXPECT_TRUE(has("^model_path: .*serve-tiny.*# flag$")) << out;
  EXPECT_TRUE(has("^api_key: \"<set>\"")) << out;
  EXPECT_EQ(out.find("sekret"), std::string::npos) << out;
  EXPECT_TRUE(has("^# resolved on .*: context 128 \\(--context-length\\); KV cache \\d+ tokens"))
      << out;
  fs::remove_all(dir);
}

TEST(Operator, BadFlagValuesListTheValidOnes) {
  PC_REQUIRE_SERVE_DEPS(model);
  auto r = Serve("-m " + model + " --kv-cache-dtype q9 --print-config");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-cache-dtype: expected one of auto, f16, bf16, f32"), std::string::npos)
      << r.err;
  r = Serve("--model Qwen/Qwen2.5-0.5B-Instruct --port 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("GGUF only"), std::string::npos) << r.err;
  // Every flag's default is in --help.
  r = Serve("--help");
  for (const char* flag : {"--port", "--context-length", "--max-running-requests", "--page-size",
                           "--chunked-prefill-size", "--mem-fraction-static"}) {
    const size_t at = r.out.find(flag);
    ASSERT_NE(at, std::string::npos) << flag;
    EXPECT_NE(r.out.substr(at, 600).find("(default: "), std::string::npos) << flag;
  }
}

TEST(Operator, TrainedContextIsServedAndTheKvBudgetPrinted) {
  PC_REQUIRE_SERVE_DEPS(model);
  // The tiny model records a trained context of 2048: with no --context-length it is served
  // at 2048, the KV cache sized from free memory and said at start.
  ServeProcess s(model, {});
  ASSERT_TRUE(s.ok());
  const std::string log = s.Log();
  EXPECT_NE(log.find("context 2048 (the model's trained context)"), std::string::npos) << log;
  EXPECT_NE(log.find("KV budget: "), std::string::npos) << log;
  EXPECT_NE(log.find("sequences of the full context at once"), std::string::npos) << log;
  auto r = s.Client()->Get("/get_server_info");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body).value("context_length", 0), 2048) << r->body;
}

// In a container the machine's free RAM is no measure: the cpu plugin's free memory is bounded
// by the memory cgroup's limit, so the KV budget printed at start fits in it. Needs a memory
// cgroup (v1) this test may create, as root on the CI machines.
TEST(Operator, KvBudgetFitsTheMemoryCgroupsLimit) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path cgroup =
      fs::path("/sys/fs/cgroup/memory") / ("polychip-test-" + std::to_string(getpid()));
  std::error_code ec;
  if (!fs::create_directory(cgroup, ec)) {
    GTEST_SKIP() << "cannot create a memory cgroup (v1) at " << cgroup << ": " << ec.message();
  }
  constexpr int64_t kLimitMiB = 1024;
  std::ofstream(cgroup / "memory.limit_in_bytes") << (kLimitMiB << 20);
  const auto r = RunCommand("sh -c 'echo $$ > " + (cgroup / "cgroup.procs").string() + " && exec " +
                            PolychipBinary().string() + " serve " + model +
                            " --device cpu:0 --threads 1 --print-config'");
  fs::remove(cgroup, ec);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("KV budget: ([0-9.]+) MiB free"))) << r.out;
  EXPECT_LE(std::stod(m[1]), kLimitMiB) << r.out;
  EXPECT_GT(std::stod(m[1]), 0) << r.out;
}

// The metric families of a scrape (from its # TYPE lines).
std::set<std::string> Families(const std::string& scrape) {
  std::set<std::string> names;
  std::regex re("# TYPE ([^ ]+) ");
  for (auto it = std::sregex_iterator(scrape.begin(), scrape.end(), re);
       it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

TEST(Operator, VllmFamiliesBesideOursAndEveryFamilyDocumented) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--served-model-name", "tiny", "--context-length", "256"});
  ASSERT_TRUE(s.ok());
  auto [status, body] =
      s.Post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(status, 200) << body.dump();
  auto r = s.Client()->Get("/metrics");
  ASSERT_TRUE(r);
  const std::string& scrape = r->body;
  for (const char* line : {"vllm:num_requests_running{model_name=\"tiny\"} ",
                           "vllm:num_requests_waiting{model_name=\"tiny\"} ",
                           "vllm:kv_cache_usage_perc{model_name=\"tiny\"} ",
                           "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1\n",
                           "vllm:time_per_output_token_seconds_count{model_name=\"tiny\"} ",
                           "vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"} 1\n",
                           "vllm:generation_tokens_total{model_name=\"tiny\"} ",
                           "vllm:lora_requests_info{max_lora=\"8\",running_lora_adapters=\"\","
                           "waiting_lora_adapters=\"\"} 1\n"}) {
    EXPECT_NE(scrape.find(line), std::string::npos) << line << "\n" << scrape;
  }
  std::ifstream in(fs::path(POLYCHIP_SOURCE_DIR) / "docs" / "metrics.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(doc.empty());
  const std::set<std::string> families = Families(scrape);
  EXPECT_GT(families.size(), 30u);
  for (const std::string& f : families) {
    EXPECT_NE(doc.find("`" + f + "`"), std::string::npos) << f << " is not in docs/metrics.md";
  }
  // The dashboard reads only families that exist.
  std::ifstream board_in(fs::path(POLYCHIP_SOURCE_DIR) / "examples" / "grafana-dashboard.json");
  const json board = json::parse(board_in, nullptr, false);
  ASSERT_FALSE(board.is_discarded());
  std::regex name_re("(vllm:[a-z0-9_]+|polychip_[a-z0-9_]+)");
  for (const json& panel : board["panels"]) {
    for (const json& t : panel["targets"]) {
      const std::string expr = t["expr"];
      for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name_re);
           it != std::sregex_iterator(); ++it) {
        std::string name = (*it)[1];
        for (const char* suffix : {"_bucket"}) {
          if (name.size() > 7 && name.compare(name.size() - 7, 7, suffix) == 0) {
            name.resize(name.size() - 7);
          }
        }
        EXPECT_NE(doc.find("`" + name + "`"), std::string::npos) << name << " in the dashboard";
      }
    }
  }
}

TEST(Operator, VllmFamiliesCanBeSwitchedOff) {
  PC_REQUIRE_SERVE_DEPS(model);
  ServeProcess s(model, {"--context-length", "256", "--vllm-metrics=false"});
  ASSERT_TRUE(s.ok());
  auto r = s.Client()->Get("/metrics");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("polychip_num_running_reqs"), std::string::npos);
  EXPECT_EQ(r->body.find("vllm:"), std::string::npos);
}

TEST(Operator, HealthIs503OnlyWhileNoBackendCanServe) {
  PC_REQUIRE_SERVE_DEPS(model);
  if (!fs::exists(BuildDir() / "lib" / "polychip" / "libpolychip_backend_emu.so")) {
    GTEST_SKIP() << "no emu plugin";
  }
  const fs::path dir = ScratchDir("operator-health");
  const fs::path copy = dir / "libpolychip_backend_cpu.so";
  fs::copy_file(CpuPlugin(), copy);
  ServeProcess s(model, {"--admin-key", kAdminKey, "--context-length", "256"});
  ASSERT_TRUE(s.ok());
  auto health = [&] {
    auto r = s.Client()->Get("/health");
    return r ? r->status : -1;
  };
  auto reload = [&](const json& body) { return s.Post("/admin/reload_plugin", body, kAdminKey); };
  EXPECT_EQ(health(), 200);
  // Serve from the copy, then take the copy away: a reload that fails cannot restore it.
  auto [status, reply] = reload({{"kind", "backend"}, {"path", copy.string()}});
  ASSERT_EQ(status, 200) << reply.dump();
  // Refused with the old plugin serving on: still ready.
  std::tie(status, reply) =
      reload({{"kind", "backend"}, {"name", "emu"}, {"params", {{"memory_mb", 1}}}});
  EXPECT_EQ(status, 422) << reply.dump();
  EXPECT_EQ(health(), 200);
  fs::remove(copy);
  std::tie(status, reply) =
      reload({{"kind", "backend"}, {"name", "emu"}, {"params", {{"memory_mb", 1}}}});
  EXPECT_EQ(status, 500) << reply.dump();
  auto r = s.Client()->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_NE(r->body.find("no backend"), std::string::npos) << r->body;
  // Alive all the same: liveness must not restart a pod a reload can repair.
  r = s.Client()->Get("/live");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  // A working plugin makes it ready again.
  std::tie(status, reply) = reload({{"kind", "backend"}, {"path", CpuPlugin().string()}});
  EXPECT_EQ(status, 200) << reply.dump();
  EXPECT_EQ(health(), 200);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polychip::server::testing
