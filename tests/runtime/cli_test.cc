// `polychip devices` and `polychip doctor`, run as a user would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/command.h"

namespace {

using ::testing::HasSubstr;

using polychip::testing::AsanOptionsWithoutSegvHandler;
using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using polychip::testing::Stderr;

// Runs `env_prefix polychip args` in a shell; `merge_stderr` appends stderr to the output.
CommandResult RunPolychip(const std::string& env_prefix, const std::string& args,
                          bool merge_stderr) {
  return RunCommand(env_prefix + " " + POLYCHIP_BUILD_DIR "/bin/polychip " + args,
                    merge_stderr ? Stderr::kMerged : Stderr::kDiscarded);
}

const std::string kTestPath = "POLYCHIP_PLUGIN_PATH=" PCTEST_PLUGIN_DIR;

TEST(CliTest, UnknownBackendFailsNamingEveryPath) {
  CommandResult r = RunPolychip("POLYCHIP_DEVICE_BACKEND=nosuch POLYCHIP_PLUGIN_PATH=/nonexistent/one:/nonexistent/two",
                      "devices", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/one/libpolychip_backend_nosuch.so: no such file"));
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/two/libpolychip_backend_nosuch.so: no such file"));
  // The directory next to the binary is searched too.
  EXPECT_THAT(r.out, HasSubstr("lib/polychip/libpolychip_backend_nosuch.so: no such file"));
  EXPECT_THAT(r.out, HasSubstr("env POLYCHIP_DEVICE_BACKEND"));
}

TEST(CliTest, BrokenRequestedBackendFailsWithItsReason) {
  CommandResult r = RunPolychip("POLYCHIP_DEVICE_BACKEND=missingdep " + kTestPath, "devices --json", true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("unresolved dependency: libpctest_helper.so not found"));
}

TEST(CliTest, DevicesJsonByEnvironment) {
  CommandResult r = RunPolychip("POLYCHIP_DEVICE_BACKEND=goodfake " + kTestPath, "devices --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);  // stdout holds only the JSON
  ASSERT_EQ(j["backends"].size(), 1u);
  const auto& b = j["backends"][0];
  EXPECT_EQ(b["name"], "goodfake");
  EXPECT_EQ(b["version"], "0.0.1-test");
  EXPECT_EQ(b["path"], PCTEST_PLUGIN_DIR "/libpolychip_backend_goodfake.so");
  ASSERT_EQ(b["devices"].size(), 2u);
  EXPECT_EQ(b["devices"][1]["physical_id"], "fake-1");
  EXPECT_EQ(b["devices"][1]["alignment"], 4096);
  EXPECT_EQ(b["devices"][1]["max_alloc_size"], 64 << 20);
  EXPECT_EQ(b["devices"][1]["priority_high"], 3);
}

TEST(CliTest, DeviceFlagMapsLogicalToPhysical) {
  CommandResult r = RunPolychip(kTestPath, "devices --json --device goodfake:1", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const auto& devs = j["backends"][0]["devices"];
  EXPECT_TRUE(devs[0]["logical"].is_null());
  EXPECT_EQ(devs[1]["logical"], 0);
  CommandResult bad = RunPolychip(kTestPath, "devices --device goodfake:7", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.out, HasSubstr("no device 7"));
}

TEST(CliTest, DevicesByConfigFile) {
  const std::string file = ::testing::TempDir() + "/pc_cli_config.yaml";
  {
    std::ofstream out(file);
    out << "backend:\n  path: " PCTEST_PLUGIN_DIR "/libpolychip_backend_goodfake.so\n";
  }
  CommandResult r = RunPolychip("", "devices --json --config " + file, false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["backends"][0]["name"], "goodfake");
}

TEST(CliTest, DoctorExplainsEveryCandidate) {
  CommandResult r = RunPolychip(kTestPath, "doctor", true);
  EXPECT_THAT(r.out, HasSubstr(PCTEST_PLUGIN_DIR));
  EXPECT_THAT(r.out, HasSubstr("libpctest_helper.so => not found"));
  EXPECT_THAT(r.out, HasSubstr("ABI major version mismatch: plugin ABI " + std::to_string(2) + "."));
  EXPECT_THAT(r.out, HasSubstr("missing symbol 'pc_backend_get_api'"));
  EXPECT_THAT(r.out, HasSubstr("required member 'mem_alloc' is NULL"));
  EXPECT_THAT(r.out, HasSubstr("no fake accelerator present (test)"));
  EXPECT_THAT(r.out, HasSubstr("usable: goodfake 0.0.1-test"));
  CommandResult bad = RunPolychip("POLYCHIP_DEVICE_BACKEND=futureabi " + kTestPath, "doctor", true);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.out, HasSubstr("FAILED"));
}

// Issue 16: doctor inspects each plugin in a child process, so a probe that segfaults or never
// returns is named in the report while the other plugins are still diagnosed.
TEST(CliTest, DoctorSurvivesAProbeThatCrashesOrHangs) {
  // (A sanitizer build would turn the SIGSEGV into its own report and exit 1.)
  CommandResult crash =
      RunPolychip(AsanOptionsWithoutSegvHandler() + " PCTEST_PROBE=crash " + kTestPath, "doctor", true);
  EXPECT_THAT(crash.out, HasSubstr("NOT usable (probe): crashed in probe: SIGSEGV"));
  EXPECT_THAT(crash.out, HasSubstr("usable: goodfake 0.0.1-test"));
  CommandResult hang =
      RunPolychip("PCTEST_PROBE=hang POLYCHIP_PROBE_TIMEOUT_S=1 " + kTestPath, "doctor", true);
  EXPECT_THAT(hang.out, HasSubstr("NOT usable (probe): probe did not return in 1 s"));
  EXPECT_THAT(hang.out, HasSubstr("usable: goodfake 0.0.1-test"));
}

// Issue 16: `devices` with no backend asked for probes every plugin of the search path in a child
// process first, so one whose probe segfaults or never returns is skipped with its reason and
// the others are still listed.
TEST(CliTest, DevicesSkipsAProbeThatCrashesOrHangs) {
  CommandResult crash = RunPolychip(AsanOptionsWithoutSegvHandler() + " PCTEST_PROBE=crash " + kTestPath,
                                    "devices", true);
  EXPECT_EQ(crash.exit_code, 0) << crash.out;
  EXPECT_THAT(crash.out, HasSubstr("skipped plugin " PCTEST_PLUGIN_DIR
                                   "/libpolychip_backend_probeenv.so: crashed in probe: SIGSEGV"));
  EXPECT_THAT(crash.out, HasSubstr("goodfake"));
  CommandResult hang = RunPolychip("PCTEST_PROBE=hang POLYCHIP_PROBE_TIMEOUT_S=1 " + kTestPath,
                                   "devices --json", false);
  ASSERT_EQ(hang.exit_code, 0) << hang.out;
  auto j = nlohmann::json::parse(hang.out);
  bool named = false;
  for (const auto& f : j["failed"]) {
    named |= f["path"] == PCTEST_PLUGIN_DIR "/libpolychip_backend_probeenv.so" &&
             f["reason"] == "probe did not return in 1 s";
  }
  EXPECT_TRUE(named) << hang.out;
  bool listed = false;
  for (const auto& b : j["backends"]) listed |= b["name"] == "goodfake";
  EXPECT_TRUE(listed) << hang.out;
}

// The emu plugin is written by another part of the project; check it once it is built.
TEST(CliTest, EmuDevicesJson) {
  const std::string emu = POLYCHIP_BUILD_DIR "/lib/polychip/libpolychip_backend_emu.so";
  if (access(emu.c_str(), R_OK) != 0) GTEST_SKIP() << emu << " not built";
  CommandResult r = RunPolychip("POLYCHIP_DEVICE_BACKEND=emu", "devices --json", false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["backends"].size(), 1u);
  EXPECT_EQ(j["backends"][0]["name"], "emu");
  EXPECT_EQ(j["backends"][0]["path"], emu);
  EXPECT_GE(j["backends"][0]["devices"].size(), 2u);
  EXPECT_EQ(j["backends"][0]["devices"][0]["alignment"], 4096);
}

}  // namespace
