#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "runtime/config.h"

namespace polychip::runtime {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, DeviceFlag) {
  auto s = ParseDeviceFlag("emu:0,2");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->backend, "emu");
  EXPECT_EQ(s->physical, (std::vector<int32_t>{0, 2}));
  s = ParseDeviceFlag("cpu");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->physical.empty());
  EXPECT_FALSE(ParseDeviceFlag(":1").ok());
  EXPECT_FALSE(ParseDeviceFlag("emu:").ok());
  EXPECT_FALSE(ParseDeviceFlag("emu:x").ok());
  EXPECT_FALSE(ParseDeviceFlag("emu:1,-2").ok());
}

TEST(ConfigTest, ParsesYaml) {
  auto c = ParseConfigYaml(R"(
plugin_path: [/opt/a, /opt/b]
backend:
  name: emu
  path: /x/libpolychip_backend_emu.so
  params: {devices: "0,1", threads: 2, list: [3, 4]}
comm: {name: shm, params: {buffer_bytes: 4194304}}
devices: [1, 0]
memory: {arena_mb: 64}
server: {port: 8080}
)",
                           "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->extra_search_path, (std::vector<std::string>{"/opt/a", "/opt/b"}));
  ASSERT_TRUE(c->backend.has_value());
  EXPECT_EQ(c->backend->name, "emu");
  EXPECT_EQ(c->backend->path, "/x/libpolychip_backend_emu.so");
  PluginParams expect = {{"devices", "0,1"}, {"threads", "2"}, {"list", "3,4"}};
  EXPECT_EQ(c->backend->params, expect);
  ASSERT_TRUE(c->comm.has_value());
  EXPECT_EQ(c->comm->name, "shm");
  EXPECT_EQ(c->comm->params, (PluginParams{{"buffer_bytes", "4194304"}}));
  EXPECT_EQ(c->devices, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(c->arena_bytes, 64ull << 20);
  EXPECT_EQ(c->backend_source, "config test.yaml");

  auto bad = ParseConfigYaml("backend: {params: {a: 1}}", "bad.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("needs a name or a path"));
  EXPECT_FALSE(ParseConfigYaml("backend: [unclosed", "broken.yaml").ok());
  EXPECT_EQ(LoadConfigFile("/nonexistent.yaml").status().code(), StatusCode::kNotFound);
}

TEST(ConfigTest, Precedence) {
  setenv("POLYCHIP_DEVICE_BACKEND", "cpu", 1);
  auto c = ResolveRuntimeConfig("", "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name, "cpu");
  c = ResolveRuntimeConfig("", "emu:1");  // --device overrides the environment
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend->name, "emu");
  EXPECT_EQ(c->devices, (std::vector<int32_t>{1}));
  EXPECT_EQ(c->backend_source, "--device emu:1");
  unsetenv("POLYCHIP_DEVICE_BACKEND");
  c = ResolveRuntimeConfig("", "");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->backend.has_value());
}

}  // namespace
}  // namespace polychip::runtime
