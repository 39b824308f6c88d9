// Plugin hot reload on the real `polychip serve` (POST /admin/reload_plugin): streaming greedy
// requests in flight while the cpu plugin is replaced by a copy of it at another path and then by
// emu finish with the text of a run without reload; broken libraries are refused with the reason
// while the old plugin serves on; the admin key guards the route.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "server/serve_process.h"

namespace polychip::server::testing {
namespace {

constexpr char kAdminKey[] = "admin-test-key";

fs::path PluginDir() { return BuildDir() / "lib" / "polychip"; }

// The tiny model at F16 (the reload must upload F16 weights again), made once per build dir.
fs::path TinyF16Model(std::string* why) {
  const fs::path vocab = LlamaCppDir() / "models" / "ggml-vocab-qwen2.gguf";
  const fs::path model = BuildDir() / "test-data" / "serve-tiny-qwen2-f16.gguf";
  if (fs::exists(model)) return model;
  if (!fs::exists(vocab)) {
    *why = vocab.string() + " not found: run tests/setup/setup-test-deps.sh";
    return {};
  }
  fs::create_directories(model.parent_path());
  const fs::path tmp = model.string() + ".tmp" + std::to_string(getpid());
  const std::string cmd = PolychipBinary().string() + " gguf synth --vocab " + vocab.string() +
                          " --shape tiny --type F16 --seed 11 -q --out " + tmp.string();
  if (RunCommand(cmd).exit_code != 0) {
    *why = "model synthesis failed: " + cmd;
    return {};
  }
  fs::rename(tmp, model);
  return model;
}

// A private folder under the build dir (the loader refuses plugins in folders others may write).
fs::path ScratchDir(const std::string& name) {
  const fs::path dir = BuildDir() / "test-data" / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  return dir;
}

json Completion(int i, bool stream) {
  return {{"prompt", "Story " + std::to_string(i) + ": once upon a time"},
          {"max_tokens", 24},
          {"temperature", 0},
          {"stream", stream}};
}

// The text of a streamed completion; empty and a failure when it did not end with [DONE].
std::string StreamText(const ServeProcess& s, int i) {
  auto [status, raw] = PostStream(s, "/v1/completions", Completion(i, true));
  EXPECT_EQ(status, 200) << raw;
  bool done = false;
  std::string text;
  for (const json& e : SseEvents(raw, &done)) {
    EXPECT_FALSE(e.contains("error")) << e.dump();
    if (e.contains("choices") && !e["choices"].empty()) {
      text += e["choices"][0].value("text", "");
    }
  }
  EXPECT_TRUE(done) << raw;
  return text;
}

json ServerInfo(const ServeProcess& s, const std::string& key = "") {
  auto r = s.Client(key)->Get("/get_server_info");
  return r ? json::parse(r->body, nullptr, false) : json();
}

std::pair<int, json> Reload(const ServeProcess& s, const json& body) {
  return s.Post("/admin/reload_plugin", body, kAdminKey);
}

TEST(HotReload, AdminRouteNeedsAKey) {
  PC_REQUIRE_SERVE_DEPS(model);
  {
    ServeProcess s(model, {});
    ASSERT_TRUE(s.ok());
    auto [status, body] = Reload(s, {{"kind", "backend"}, {"name", "cpu"}});
    EXPECT_EQ(status, 403) << body.dump();
    EXPECT_NE(body.dump().find("--admin-key"), std::string::npos) << body.dump();
  }
  ServeProcess s(model, {"--admin-key", kAdminKey, "--api-key", "api"});
  ASSERT_TRUE(s.ok());
  // The API key is not the admin key.
  auto [status, body] = s.Post("/admin/reload_plugin", {{"name", "cpu"}}, "api");
  EXPECT_EQ(status, 401) << body.dump();
  std::tie(status, body) = Reload(s, {{"kind", "gpu"}, {"name", "cpu"}});
  EXPECT_EQ(status, 400) << body.dump();
  std::tie(status, body) = Reload(s, {{"kind", "backend"}});
  EXPECT_EQ(status, 400) << body.dump();
  // A single rank has no communicator: nothing to swap, and it says so.
  std::tie(status, body) = Reload(s, {{"kind", "comm"}, {"name", "shm"}});
  EXPECT_EQ(status, 409) << body.dump();
  EXPECT_NE(body.dump().find("single rank"), std::string::npos) << body.dump();
}

TEST(HotReload, StreamsSurviveReloadsWithTheSameText) {
  PC_REQUIRE_SERVE_DEPS(unused);
  std::string why;
  const std::string model = TinyF16Model(&why).string();
  if (model.empty()) GTEST_SKIP() << why;
  const fs::path dir = ScratchDir("hot-reload");
  const fs::path copy = dir / "libpolychip_backend_cpu.so";
  fs::copy_file(CpuPlugin(), copy);
  const bool have_emu = fs::exists(PluginDir() / "libpolychip_backend_emu.so");

  ServeProcess s(model, {"--admin-key", kAdminKey, "--max-running-requests", "8"});
  ASSERT_TRUE(s.ok());
  // bench/hot-reload.sh runs 16 streams on a larger model; 8 keep this test quick.
  constexpr int kStreams = 8;
  std::vector<std::string> expected(kStreams);
  for (int i = 0; i < kStreams; ++i) expected[i] = StreamText(s, i);
  const uint64_t gen0 = ServerInfo(s).value("backend_generation", uint64_t{0});
  EXPECT_GT(gen0, 0u);
  EXPECT_EQ(ServerInfo(s).value("backend", ""), "cpu");

  // Each reload target with the 16 streams in flight: the copy of cpu, then emu, then cpu by
  // name again (emu's library is released on the way back).
  std::vector<json> targets = {{{"kind", "backend"}, {"path", copy.string()}}};
  if (have_emu) targets.push_back({{"kind", "backend"}, {"name", "emu"}});
  targets.push_back({{"kind", "backend"}, {"name", "cpu"}});
  uint64_t last_gen = gen0;
  for (const json& target : targets) {
    std::vector<std::future<std::string>> streams;
    for (int i = 0; i < kStreams; ++i) {
      streams.push_back(std::async(std::launch::async, [&s, i] { return StreamText(s, i); }));
    }
    // Let the streams start decoding before the swap.
    ServeProcess::WaitFor([&] { return s.Metric("polychip_num_running_reqs") >= kStreams / 2; },
                          30);
    auto [status, reply] = Reload(s, target);
    ASSERT_EQ(status, 200) << reply.dump() << "\n" << s.Log();
    EXPECT_TRUE(reply["ok"].get<bool>());
    EXPECT_TRUE(reply["old_unloaded"].get<bool>()) << reply.dump();
    EXPECT_GT(reply["conformance_checks"].get<int>(), 0) << reply.dump();
    EXPECT_GT(reply["backend"]["generation"].get<uint64_t>(), last_gen);
    last_gen = reply["backend"]["generation"].get<uint64_t>();
    for (int i = 0; i < kStreams; ++i) {
      EXPECT_EQ(streams[i].get(), expected[i]) << "stream " << i << " after " << target.dump();
    }
    const json info = ServerInfo(s);
    EXPECT_EQ(info.value("backend_generation", uint64_t{0}), last_gen);
    EXPECT_EQ(info.value("backend", ""), target.contains("name") ? target["name"] : "cpu");
  }
  EXPECT_EQ(s.Metric("polychip_requests_failed_total"), 0);
  fs::remove_all(dir);
}

// A quantized KV cache (K q8_0, V q4_0) moves with the sequences: streams in flight while the
// cpu plugin is replaced by emu (or, without emu, by a copy of cpu) end with the text they have
// without a reload.
TEST(HotReload, AQuantizedKvCacheMovesWithTheStreams) {
  PC_REQUIRE_SERVE_DEPS(unused);
  std::string why;
  const std::string model = TinyF16Model(&why).string();
  if (model.empty()) GTEST_SKIP() << why;
  const fs::path dir = ScratchDir("hot-reload-kvq");
  const fs::path copy = dir / "libpolychip_backend_cpu.so";
  fs::copy_file(CpuPlugin(), copy);
  const bool have_emu = fs::exists(PluginDir() / "libpolychip_backend_emu.so");
  ServeProcess s(model, {"--admin-key", kAdminKey, "--max-running-requests", "4",
                         "--kv-cache-dtype-k", "q8_0", "--kv-cache-dtype-v", "q4_0"});
  ASSERT_TRUE(s.ok());
  constexpr int kStreams = 4;
  std::vector<std::string> expected(kStreams);
  for (int i = 0; i < kStreams; ++i) expected[i] = StreamText(s, i);
  std::vector<std::future<std::string>> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(std::async(std::launch::async, [&s, i] { return StreamText(s, i); }));
  }
  ServeProcess::WaitFor([&] { return s.Metric("polychip_num_running_reqs") >= kStreams / 2; }, 30);
  const json target = have_emu ? json{{"kind", "backend"}, {"name", "emu"}}
                               : json{{"kind", "backend"}, {"path", copy.string()}};
  auto [status, reply] = Reload(s, target);
  ASSERT_EQ(status, 200) << reply.dump() << "\n" << s.Log();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(streams[i].get(), expected[i]) << "stream " << i << " after " << target.dump();
  }
  // And new requests on the new backend read and write the same cache types.
  EXPECT_EQ(StreamText(s, 0), expected[0]);
  EXPECT_EQ(s.Metric("polychip_requests_failed_total"), 0);
  fs::remove_all(dir);
}

