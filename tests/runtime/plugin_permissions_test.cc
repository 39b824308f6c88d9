// Issue 16: a plugin file or folder that others may write is refused (its code would run in
// the process), unless POLYCHIP_ALLOW_INSECURE_PLUGINS=1 says to load it anyway.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/plugin_loader.h"

namespace polychip::runtime {
namespace {

namespace fs = std::filesystem;

TEST(PluginPermissionsTest, WritableByOthersIsRefusedUnlessAllowed) {
  const fs::path dir = fs::temp_directory_path() / ("pc-perm-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0755);
  const fs::path lib = dir / "libpolychip_backend_goodfake.so";
  fs::copy_file(std::string(PCTEST_PLUGIN_DIR) + "/libpolychip_backend_goodfake.so", lib,
                fs::copy_options::overwrite_existing);
  ::unsetenv("POLYCHIP_ALLOW_INSECURE_PLUGINS");

  ::chmod(lib.c_str(), 0755);
  ::chmod(dir.c_str(), 0777);
  auto in_open_folder = LoadBackendFromPath(lib.string(), {});
  ASSERT_FALSE(in_open_folder.ok());
  EXPECT_NE(in_open_folder.status().message().find("its folder is writable by others"),
            std::string::npos)
      << in_open_folder.status().message();

  ::chmod(dir.c_str(), 0755);
  ::chmod(lib.c_str(), 0666);
  auto open_file = LoadBackendFromPath(lib.string(), {});
  ASSERT_FALSE(open_file.ok());
  EXPECT_NE(open_file.status().message().find("the file is writable by others"),
            std::string::npos)
      << open_file.status().message();
  EXPECT_NE(open_file.status().message().find("POLYCHIP_ALLOW_INSECURE_PLUGINS=1"),
            std::string::npos);

  ::setenv("POLYCHIP_ALLOW_INSECURE_PLUGINS", "1", 1);
  auto allowed = LoadBackendFromPath(lib.string(), {});
  EXPECT_TRUE(allowed.ok()) << allowed.status().ToString();
  ::unsetenv("POLYCHIP_ALLOW_INSECURE_PLUGINS");
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// A plugin on the search path with the name of one beside the binary is said to shadow it.
TEST(PluginPermissionsTest, ShadowingABuiltInIsLogged) {
  const std::string builtin = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip";
  const std::string emu = builtin + "/libpolychip_backend_emu.so";
  if (!fs::exists(emu)) GTEST_SKIP() << "needs the emu plugin";
  const fs::path dir = fs::temp_directory_path() / ("pc-shadow-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  ::chmod(dir.c_str(), 0755);
  fs::copy_file(emu, dir / "libpolychip_backend_emu.so", fs::copy_options::overwrite_existing);
  ::chmod((dir / "libpolychip_backend_emu.so").c_str(), 0755);
  ::testing::internal::CaptureStderr();
  auto b = PluginRegistry::Global().LoadBackend("emu", {dir.string(), builtin}, {});
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(err.find("shadows the built-in"), std::string::npos) << err;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace polychip::runtime
