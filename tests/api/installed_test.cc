// The embedding API as a user gets it: `cmake --install` to a fresh prefix, then, against that
// prefix only (never this build tree), examples/embed.c built with find_package(polychip) and
// with pkg-config, and bindings/python/polychip.py under Debian's python3. Each must print the
// greedy tokens of the installed `polychip run` on the same model and prompt.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/command.h"

namespace {

namespace fs = std::filesystem;
using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using polychip::testing::ShellQuote;
using polychip::testing::Stderr;
using ::testing::HasSubstr;

constexpr char kPrompt[] = "In the beginning";
constexpr int kTokens = 16;
// Nothing from the caller's environment may point back at the build tree.
constexpr char kCleanEnv[] =
    "env -u POLYCHIP_PLUGIN_PATH -u POLYCHIP_DEVICE_BACKEND -u LD_LIBRARY_PATH -u PYTHONPATH "
    "-u POLYCHIP_PREFIX ";

// The ids after "tokens:" on a line of `out`.
std::vector<int> ParseTokensLine(const std::string& out) {
  std::vector<int> ids;
  const size_t at = out.find("tokens:");
  if (at == std::string::npos) return ids;
  std::istringstream line(out.substr(at + 7, out.find('\n', at) - at - 7));
  for (int id; line >> id;) ids.push_back(id);
  return ids;
}

class InstalledTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!POLYCHIP_HAS_CPU_PLUGIN) GTEST_SKIP() << "the cpu plugin is not part of this build";
    work_ = fs::path(::testing::TempDir()) /
            ("polychip_installed_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(work_);
    prefix_ = work_ / "prefix";
    const CommandResult install =
        Run(std::string(POLYCHIP_CMAKE_COMMAND) + " --install " POLYCHIP_BUILD_DIR " --prefix " +
            ShellQuote(prefix_.string()));
    ASSERT_EQ(install.exit_code, 0) << install.out;
    for (const char* file :
         {"include/polychip/polychip.h", "include/polychip/plugin/pc_backend.h",
          "lib/libpolychip.so.1", "lib/pkgconfig/polychip.pc",
          "lib/cmake/polychip/polychipConfig.cmake", "lib/python3/dist-packages/polychip.py",
          "lib/polychip/libpolychip_backend_cpu.so", "bin/polychip"}) {
      ASSERT_TRUE(fs::exists(prefix_ / file)) << file << " is not installed";
    }
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(work_);
  }

  static CommandResult Run(const std::string& command) {
    return RunCommand(kCleanEnv + command, Stderr::kMerged);
  }

  std::string CpuPlugin() const {
    return (prefix_ / "lib/polychip/libpolychip_backend_cpu.so").string();
  }

  // The greedy tokens of the installed CLI: `run --print-tokens` puts "token <id> ..." lines
  // on stderr.
  std::vector<int> CliTokens() const {
    const CommandResult r = RunCommand(
        kCleanEnv + ShellQuote((prefix_ / "bin/polychip").string()) + " run -m " +
            POLYCHIP_TINY_MODEL + " -p " + ShellQuote(kPrompt) + " -n " +
            std::to_string(kTokens) + " --device cpu:0 --print-tokens",
        Stderr::kCaptured);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<int> ids;
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("token ", 0) == 0) ids.push_back(std::stoi(line.substr(6)));
    }
    EXPECT_FALSE(ids.empty()) << r.err;
    return ids;
  }

  // Runs the example binary; checks what it printed besides the tokens.
  std::vector<int> RunExample(const fs::path& binary) const {
    // It was linked against the prefix, not this build tree.
    const CommandResult ldd = Run("ldd " + ShellQuote(binary.string()));
    EXPECT_THAT(ldd.out, HasSubstr((prefix_ / "lib/libpolychip.so.1").string())) << ldd.out;
    const CommandResult r = Run(ShellQuote(binary.string()) + " " + POLYCHIP_TINY_MODEL + " " +
                                ShellQuote(CpuPlugin()) + " " + ShellQuote(kPrompt) + " " +
                                std::to_string(kTokens));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    // The table the program defined, listed as polychip lists any plugin.
    EXPECT_THAT(r.out, HasSubstr("backend counting 1.0 (ABI "));
    EXPECT_THAT(r.out, HasSubstr("origin: registered by the program"));
    EXPECT_THAT(r.out, HasSubstr("cpu device"));
    // Every op went through the program's wrapper.
    const size_t at = r.out.find("launches: ");
    EXPECT_NE(at, std::string::npos) << r.out;
    if (at != std::string::npos) {
      EXPECT_GT(std::stol(r.out.substr(at + 10)), 0) << r.out;
    }
    return ParseTokensLine(r.out);
  }

  fs::path work_, prefix_;
};

