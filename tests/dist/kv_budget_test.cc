// The KV budget of `serve --mem-fraction-static`: free memory less the comm plugin's buffers
// where they live in the device's memory; and the shm plugin's report of its buffer bytes.
#include <gtest/gtest.h>

#include <string>

#include "dist/kv_budget.h"
#include "runtime/comm.h"
#include "runtime/plugin_loader.h"

namespace polychip::dist {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(KvBudget, SubtractsCommBuffersBeforeTheFraction) {
  CommBuffers comm{"shm", true, true, 16 * kMiB, "host memory, which is cpu's"};
  const KvBudget b = ComputeKvBudget(1000 * kMiB, 0.5, comm);
  EXPECT_EQ(b.kv_bytes, 492 * kMiB);  // (1000 - 16) / 2, not 1000 / 2
  EXPECT_NE(b.Describe().find("KV budget: 1000.0 MiB free - 16.0 MiB comm buffers (shm, host "
                              "memory, which is cpu's) = 984.0 MiB x 0.5 = 492.0 MiB"),
            std::string::npos)
      << b.Describe();
}

TEST(KvBudget, OneRankAndUnknownBuffersTakeNothing) {
  EXPECT_EQ(ComputeKvBudget(1000 * kMiB, 0.25, {}).kv_bytes, 250 * kMiB);
  CommBuffers unknown{"mpi", true, false, 0, "host memory, which is cpu's"};
  const KvBudget b = ComputeKvBudget(1000 * kMiB, 0.25, unknown);
  EXPECT_EQ(b.kv_bytes, 250 * kMiB);
  EXPECT_NE(b.Describe().find("mpi does not report them"), std::string::npos) << b.Describe();
}

TEST(KvBudget, CommBuffersLargerThanFreeMemoryLeaveNone) {
  CommBuffers comm{"shm", true, true, 64 * kMiB, "host memory"};
  EXPECT_EQ(ComputeKvBudget(32 * kMiB, 0.9, comm).kv_bytes, 0u);
}

TEST(KvBudget, WhereTheBuffersLive) {
  // Host-memory plugin: on the device only when the device is host memory (cpu).
  EXPECT_TRUE(CommBuffersOnDevice(false, "", "cpu", true));
  EXPECT_FALSE(CommBuffersOnDevice(false, "", "emu", false));
  // Device-memory plugin: on the devices of its own device plugin only.
  EXPECT_TRUE(CommBuffersOnDevice(true, "xpu", "xpu", false));
  EXPECT_FALSE(CommBuffersOnDevice(true, "xpu", "emu", false));
}

// The shm plugin reports one segment per communicator: n slots of buffer_bytes plus control.
TEST(KvBudget, ShmReportsItsSegmentBytes) {
  auto plugin = runtime::LoadCommFromPath(
      std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_shm.so",
      {{"buffer_bytes", "1048576"}});
  ASSERT_TRUE(plugin.ok()) << plugin.status().ToString();
  const std::optional<uint64_t> two = (*plugin)->BufferBytes(2);
  const std::optional<uint64_t> four = (*plugin)->BufferBytes(4);
  ASSERT_TRUE(two.has_value());
  ASSERT_TRUE(four.has_value());
  EXPECT_GE(*two, 2 * kMiB);
  EXPECT_LT(*two, 2 * kMiB + 64 * 1024);
  EXPECT_GE(*four, 4 * kMiB);
  EXPECT_LT(*four, 4 * kMiB + 64 * 1024);
  EXPECT_FALSE((*plugin)->BufferBytes(0).has_value());  // the plugin refuses n_ranks < 1
}

}  // namespace
}  // namespace polychip::dist
