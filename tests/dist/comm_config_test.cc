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

}  // namespace
}  // namespace polychip::runtime
