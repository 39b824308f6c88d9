// The conformance kit, run as a library on the in-tree plugins (which must pass) and on the
// minimal test plugin, correct and deliberately broken (the kit must fail exactly the broken
// check); and once through `polychip conformance` for the exit code and the table.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "common/command.h"
#include "runtime/conformance/conformance.h"

namespace polychip::runtime::conformance {
namespace {

using polychip::testing::AsanOptionsWithoutSegvHandler;

// The backend plugins this build produced (tests/CMakeLists.txt, polychip_test_every_backend).
const std::vector<std::string>& Backends() {
  static const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return names;
}
bool Built(const std::string& name) {
  return std::ranges::find(Backends(), name) != Backends().end();
}

std::string InTree(const std::string& name) {
  return std::string(POLYCHIP_PLUGIN_DIR) + "/libpolychip_backend_" + name + ".so";
}
std::string TestPlugin(const std::string& file) {
  return std::string(POLYCHIP_TEST_PLUGIN_DIR) + "/" + file;
}

Report RunKit(const std::string& path, int32_t device = 0, const std::string& filter = "",
              const PluginParams& params = {}) {
  Options o;
  o.plugin_path = path;
  o.device = device;
  o.filter = filter;
  o.params = params;
  auto r = Run(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Report{};
}

Outcome OutcomeOf(const Report& r, const std::string& name) {
  const CheckResult* c = r.Find(name);
  EXPECT_NE(c, nullptr) << "no check named " << name << "\n" << FormatTable(r);
  return c ? c->outcome : Outcome::kSkip;
}

// Every backend plugin of the tree conforms. The build produced it, so a missing file is a
// failure, not a skip.
class InTreePlugin : public ::testing::TestWithParam<std::string> {};

TEST_P(InTreePlugin, Conforms) {
  const std::string path = InTree(GetParam());
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " was not built";
  Report r = RunKit(path);
  EXPECT_TRUE(r.Passed()) << FormatTable(r);
  // The kit really exercised it: the setup and the core checks ran and passed.
  for (const char* name : {"load", "lifetime.initialize", "device.open", "memory.round_trip",
                           "stream.ordering", "stream.events", "errors.alloc_too_large"}) {
    EXPECT_EQ(OutcomeOf(r, name), Outcome::kPass) << name;
  }
}

// Every backend of the tree runs a model (the template too, through the reference kernels): it
// claims the ops and dtypes of the models and computes them as the reference does; none of
// it may be skipped.
TEST_P(InTreePlugin, ClaimsEveryModelOp) {
  const std::string path = InTree(GetParam());
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " was not built";
  Report r = RunKit(path, 0,
                    "^op\\.(embedding|matmul|attention|kv_store)\\.(f32|f16|q8_0|q4_0|q4_k|q6_k)|"
                    "^op\\.(rms_norm|rope|swiglu|geglu|scale|add)");
  EXPECT_TRUE(r.Passed()) << FormatTable(r);
  // vulkan's shaders read float KV caches, K's type equal to V's; a quantized or mixed cache runs
  // on the host's --op-fallback (docs/kv-cache.md). Every other backend reads them all.
  const bool float_kv_only = GetParam() == "vulkan";
  for (const CheckResult& c : r.checks) {
    if (c.name.find(".uploaded") != std::string::npos) continue;  // weight_upload is optional
    const bool kv_op = c.name.rfind("op.attention.", 0) == 0 || c.name.rfind("op.kv_store.", 0) == 0;
    // op.attention.<K's type>[_<V's type>].case: one float type for both.
    const std::string types = kv_op ? c.name.substr(c.name.find('.', 3) + 1) : "";
    const std::string kv_type = types.substr(0, types.find('.'));
    const bool float_kv = kv_type == "f32" || kv_type == "f16" || kv_type == "bf16";
    if (float_kv_only && kv_op && !float_kv) continue;
    EXPECT_EQ(c.outcome, Outcome::kPass) << c.name << ": " << c.detail;
  }
}

// Test names end in the plugin's name: `ctest -L conformance -R <name>` selects one backend.
INSTANTIATE_TEST_SUITE_P(Plugins, InTreePlugin, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(InTreePlugin);  // a tree without backends

// emu has several devices: the last one conforms too (--device).
TEST(InTreePluginDevices, EmuLastDevice) {
  if (!Built("emu")) GTEST_SKIP() << "no emu plugin in this tree";
  const std::string path = InTree("emu");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  Report r = RunKit(path, 1, "^(device|memory|stream|op\\.add)");
  EXPECT_TRUE(r.Passed()) << FormatTable(r);
  EXPECT_EQ(OutcomeOf(r, "device.open"), Outcome::kPass);
}

// emu with Kunlun XRE's capability set (profile=xre): no memset, event query, memory query,
// timing or priorities. It conforms; the checks of what it lacks are skipped, the ones that need
// a fill fill by copies, and the table it runs with really lacks the members (ABI 1.5).
TEST(InTreePluginProfiles, EmuXreConforms) {
  if (!Built("emu")) GTEST_SKIP() << "no emu plugin in this tree";
  const std::string path = InTree("emu");
  Report r = RunKit(path, 0, "", {{"profile", "xre"}});
  EXPECT_TRUE(r.Passed()) << FormatTable(r);
  EXPECT_EQ(OutcomeOf(r, "memory.memset"), Outcome::kSkip);
  EXPECT_EQ(OutcomeOf(r, "stream.timing"), Outcome::kSkip);
  for (const char* name : {"memory.alloc_free", "memory.max_alloc", "stream.ordering",
                           "stream.events", "stream.event_synchronize", "stream.priorities"}) {
    EXPECT_EQ(OutcomeOf(r, name), Outcome::kPass) << name;
  }
  EXPECT_NE(r.Find("stream.events")->detail.find("no event_query"), std::string::npos)
      << r.Find("stream.events")->detail;
  EXPECT_NE(r.Find("memory.alloc_free")->detail.find("no mem_get_info"), std::string::npos)
      << r.Find("memory.alloc_free")->detail;
  EXPECT_NE(r.Find("stream.priorities")->detail.find("[0, 0]"), std::string::npos)
      << r.Find("stream.priorities")->detail;
  // A bad profile is refused by initialize.
  Report bad = RunKit(path, 0, "^lifetime", {{"profile", "xpu"}});
  EXPECT_FALSE(bad.Passed());
}

TEST(MinimalPlugin, CorrectOneConforms) {
  Report r = RunKit(TestPlugin("libpolychip_backend_minimal_ok.so"));
  EXPECT_TRUE(r.Passed()) << FormatTable(r);
  EXPECT_EQ(OutcomeOf(r, "op.add"), Outcome::kPass);
  EXPECT_EQ(OutcomeOf(r, "op.swiglu"), Outcome::kPass);
  EXPECT_EQ(OutcomeOf(r, "op.rms_norm.weighted"), Outcome::kSkip);  // not claimed
  EXPECT_EQ(r.plugin_name, "minimal");
}

TEST(BrokenPlugin, AddThatSubtractsFailsTheAddCheck) {
  Report r = RunKit(TestPlugin("libpolychip_backend_broken_add.so"));
  EXPECT_FALSE(r.Passed());
  EXPECT_EQ(OutcomeOf(r, "op.add"), Outcome::kFail);
  EXPECT_EQ(OutcomeOf(r, "op.add.aliased"), Outcome::kFail);
  // Only the broken op: the rest of the plugin still checks out.
  EXPECT_EQ(OutcomeOf(r, "op.swiglu"), Outcome::kPass);
  EXPECT_EQ(OutcomeOf(r, "memory.round_trip"), Outcome::kPass);
  EXPECT_NE(r.Find("op.add")->detail.find("rel err"), std::string::npos);
}

TEST(BrokenPlugin, NullErrorMessageFailsTheErrorChecks) {
  Report r = RunKit(TestPlugin("libpolychip_backend_broken_error.so"));
  EXPECT_FALSE(r.Passed());
  EXPECT_EQ(OutcomeOf(r, "errors.alloc_too_large"), Outcome::kFail);
  EXPECT_EQ(OutcomeOf(r, "device.bad_ordinal"), Outcome::kFail);
  EXPECT_NE(r.Find("errors.alloc_too_large")->detail.find("NULL"), std::string::npos);
  EXPECT_EQ(OutcomeOf(r, "op.add"), Outcome::kPass);
}

TEST(BrokenPlugin, ReorderedStreamFailsTheOrderingCheck) {
  Report r = RunKit(TestPlugin("libpolychip_backend_broken_order.so"));
  EXPECT_FALSE(r.Passed());
  EXPECT_EQ(OutcomeOf(r, "stream.ordering"), Outcome::kFail);
  EXPECT_EQ(OutcomeOf(r, "op.add"), Outcome::kPass);
  EXPECT_EQ(OutcomeOf(r, "errors.alloc_too_large"), Outcome::kPass);
}

TEST(Kit, FilterSelectsChecks) {
  Report r = RunKit(TestPlugin("libpolychip_backend_minimal_ok.so"), 0, "^op\\.add$");
  for (const CheckResult& c : r.checks) {
    const bool setup = c.name == "load" || c.name == "lifetime.initialize" || c.name == "device.open";
    EXPECT_TRUE(setup || c.name == "op.add") << c.name;
  }
  EXPECT_EQ(OutcomeOf(r, "op.add"), Outcome::kPass);
  Options bad;
  bad.plugin_path = TestPlugin("libpolychip_backend_minimal_ok.so");
  bad.filter = "([";
  EXPECT_EQ(conformance::Run(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(Kit, MissingFileAndCommPlugin) {
  Report missing = RunKit("/nonexistent/libpolychip_backend_nope.so");
  EXPECT_FALSE(missing.Passed());
  EXPECT_EQ(OutcomeOf(missing, "load"), Outcome::kFail);

  // A comm plugin whose get_api returns NULL: recognised as comm, its load fails.
  Report fake = RunKit(TestPlugin("libpolychip_comm_fake.so"));
  EXPECT_EQ(fake.kind, "comm");
  EXPECT_FALSE(fake.Passed());
  EXPECT_EQ(OutcomeOf(fake, "load"), Outcome::kFail);
}

// The shm comm plugin with 3 ranks and a small slot (every collective spans many chunks).
TEST(Kit, ShmCommPluginConforms) {
  Options o;
  o.plugin_path = std::string(POLYCHIP_PLUGIN_DIR) + "/libpolychip_comm_shm.so";
  o.ranks = 3;
  o.params = {{"buffer_bytes", "8192"}};
  auto r = conformance::Run(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->Passed()) << conformance::FormatTable(*r);
  EXPECT_EQ(r->kind, "comm");
  for (const char* name : {"collective.all_reduce.bf16.sum", "collective.reduce_scatter.f16.sum",
                           "split.overlapping", "init.missing_rank_times_out", "p2p.ring"}) {
    EXPECT_EQ(OutcomeOf(*r, name), Outcome::kPass) << name;
  }
}

// emuccl, the device-memory comm plugin of emu, with 2 and 4 ranks (threads, each on its own emu
// device): every collective on device buffers enqueued on emu streams, plus the checks only a
// device-memory plugin gets (stream order after an op, the call returning before its peers
// arrive, a host pointer refused, a fused group).
TEST(Kit, EmuCclConformsOnEmuDevices) {
  const std::string path = std::string(POLYCHIP_PLUGIN_DIR) + "/libpolychip_comm_emuccl.so";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no emuccl in this tree";
  for (int32_t ranks : {2, 4}) {
    Options o;
    o.plugin_path = path;
    o.ranks = ranks;
    o.params = {{"buffer_bytes", "16384"}};
    auto r = conformance::Run(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->Passed()) << conformance::FormatTable(*r);
    for (const char* name :
         {"device_plugin.open", "collective.all_reduce.f32.sum", "collective.all_gather.bf16",
          "split.overlapping", "p2p.ring", "device.stream_order", "device.enqueue_returns",
          "device.host_pointer_refused", "device.group_fusion"}) {
      EXPECT_EQ(OutcomeOf(*r, name), Outcome::kPass) << ranks << " ranks: " << name;
    }
  }
}

// The command line: exit status, the failing check named in the table, --json.
int RunCli(const std::string& args, std::string* out, const std::string& env = "") {
  const std::string cmd = env + " " + POLYCHIP_BINARY + " conformance " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Cli, BrokenPluginExitsNonZeroAndNamesTheCheck) {
  std::string out;
  EXPECT_EQ(RunCli("--plugin " + TestPlugin("libpolychip_backend_broken_add.so"), &out), 1) << out;
  const size_t failed_line = out.find("\nfailed: ");
  ASSERT_NE(failed_line, std::string::npos) << out;
  EXPECT_NE(out.find("op.add", failed_line), std::string::npos) << out;
  EXPECT_NE(out.find("DOES NOT CONFORM"), std::string::npos) << out;
}

TEST(Cli, CorrectPluginExitsZeroWithJson) {
  std::string out;
  EXPECT_EQ(RunCli("--json --plugin " + TestPlugin("libpolychip_backend_minimal_ok.so"), &out), 0)
      << out;
  auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(j["plugin_name"], "minimal");
  EXPECT_GT(j["checks"].size(), 10u);
}

// The row of check `name` in a table printed by the command line ("" if none).
std::string Row(const std::string& table, const std::string& name) {
  for (size_t at = 0; at < table.size();) {
    size_t nl = table.find('\n', at);
    if (nl == std::string::npos) nl = table.size();
    const std::string line = table.substr(at, nl - at);
    if (line.rfind(name + " ", 0) == 0) return line;
    at = nl + 1;
  }
  return "";
}

// Issue 16: each check runs in a child process, so a plugin that crashes or hangs in one op gives
// the whole table, the misbehaving checks failed by name. (A sanitizer build would report the
// SIGSEGV itself and exit: handle_segv=0 leaves it a plain signal.) The timeout leaves the healthy
// checks room on a loaded machine: at 2 s one of them once ran out under a parallel build.
TEST(Cli, AnOpThatCrashesOrHangsFailsItsChecksAndTheOthersStillRun) {
  std::string out;
  EXPECT_EQ(RunCli("--check-timeout 5 --plugin " + TestPlugin("libpolychip_backend_faulty.so"),
                   &out, AsanOptionsWithoutSegvHandler() + " PCTEST_ADD=crash PCTEST_SWIGLU=hang"),
            1)
      << out;
  EXPECT_NE(Row(out, "op.add").find("FAIL"), std::string::npos) << out;
  EXPECT_NE(Row(out, "op.add").find("crashed: SIGSEGV"), std::string::npos) << out;
  EXPECT_NE(Row(out, "op.swiglu").find("did not finish in 5 s"), std::string::npos) << out;
  for (const char* name : {"load", "lifetime.initialize", "device.open", "memory.round_trip"}) {
    EXPECT_NE(Row(out, name).find("PASS"), std::string::npos) << name << "\n" << out;
  }
  EXPECT_NE(out.find("DOES NOT CONFORM"), std::string::npos) << out;
}

TEST(Cli, AnInitializeThatCrashesSkipsWhatNeedsIt) {
  std::string out;
  EXPECT_EQ(RunCli("--plugin " + TestPlugin("libpolychip_backend_faulty.so"), &out,
                   AsanOptionsWithoutSegvHandler() + " PCTEST_INIT=crash"),
            1)
      << out;
  EXPECT_NE(Row(out, "lifetime.initialize").find("crashed: SIGSEGV"), std::string::npos) << out;
  EXPECT_NE(Row(out, "abi.version").find("PASS"), std::string::npos) << out;  // table only
  EXPECT_NE(Row(out, "memory.round_trip").find("SKIP"), std::string::npos) << out;
  EXPECT_NE(Row(out, "memory.round_trip").find("lifetime.initialize crashed"), std::string::npos)
      << out;
}

// Isolated or not, a healthy plugin gets the same rows with the same results.
TEST(Cli, InProcessGivesTheSameTable) {
  auto rows = [](const std::string& args) {
    std::string out;
    EXPECT_EQ(RunCli("--json " + args + " --plugin " +
                         TestPlugin("libpolychip_backend_faulty.so"),
                     &out),
              0)
        << out;
    std::vector<std::pair<std::string, std::string>> names;
    auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return names;
    for (const auto& c : j["checks"]) names.emplace_back(c["name"], c["result"]);
    return names;
  };
  const auto isolated = rows("");
  EXPECT_GT(isolated.size(), 10u);
  EXPECT_EQ(isolated, rows("--in-process"));
}

TEST(Cli, CommPlugins) {
  std::string out;
  EXPECT_EQ(RunCli("--plugin " + TestPlugin("libpolychip_comm_fake.so"), &out), 1) << out;
  EXPECT_NE(out.find("returned NULL"), std::string::npos) << out;
  out.clear();
  EXPECT_EQ(RunCli("--ranks 2 --filter all_reduce.f32 --plugin " + std::string(POLYCHIP_PLUGIN_DIR) +
                       "/libpolychip_comm_shm.so",
                   &out),
            0)
      << out;
  EXPECT_NE(out.find("collective.all_reduce.f32.sum"), std::string::npos) << out;
  EXPECT_NE(out.find("CONFORMS"), std::string::npos) << out;
}

}  // namespace
}  // namespace polychip::runtime::conformance
