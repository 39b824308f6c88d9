// The framework's zero-staging path through emuccl, the device-memory comm plugin of emu: tp 2,
// pp 2, tp 2 x pp 2 and two simulated hosts (--nnodes, tp over emuccl inside each host, pp over
// gloo across) give the single rank's greedy tokens, and the groups on emuccl stage no byte
// through host memory, where shm's staging copies every hidden state out and back.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/command.h"

namespace {

using polychip::testing::ChildProcess;
using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using polychip::testing::ShellQuote;

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";
const std::string kPluginDir = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip";
const std::string kPrompt = "And God said, Let there be light";

std::vector<int> Tokens(const std::string& err) {
  std::vector<int> ids;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("token ", 0) == 0) ids.push_back(std::atoi(line.c_str() + 6));
  }
  return ids;
}

// A config pinning the tp and pp groups to `plugin`.
std::string Config(const std::string& plugin, const std::string& groups = "{tp: P, pp: P}") {
  const std::string path =
      ::testing::TempDir() + "/emuccl_" + plugin + "_" + std::to_string(getpid()) + ".yaml";
  std::string g = groups;
  for (size_t at; (at = g.find('P')) != std::string::npos;) g.replace(at, 1, plugin);
  std::ofstream(path) << "comm: " << g << "\n";
  return path;
}

// The bytes each group staged through host memory ("dist: tp group through 'emuccl' (device
// memory): 0 bytes staged through host memory"), by group.
std::map<std::string, long long> Staged(const std::string& err, const std::string& plugin) {
  std::map<std::string, long long> staged;
  const std::regex re("dist: (tp|pp) group through '" + plugin +
                      "' \\((device|host) memory\\): ([0-9]+) bytes staged");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it) {
    staged[(*it)[1]] = std::atoll((*it)[3].str().c_str());
  }
  return staged;
}

CommandResult Polychip(const std::string& flags) {
  return RunCommand("timeout 120 " + std::string(POLYCHIP_BINARY) + " run -m " + kModel + " -p " +
                    ShellQuote(kPrompt) + " -n 24 --print-tokens " + flags);
}

bool HaveEmuccl() { return std::filesystem::exists(kPluginDir + "/libpolychip_comm_emuccl.so"); }

class EmucclLayouts : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(EmucclLayouts, SameTokensAndNothingStaged) {
  if (!HaveEmuccl()) GTEST_SKIP() << "emuccl not built";
  const auto [tp, pp] = GetParam();
  const CommandResult one = Polychip("--device emu:0");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string layout =
      " --device emu:0,1,2,3 --tp-size " + std::to_string(tp) + " --pp-size " + std::to_string(pp);
  const CommandResult ccl = Polychip("--config " + Config("emuccl") + layout);
  ASSERT_EQ(ccl.exit_code, 0) << ccl.err;
  EXPECT_EQ(Tokens(ccl.err).size(), 24u) << ccl.err;
  EXPECT_EQ(Tokens(ccl.err), Tokens(one.err)) << ccl.err;
  EXPECT_EQ(ccl.out, one.out);
  const auto staged = Staged(ccl.err, "emuccl");
  for (const char* group : {"tp", "pp"}) {
    if ((group[0] == 't' ? tp : pp) == 1) continue;
    ASSERT_EQ(staged.count(group), 1u) << group << "\n" << ccl.err;
    EXPECT_EQ(staged.at(group), 0) << group;
  }
  // The same layout over shm stages every hidden state it moves.
  const CommandResult shm = Polychip("--config " + Config("shm") + layout);
  ASSERT_EQ(shm.exit_code, 0) << shm.err;
  EXPECT_EQ(Tokens(shm.err), Tokens(one.err));
  for (const auto& [group, bytes] : Staged(shm.err, "shm")) EXPECT_GT(bytes, 0) << group;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EmucclLayouts,
                         ::testing::Values(std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.first) + "_pp" +
                                  std::to_string(info.param.second);
                         });

// A device-memory plugin for another backend is refused, not given host pointers.
TEST(Emuccl, RefusedForAnotherBackend) {
  if (!HaveEmuccl()) GTEST_SKIP() << "emuccl not built";
  if (!std::filesystem::exists(kPluginDir + "/libpolychip_backend_cpu.so")) GTEST_SKIP();
  const CommandResult r = Polychip("--config " + Config("emuccl") + " --device cpu:0,0 --tp-size 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("reads the device memory of backend 'emu'"), std::string::npos) << r.err;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Two simulated hosts (POLYCHIP_HOST_ID): tp 2 on emuccl inside each, pp over gloo across.
TEST(Emuccl, TwoHostsGiveTheSingleRankTokens) {
  if (!HaveEmuccl()) GTEST_SKIP() << "emuccl not built";
  if (!std::filesystem::exists(kPluginDir + "/libpolychip_comm_gloo.so")) {
    GTEST_SKIP() << "gloo comm plugin not built";
  }
  const CommandResult one = Polychip("--device emu:0");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  const std::string config = Config("emuccl", "{tp: emuccl}");
  auto node = [&](int rank) {
    return "env POLYCHIP_HOST_ID=host" + std::to_string(rank) + " timeout 120 " +
           std::string(POLYCHIP_BINARY) + " run -m " + kModel + " -p " + ShellQuote(kPrompt) +
           " -n 24 --print-tokens --config " + config +
           " --tp-size 2 --pp-size 2 --nnodes 2 --node-rank " + std::to_string(rank) +
           " --dist-init-addr " + addr + " --dist-token t0k --dist-timeout 30 --device " +
           (rank == 0 ? "emu:0,1" : "emu:2,3");
  };
  ChildProcess node1({"/bin/sh", "-c", node(1)}, {.stdout_to_log = true, .alarm_seconds = 120});
  const CommandResult node0 = RunCommand(node(0));
  const std::optional<int> code1 = node1.Wait(30);
  EXPECT_EQ(code1.value_or(-1), 0) << node1.Log();
  ASSERT_EQ(node0.exit_code, 0) << node0.err << "\nnode 1:\n" << node1.Log();
  EXPECT_EQ(Tokens(node0.err), Tokens(one.err)) << node0.err;
  const auto staged = Staged(node0.err, "emuccl");
  ASSERT_EQ(staged.count("tp"), 1u) << node0.err;
  EXPECT_EQ(staged.at("tp"), 0);
}

}  // namespace