TEST(HotReload, BrokenLibrariesAreRefusedAndTheOldPluginServes) {
  PC_REQUIRE_SERVE_DEPS(model);
  const fs::path dir = ScratchDir("hot-reload-broken");
  const fs::path not_elf = dir / "libpolychip_backend_broken.so";
  std::ofstream(not_elf) << "this is not an ELF file\n";
  // A real shared library without the backend entry symbol: the framework library itself.
  fs::path no_symbol;
  for (const auto& e : fs::directory_iterator(BuildDir() / "lib")) {
    if (e.path().filename().string().rfind("libpolychip.so", 0) == 0) no_symbol = e.path();
  }
  ServeProcess s(model, {"--admin-key", kAdminKey});
  ASSERT_TRUE(s.ok());
  const json before = ServerInfo(s);
  const std::string reference = StreamText(s, 1);

  auto [status, reply] = Reload(s, {{"kind", "backend"}, {"path", not_elf.string()}});
  EXPECT_EQ(status, 422) << reply.dump();
  EXPECT_EQ(reply.value("stage", ""), "handshake") << reply.dump();
  EXPECT_FALSE(reply.value("restored", true)) << reply.dump();  // never stopped
  EXPECT_NE(reply["error"]["message"].get<std::string>().find("dlopen"), std::string::npos)
      << reply.dump();
  if (!no_symbol.empty()) {
    std::tie(status, reply) = Reload(s, {{"kind", "backend"}, {"path", no_symbol.string()}});
    EXPECT_EQ(status, 422) << reply.dump();
    EXPECT_NE(reply["error"]["message"].get<std::string>().find("missing symbol"),
              std::string::npos)
        << reply.dump();
  }
  std::tie(status, reply) = Reload(s, {{"kind", "backend"}, {"path", (dir / "absent.so").string()}});
  EXPECT_EQ(status, 422) << reply.dump();
  EXPECT_EQ(reply.value("stage", ""), "resolve") << reply.dump();
  // The old plugin was never stopped: same generation, same text.
  EXPECT_EQ(ServerInfo(s).value("backend_generation", uint64_t{0}),
            before.value("backend_generation", uint64_t{1}));
  EXPECT_EQ(StreamText(s, 1), reference);

  // A plugin that loads but cannot hold the model (emu with 1 MiB of device memory) fails after
  // the old one was released: the old one is loaded again (a new generation) and serves.
  if (fs::exists(PluginDir() / "libpolychip_backend_emu.so")) {
    std::tie(status, reply) =
        Reload(s, {{"kind", "backend"}, {"name", "emu"}, {"params", {{"memory_mb", 1}}}});
    EXPECT_EQ(status, 422) << reply.dump();
    EXPECT_TRUE(reply.value("restored", false)) << reply.dump();
    EXPECT_EQ(reply["backend"]["name"], "cpu") << reply.dump();
    const json after = ServerInfo(s);
    EXPECT_EQ(after.value("backend", ""), "cpu");
    EXPECT_GT(after.value("backend_generation", uint64_t{0}),
              before.value("backend_generation", uint64_t{0}));
    EXPECT_EQ(StreamText(s, 1), reference);
  }
  fs::remove_all(dir);
}