TEST_F(InstalledTest, ExampleBuiltWithFindPackagePrintsTheCliTokens) {
  const fs::path build = work_ / "build-cmake";
  const CommandResult configure =
      Run(std::string(POLYCHIP_CMAKE_COMMAND) + " -S " POLYCHIP_SOURCE_DIR "/examples -B " +
          ShellQuote(build.string()) + " -G " + ShellQuote(POLYCHIP_CMAKE_GENERATOR) +
          " -DCMAKE_C_COMPILER=" + POLYCHIP_C_COMPILER +
          " -DCMAKE_PREFIX_PATH=" + ShellQuote(prefix_.string()));
  ASSERT_EQ(configure.exit_code, 0) << configure.out;
  const CommandResult compile =
      Run(std::string(POLYCHIP_CMAKE_COMMAND) + " --build " + ShellQuote(build.string()));
  ASSERT_EQ(compile.exit_code, 0) << compile.out;
  const std::vector<int> tokens = RunExample(build / "embed");
  EXPECT_EQ(tokens.size(), size_t{kTokens});
  EXPECT_EQ(tokens, CliTokens());
}

TEST_F(InstalledTest, ExampleBuiltWithPkgConfigPrintsTheCliTokens) {
  const fs::path binary = work_ / "embed-pkgconfig";
  const std::string pc = "PKG_CONFIG_PATH=" + ShellQuote((prefix_ / "lib/pkgconfig").string());
  const CommandResult flags = Run(pc + " pkg-config --cflags --libs polychip");
  ASSERT_EQ(flags.exit_code, 0) << flags.out;
  ASSERT_THAT(flags.out, HasSubstr(prefix_.string() + "/lib/pkgconfig/../../include"));
  const CommandResult compile =
      Run(std::string(POLYCHIP_C_COMPILER) + " -std=c11 -Wall -Wextra -Werror " +
          POLYCHIP_SOURCE_DIR "/examples/embed.c -o " + ShellQuote(binary.string()) +
          " $(" + pc + " pkg-config --cflags --libs polychip) -ldl -Wl,-rpath," +
          ShellQuote((prefix_ / "lib").string()));
  ASSERT_EQ(compile.exit_code, 0) << compile.out;
  EXPECT_EQ(RunExample(binary), CliTokens());
}

TEST_F(InstalledTest, PythonBindingPrintsTheCliTokens) {
  const fs::path script = work_ / "generate.py";
  {
    std::ofstream out(script);
    out << "import polychip, sys\n"
           "m = polychip.Model(sys.argv[1], device='cpu:0')\n"
           "ids, text = [], ''\n"
           "for token, piece in m.generate(sys.argv[2], max_tokens=int(sys.argv[3]),\n"
           "                               temperature=0, tokens=True):\n"
           "    if token >= 0: ids.append(token)\n"
           "    text += piece\n"
           "print('tokens:', ' '.join(map(str, ids)))\n"
           "print('finish:', m.last_finish)\n"
           "print('text:', text)\n"
           "pieces = list(m.generate(sys.argv[2], max_tokens=int(sys.argv[3])))\n"
           "print('same text:', ''.join(pieces) == text)\n"
           "print('module:', polychip.__file__)\n"
           "print('library:', [l.split()[-1] for l in open('/proc/self/maps') "
           "if 'libpolychip.so' in l][0])\n";
  }
  const CommandResult r =
      Run("PYTHONPATH=" + ShellQuote((prefix_ / "lib/python3/dist-packages").string()) +
          " python3 " + ShellQuote(script.string()) + " " + POLYCHIP_TINY_MODEL + " " +
          ShellQuote(kPrompt) + " " + std::to_string(kTokens));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("module: " + prefix_.string()));
  EXPECT_THAT(r.out, HasSubstr("library: " + fs::canonical(prefix_).string() + "/lib/"));
  EXPECT_THAT(r.out, HasSubstr("same text: True"));
  const std::vector<int> tokens = ParseTokensLine(r.out);
  EXPECT_FALSE(tokens.empty()) << r.out;
  EXPECT_EQ(tokens, CliTokens());
}

}  // namespace
