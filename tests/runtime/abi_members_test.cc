// Members appended to an op's args struct after a plugin's ABI minor: the plugin would ignore
// them, so a launch that sets one (ATTENTION's window, 1.4, for a 1.3 plugin) is refused with
// the member's name, while the same launch without it reaches the plugin.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/fake_backend.h"
#include "polychip/plugin/pc_backend.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"
#include "test_util.h"

namespace polychip::runtime {
namespace {

using ::testing::HasSubstr;

class AbiMembersTest : public testing::RuntimeTest {};

TEST_F(AbiMembersTest, WindowIsNeverSentToAPluginOlderThan14) {
  // Static: the registry keeps the backend (and calls its table) until the fixture clears it.
  static pc_backend_iface_t t;
  t = *FakeBackendTable();
  t.abi_minor = 3;
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto devices = OpenDevices(*b, {0});
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  auto stream = (*devices)[0]->CreateStream(0);
  ASSERT_TRUE(stream.ok());

  AttentionArgs a;
  a.n_heads = a.n_kv_heads = 1;
  a.head_dim = 4;
  a.block_size = 16;
  a.window = 8;
  const Status refused = Launch(**stream, a);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("attention.window"));
  EXPECT_THAT(refused.message(), HasSubstr("ABI 1.3"));
  EXPECT_THAT(refused.message(), HasSubstr("--op-fallback"));

  // No window: the launch reaches the plugin (whose only op is ADD).
  a.window = 0;
  const Status reached = Launch(**stream, a);
  EXPECT_EQ(reached.code(), StatusCode::kUnimplemented) << reached.ToString();
  EXPECT_THAT(reached.message(), HasSubstr("only add"));
}

TEST_F(AbiMembersTest, A14PluginGetsTheWindow) {
  // Static: the registry keeps the backend (and calls its table) until the fixture clears it.
  static pc_backend_iface_t t;
  t = *FakeBackendTable();  // declares the host's ABI
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto devices = OpenDevices(*b, {0});
  ASSERT_TRUE(devices.ok());
  auto stream = (*devices)[0]->CreateStream(0);
  ASSERT_TRUE(stream.ok());
  AttentionArgs a;
  a.window = 8;
  EXPECT_THAT(Launch(**stream, a).message(), HasSubstr("only add"));
}

}  // namespace
}  // namespace polychip::runtime
