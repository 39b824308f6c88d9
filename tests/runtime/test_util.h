// Helpers shared by the runtime tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/plugin_loader.h"

namespace polychip::runtime::testing {

inline std::string PluginPath(const std::string& name) {
  return std::string(PCTEST_PLUGIN_DIR) + "/" + PluginFileName(PluginKind::kBackend, name);
}

// Every test starts with an empty registry and no selection in the environment.
class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PluginRegistry::Global().Clear();
    unsetenv("POLYCHIP_DEVICE_BACKEND");
    unsetenv("POLYCHIP_PLUGIN_PATH");
  }
  void TearDown() override { PluginRegistry::Global().Clear(); }
};

}  // namespace polychip::runtime::testing