// Issue 38: a reload to a discovered plugin works on every launch. Started without --device the
// server loads only the plugin discovery chose (generation 1: no other was loaded before it), so
// a reload to another one on the search path (emu) loads it afresh, and one back to the first by
// name too; with --device the same.
void ReloadsToDiscoveredPlugins(ServeBackend launch) {
  PC_REQUIRE_SERVE_DEPS(unused);
  std::string why;
  const std::string model = TinyF16Model(&why).string();  // the same text on cpu and emu
  if (model.empty()) GTEST_SKIP() << why;
  if (!fs::exists(PluginDir() / "libpolychip_backend_emu.so")) GTEST_SKIP() << "no emu plugin";
  ServeProcess s(model, {"--admin-key", kAdminKey}, launch);
  ASSERT_TRUE(s.ok());
  const json info = ServerInfo(s);
  const std::string first = info.value("backend", "");
  ASSERT_FALSE(first.empty()) << info.dump();
  EXPECT_EQ(info.value("backend_generation", uint64_t{0}), 1u) << s.Log();
  const std::string reference = StreamText(s, 3);
  // Discovery may choose emu itself only where nothing scores higher; then go to cpu and back.
  const std::string other = first == "emu" ? "cpu" : "emu";
  uint64_t generation = 1;
  for (const std::string& target : {other, first}) {
    auto [status, reply] = Reload(s, {{"kind", "backend"}, {"name", target}});
    ASSERT_EQ(status, 200) << reply.dump() << "\n" << s.Log();
    EXPECT_EQ(reply["backend"]["name"], target) << reply.dump();
    EXPECT_EQ(reply["backend"]["generation"], ++generation) << reply.dump();
    EXPECT_TRUE(reply.value("old_unloaded", false)) << reply.dump();
    EXPECT_EQ(ServerInfo(s).value("backend", ""), target);
    EXPECT_EQ(StreamText(s, 3), reference);
  }
}

