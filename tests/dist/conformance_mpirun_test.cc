// The conformance kit with ranks as processes: `mpirun -np 2 polychip conformance --plugin
// libpolychip_comm_<name>.so` checks the mpi plugin (which can start MPI only once per process,
// so threads cannot be its ranks) and the shm plugin the same way; rank 0 alone prints the table,
// and it fails a check that failed on any rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "common/command.h"

namespace {

using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using polychip::testing::Stderr;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void CheckUnderMpirun(const std::string& name) {
  const std::string plugin =
      std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_" + name + ".so";
  if (access(plugin.c_str(), R_OK) != 0) GTEST_SKIP() << plugin << " not built";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  // stdout only: the table. Plugin log lines go to stderr.
  const CommandResult r =
      RunCommand("timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 " +
                     std::string(POLYCHIP_BINARY) + " conformance --plugin " + plugin + " --ranks 2",
                 Stderr::kDiscarded);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // One table (rank 0's), with every rank's collectives run as processes.
  EXPECT_EQ(Count(r.out, "CHECK "), 1u) << r.out;
  EXPECT_NE(r.out.find("comm '" + name + "'"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("comm\\.init_rank +PASS .*2 ranks \\(processes\\)")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("collective\\.all_reduce\\.bf16\\.sum +PASS")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("p2p\\.ring +PASS"))) << r.out;
  EXPECT_EQ(Count(r.out, " FAIL "), 0u) << r.out;
  EXPECT_NE(r.out.find("0 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CONFORMS"), std::string::npos) << r.out;
}

// The gloo plugin with four ranks as threads of one process (its rendezvous through the host
// KV services, as in a real job through node 0's TCP store).
TEST(ConformanceGloo, FourRanksAsThreads) {
  const std::string plugin =
      std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_gloo.so";
  if (access(plugin.c_str(), R_OK) != 0) GTEST_SKIP() << plugin << " not built (no libgloo-dev)";
  const CommandResult r = RunCommand("timeout 180 " + std::string(POLYCHIP_BINARY) +
                                         " conformance --plugin " + plugin + " --ranks 4",
                                     Stderr::kDiscarded);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("comm\\.init_rank +PASS .*4 ranks \\(threads\\)")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("split\\.overlapping +PASS"))) << r.out;
  EXPECT_EQ(Count(r.out, " FAIL "), 0u) << r.out;
  EXPECT_NE(r.out.find("CONFORMS"), std::string::npos) << r.out;
}

TEST(ConformanceMpirun, MpiPluginRanksAsProcesses) { CheckUnderMpirun("mpi"); }
TEST(ConformanceMpirun, ShmPluginRanksAsProcesses) { CheckUnderMpirun("shm"); }

// A check that fails on rank 1 alone fails rank 0's table, naming rank 1. Rank 1 gets another
// seed, so it expects other data from rank 0 in the ring than rank 0 sends (ranks 0 and 2 agree).
TEST(ConformanceMpirun, AFailureOnAnotherRankFailsTheTable) {
  const std::string plugin =
      std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_shm.so";
  if (access(plugin.c_str(), R_OK) != 0) GTEST_SKIP() << plugin << " not built";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string cmd =
      std::string(POLYCHIP_BINARY) + " conformance --plugin " + plugin + " --filter p2p --seed ";
  const CommandResult r = RunCommand("timeout 180 mpirun --allow-run-as-root --oversubscribe -np 1 " +
                                         cmd + "1 : -np 1 " + cmd + "2 : -np 1 " + cmd + "1",
                                     Stderr::kDiscarded);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(Count(r.out, "CHECK "), 1u) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("p2p\\.ring +FAIL .*rank 1: data from rank 0")))
      << r.out;
  EXPECT_NE(r.out.find("DOES NOT CONFORM"), std::string::npos) << r.out;
}

}  // namespace
