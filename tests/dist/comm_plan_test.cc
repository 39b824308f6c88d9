// The default comm plugin of a group goes by what the plugins declare, never by their names:
// on one host a plugin confined to one host (shared memory) first, across hosts only one that
// crosses them, a device-memory plugin only for its own backend, then the probe's score. And
// end to end: a tree whose only comm plugin is gloo (no shm) still runs tensor parallel, on
// gloo, and says why.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/command.h"
#include "dist/comm_plan.h"

namespace polychip::dist {
namespace {

using runtime::CommReach;

const CommCandidate kShm{"shm", 10, CommReach::kOneHost, ""};
const CommCandidate kGloo{"gloo", 10, CommReach::kCrossesHosts, ""};
const CommCandidate kMpiOutside{"mpi", 1, CommReach::kCrossesHosts, ""};
const CommCandidate kMpiUnderMpirun{"mpi", 20, CommReach::kCrossesHosts, ""};
const CommCandidate kXccl{"xccl", 50, CommReach::kOneHost, "xpu"};

std::string Pick(const std::vector<CommCandidate>& c, size_t hosts, const std::string& backend) {
  std::optional<CommCandidate> best = DefaultComm(c, hosts, backend);
  return best ? best->name : "<none>";
}

TEST(DefaultComm, OneHostPrefersAPluginConfinedToIt) {
  EXPECT_EQ(Pick({kGloo, kMpiUnderMpirun, kShm}, 1, "cpu"), "shm");
  // Without one, the network plugin with the best score serves the host too.
  EXPECT_EQ(Pick({kGloo, kMpiOutside}, 1, "cpu"), "gloo");
  EXPECT_EQ(Pick({kGloo, kMpiUnderMpirun}, 1, "cpu"), "mpi");
}

TEST(DefaultComm, AcrossHostsOnlyAPluginThatCrossesThem) {
  EXPECT_EQ(Pick({kShm, kGloo, kMpiOutside}, 2, "cpu"), "gloo");
  EXPECT_EQ(Pick({kShm, kGloo, kMpiUnderMpirun}, 2, "cpu"), "mpi");
  EXPECT_EQ(Pick({kShm}, 2, "cpu"), "<none>");
  // A plugin that does not declare its reach may cross hosts.
  EXPECT_EQ(Pick({kShm, {"old", 5, CommReach::kUnknown, ""}}, 2, "cpu"), "old");
}

TEST(DefaultComm, ADeviceMemoryPluginOnlyForItsOwnBackend) {
  EXPECT_EQ(Pick({kShm, kGloo, kXccl}, 1, "xpu"), "xccl");  // declared, and scores highest
  EXPECT_EQ(Pick({kShm, kGloo, kXccl}, 1, "cpu"), "shm");
  EXPECT_EQ(Pick({kShm, kGloo, kXccl}, 1, ""), "shm");  // backend not known yet
  // Equal scores: the name decides, so every rank of a job makes the same choice.
  EXPECT_EQ(Pick({{"b", 10, CommReach::kOneHost, ""}, {"a", 10, CommReach::kOneHost, ""}}, 1, ""),
            "a");
}

// What the in-tree plugins declare, as discovery reads them (each probed in a child first).
TEST(DiscoverCommCandidates, TheInTreePluginsDeclareTheirReachAndMemory) {
  runtime::RuntimeConfig config;
  std::vector<CommCandidate> found = DiscoverCommCandidates(config);
  auto find = [&](const std::string& name) -> const CommCandidate* {
    for (const CommCandidate& c : found) {
      if (c.name == name) return &c;
    }
    return nullptr;
  };
  const CommCandidate* shm = find("shm");
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ(shm->reach, CommReach::kOneHost);
  EXPECT_TRUE(shm->device_plugin.empty());
  if (const CommCandidate* gloo = find("gloo")) EXPECT_EQ(gloo->reach, CommReach::kCrossesHosts);
  if (const CommCandidate* emuccl = find("emuccl")) EXPECT_EQ(emuccl->device_plugin, "emu");
  ASSERT_TRUE(DefaultComm(found, 1, "emu").has_value());
  EXPECT_EQ(DefaultComm(found, 1, "emu")->name, "shm");
}

// A copy of the binary beside a plugin folder without shm: tensor parallel takes gloo.
TEST(CommPlan, WithoutShmTensorParallelRunsOnGloo) {
  const std::string build = POLYCHIP_BUILD_DIR;
  if (access((build + "/lib/polychip/libpolychip_comm_gloo.so").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "gloo plugin not built";
  }
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("pc-noshm-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "bin");
  fs::create_directories(root / "lib" / "polychip");
  fs::permissions(root, fs::perms::owner_all, fs::perm_options::replace);
  fs::copy_file(POLYCHIP_BINARY, root / "bin" / "polychip");
  for (const fs::directory_entry& e : fs::directory_iterator(build + "/lib")) {
    if (e.path().filename().string().rfind("libpolychip.so", 0) == 0) {
      fs::create_symlink(e.path(), root / "lib" / e.path().filename());
    }
  }
  for (const char* plugin : {"libpolychip_backend_emu.so", "libpolychip_comm_gloo.so"}) {
    fs::copy_file(build + "/lib/polychip/" + plugin, root / "lib" / "polychip" / plugin);
  }
  const std::string model = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";
  const testing::CommandResult r = testing::RunCommand(
      "env -u POLYCHIP_PLUGIN_PATH -u POLYCHIP_COMM_BACKEND timeout 120 " +
      (root / "bin" / "polychip").string() + " run -m " + model +
      " -p 'In the beginning' -n 4 --device emu:0,1 --tp-size 2");
  fs::remove_all(root);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("tp group 0 (ranks 0,1 on host "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("comm 'gloo', default: every rank on host"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'gloo': reach crosses hosts, host memory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace polychip::dist
