// The comm plugins' reach (pc_comm_iface_t.reach, ABI 1.3): shm stays on one host, gloo and mpi
// cross hosts, and a 1.2 plugin (a shorter table) reads as unknown yet still loads and works.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm.h"
#include "runtime/host_services.h"
#include "runtime/plugin_loader.h"

namespace polychip::runtime {
namespace {

std::string PluginPath(const std::string& name) {
  return std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_" + name + ".so";
}

TEST(CommReach, DeclaredByTheInTreePlugins) {
  auto shm = LoadCommFromPath(PluginPath("shm"), {});
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  EXPECT_EQ((*shm)->reach(), CommReach::kOneHost);
  EXPECT_STREQ(CommReachName((*shm)->reach()), "one host");
  for (const char* network : {"gloo", "mpi"}) {
    if (access(PluginPath(network).c_str(), R_OK) != 0) continue;  // not built here
    auto p = LoadCommFromPath(PluginPath(network), {});
    if (!p.ok()) continue;  // mpi outside mpirun may refuse to initialize
    EXPECT_EQ((*p)->reach(), CommReach::kCrossesHosts) << network;
  }
}

TEST(CommReach, AnAbi12PluginReadsAsUnknownAndStillWorks) {
  setenv("POLYCHIP_TEST_WRAPPED_COMM", PluginPath("shm").c_str(), 1);
  auto old = LoadCommFromPath(POLYCHIP_ABI12_COMM, {{"timeout_ms", "5000"}});
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ((*old)->abi_minor(), 2u);
  EXPECT_EQ((*old)->reach(), CommReach::kUnknown);
  EXPECT_STREQ(CommReachName((*old)->reach()), "unknown");

  // Two ranks (threads) all-reduce through it.
  InProcessKvStore kv;
  const std::string key = "abi12-" + std::to_string(getpid());
  std::vector<float> sums(2, 0.f);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = Communicator::Create(*old, kv, key, 2, r, 5000);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      float x = float(r + 1);
      ASSERT_TRUE((*comm)->AllReduce(&x, &x, 1, DType::kF32, ReduceOp::kSum).ok());
      sums[r] = x;
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(sums, (std::vector<float>{3.f, 3.f}));
}

}  // namespace
}  // namespace polychip::runtime
