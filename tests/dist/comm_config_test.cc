// Choosing the comm plugin: the YAML `comm:` section wins over POLYCHIP_COMM_BACKEND, whose
// parameters come from POLYCHIP_COMM_PARAMS; each choice records where it came from.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "runtime/config.h"

namespace polychip::runtime {
namespace {

TEST(CommConfig, EnvironmentAndYaml) {
  setenv("POLYCHIP_COMM_BACKEND", "shm", 1);
  setenv("POLYCHIP_COMM_PARAMS", "buffer_bytes=65536,protocol=flat", 1);
  auto env = ResolveRuntimeConfig("", "");
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  ASSERT_TRUE(env->comm.has_value());
  EXPECT_EQ(env->comm->name, "shm");
  EXPECT_EQ(env->comm_source, "env POLYCHIP_COMM_BACKEND");
  ASSERT_EQ(env->comm->params.size(), 2u);
  EXPECT_EQ(env->comm->params[1], (std::pair<std::string, std::string>{"protocol", "flat"}));

  setenv("POLYCHIP_COMM_PARAMS", "nonsense", 1);
  EXPECT_EQ(ResolveRuntimeConfig("", "").status().code(), StatusCode::kInvalidArgument);

  const std::string path = "/tmp/polychip-comm-config-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "comm: {name: mpi, params: {timeout_ms: 500}}\n";
  auto yaml = ResolveRuntimeConfig(path, "");
  std::remove(path.c_str());
  ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
  EXPECT_EQ(yaml->comm->name, "mpi");
  EXPECT_EQ(yaml->comm_source, "config " + path);
  unsetenv("POLYCHIP_COMM_BACKEND");
  unsetenv("POLYCHIP_COMM_PARAMS");
  EXPECT_FALSE(ResolveRuntimeConfig("", "")->comm.has_value());
}

// `comm: {tp: shm, pp: {name: gloo, params: ...}}` pins groups one by one and leaves the rest to
// the topology; a name beside them pins the rest.
TEST(CommConfig, PerGroupPins) {
  auto groups = ParseConfigYaml(
      "comm: {tp: shm, pp: {name: gloo, params: {timeout_ms: 500}}}\n", "test.yaml");
  ASSERT_TRUE(groups.ok()) << groups.status().ToString();
  EXPECT_FALSE(groups->comm.has_value());
  ASSERT_EQ(groups->comm_groups.size(), 2u);
  EXPECT_EQ(groups->comm_groups.at("tp").name, "shm");
  EXPECT_EQ(groups->comm_groups.at("pp").name, "gloo");
  EXPECT_EQ(groups->comm_groups.at("pp").params[0].second, "500");
  EXPECT_EQ(groups->comm_source, "config test.yaml");
  auto rest = ParseConfigYaml("comm: {name: mpi, world: gloo}\n", "t.yaml");
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->comm->name, "mpi");
  EXPECT_EQ(rest->comm_groups.at("world").name, "gloo");
  EXPECT_FALSE(ParseConfigYaml("comm: {tp: {params: {a: 1}}}\n", "bad.yaml").ok());
}

}  // namespace
}  // namespace polychip::runtime
