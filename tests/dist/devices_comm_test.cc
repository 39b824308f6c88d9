// `polychip devices --tp-size T --pp-size P --nnodes N` shows the comm plugin each group of that
// job would get, why, and the plugin's reach (ABI 1.3), starting nothing: the defaults by what
// the plugins declare, a pin that cannot cross hosts (warned), the JSON form, a 1.2 plugin whose
// reach is unknown, and a shape that does not spread over the nodes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/command.h"

namespace {

using Result = polychip::testing::CommandResult;

Result Devices(const std::string& args, const std::string& env = "") {
  return polychip::testing::RunCommand(env + " timeout 60 " + std::string(POLYCHIP_BINARY) +
                                       " devices " + args);
}

bool Built(const std::string& comm) {
  return access((std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_" + comm + ".so")
                    .c_str(),
                R_OK) == 0;
}

TEST(DevicesComm, DefaultsByTopologyWithTheirReach) {
  Result r = Devices("--tp-size 2 --pp-size 2 --nnodes 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("comm per group (tp 2 x pp 2 over 2 node(s)):"), std::string::npos) << r.out;
  // Chosen by what the plugins declare, which the line repeats.
  EXPECT_NE(r.out.find("tp group 0 (ranks 0,1 on host node0): comm 'shm', default: every rank "
                       "on host node0 ('shm': reach one host, host memory, probe score 10; best "
                       "of "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("comm plugin(s) found); reach: one host (declared)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tp group 1 (ranks 2,3 on host node1): comm 'shm'"), std::string::npos);
  EXPECT_NE(r.out.find("pp group 1 (ranks 1,3 on hosts node0, node1): comm 'gloo', default: "
                       "ranks on 2 hosts, launched with --nnodes"),
            std::string::npos)
      << r.out;
  if (Built("gloo")) {
    EXPECT_NE(r.out.find("launched with --nnodes ('gloo': reach crosses hosts, host memory, "
                         "probe score 10; best of "),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("found); reach: crosses hosts (declared)"),
              std::string::npos)
        << r.out;
  }
  EXPECT_EQ(r.out.find("warning:"), std::string::npos) << r.out;

  // One node: every group on shm.
  Result one = Devices("--tp-size 2 --pp-size 2");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("pp group 0 (ranks 0,2 on host node0): comm 'shm'"), std::string::npos)
      << one.out;
  // One rank: no group at all.
  Result single = Devices("");
  ASSERT_EQ(single.exit_code, 0) << single.err;
  EXPECT_EQ(single.out.find("comm per group"), std::string::npos);
}

TEST(DevicesComm, ShmPinnedAcrossHostsIsWarned) {
  Result r = Devices("--tp-size 2 --pp-size 2 --nnodes 2 --comm-pp shm");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pp group 0 (ranks 0,2 on hosts node0, node1): comm 'shm', pinned by "
                       "--comm-pp; reach: one host (declared)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("warning: the pp group of ranks 0,2 spans 2 hosts but its comm 'shm' "
                       "reaches only the ranks of one host"),
            std::string::npos)
      << r.out;
}

TEST(DevicesComm, JsonCarriesTheLines) {
  Result r = Devices("--json --tp-size 2 --nnodes 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_TRUE(j.contains("comm_groups")) << r.out;
  ASSERT_EQ(j["comm_groups"].size(), 2u);  // the world and one tensor group, both across hosts
  EXPECT_NE(j["comm_groups"][1].get<std::string>().find(
                "tp group 0 (ranks 0,1 on hosts node0, node1): comm 'gloo'"),
            std::string::npos)
      << r.out;
}

// A plugin built against ABI 1.2 has no reach member: the host cannot tell (it never guesses
// from a name), says so, takes it to cross hosts, and warns of nothing.
TEST(DevicesComm, Abi12PluginReachIsUnknown) {
  const std::string config = "/tmp/polychip-devices-comm-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(config) << "comm: {pp: {path: " << POLYCHIP_ABI12_COMM << "}}\n";
  Result r = Devices("--config " + config + " --tp-size 1 --pp-size 2 --nnodes 2",
                     "POLYCHIP_TEST_WRAPPED_COMM=" + std::string(POLYCHIP_BUILD_DIR) +
                         "/lib/polychip/libpolychip_comm_shm.so");
  std::remove(config.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("reach: unknown (the ABI 1.2 plugin does not declare it)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("warning:"), std::string::npos) << r.out;
}

TEST(DevicesComm, RanksThatDoNotSpreadOverTheNodesAreRefused) {
  Result r = Devices("--tp-size 3 --nnodes 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("3 ranks (--tp-size x --pp-size) do not spread evenly over --nnodes 2"),
            std::string::npos)
      << r.err;
}

}  // namespace