TEST(HotReload, ToADiscoveredPluginWhenTheServerPickedItsBackend) {
  ReloadsToDiscoveredPlugins(ServeBackend::kDiscovered);
}

TEST(HotReload, ToADiscoveredPluginWhenDeviceWasGiven) {
  ReloadsToDiscoveredPlugins(ServeBackend::kCpu);
}

// SIGHUP re-reads --config: a changed backend section is reloaded, an unchanged one is not.
TEST(HotReload, SighupAppliesTheConfigsBackend) {
  PC_REQUIRE_SERVE_DEPS(model);
  if (!fs::exists(PluginDir() / "libpolychip_backend_emu.so")) GTEST_SKIP() << "no emu plugin";
  const fs::path dir = ScratchDir("hot-reload-sighup");
  const fs::path config = dir / "serve.yaml";
  std::ofstream(config) << "backend: {name: cpu}\n";
  ServeProcess s(model, {"--config", config.string()});
  ASSERT_TRUE(s.ok());
  const uint64_t gen0 = ServerInfo(s).value("backend_generation", uint64_t{0});
  const std::string reference = StreamText(s, 2);

  ::kill(s.pid(), SIGHUP);  // unchanged: nothing happens
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(ServerInfo(s).value("backend_generation", uint64_t{0}), gen0);

  std::ofstream(config) << "backend: {name: emu, params: {devices: \"1\"}}\n";
  ::kill(s.pid(), SIGHUP);
  EXPECT_TRUE(ServeProcess::WaitFor([&] { return ServerInfo(s).value("backend", "") == "emu"; },
                                    60))
      << s.Log();
  EXPECT_GT(ServerInfo(s).value("backend_generation", uint64_t{0}), gen0);
  EXPECT_EQ(StreamText(s, 2), reference);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace polychip::server::testing
