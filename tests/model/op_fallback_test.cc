// Op coverage checked at load and host fallback (--op-fallback), as a chip team bringing a
// plugin up would use them, through the binary: the emu plugin's only_ops parameter makes it
// claim only some ops. Needs the emu and cpu plugins; skipped in a tree without them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "common/command.h"

namespace polychip {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

const std::string kBin = std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip";
const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

bool HavePlugin(const std::string& name) {
  return std::filesystem::exists(std::string(POLYCHIP_BUILD_DIR) +
                                 "/lib/polychip/libpolychip_backend_" + name + ".so");
}

class OpFallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HavePlugin("emu") || !HavePlugin("cpu")) GTEST_SKIP() << "needs the emu and cpu plugins";
    dir_ = std::filesystem::temp_directory_path() /
           ("polychip-op-fallback-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A config selecting emu with only_ops.
  std::string Config(const std::string& only_ops) {
    const std::filesystem::path p = dir_ / "emu.yaml";
    std::ofstream(p) << "backend:\n  name: emu\n  params: {only_ops: \"" << only_ops << "\"}\n";
    return p.string();
  }

  static CommandResult Run(const std::string& flags) {
    return RunCommand(kBin + " run " + flags + " --print-tokens --ignore-eos -n 16 --model-path " +
                      ShellQuote(kModel) + " --prompt " + ShellQuote("And God said"));
  }

  // The ids of --print-tokens' lines on stderr.
  static std::vector<int> TokenIds(const std::string& err) {
    std::vector<int> ids;
    static const std::regex re(R"(token (-?[0-9]+) margin )");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
         ++it) {
      ids.push_back(std::stoi((*it)[1]));
    }
    return ids;
  }

  std::filesystem::path dir_;
};

TEST_F(OpFallbackTest, MissingOpsFailBeforeTheWeightsLoadNamingThem) {
  const CommandResult r = Run("--config " + Config("matmul") + " --device emu:0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("does not support ops this model launches"), std::string::npos) << r.err;
  for (const char* gap : {"embedding (f16), needed by token_embd.weight", "rms_norm (f32)",
                          "rope (f32)", "kv_store (f16)", "attention (f16)", "swiglu (f32)"}) {
    EXPECT_NE(r.err.find(gap), std::string::npos) << gap << "\n" << r.err;
  }
  EXPECT_EQ(r.err.find("matmul ("), std::string::npos) << "matmul is claimed\n" << r.err;
  EXPECT_NE(r.err.find("--op-fallback cpu"), std::string::npos) << r.err;
  // Before anything was uploaded: no model summary, no token.
  EXPECT_EQ(r.out.find("weights"), std::string::npos) << r.out;
  EXPECT_TRUE(TokenIds(r.err).empty());
}

TEST_F(OpFallbackTest, FallbackGivesExactlyTheCpuGreedyTokens) {
  const CommandResult cpu = Run("--device cpu:0");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const CommandResult fb = Run("--config " + Config("matmul") + " --device emu:0 --op-fallback cpu");
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_NE(fb.err.find("op fallback: embedding(f16), rms_norm(f32)"), std::string::npos) << fb.err;
  const std::vector<int> want = TokenIds(cpu.err), got = TokenIds(fb.err);
  ASSERT_EQ(want.size(), 16u);
  EXPECT_EQ(got, want);
  EXPECT_EQ(fb.out, cpu.out);
}

TEST_F(OpFallbackTest, WeightsOfFallenBackMatmulsAreStagedAndGiveTheSameTokens) {
  // The other way round: every op but MATMUL on emu, MATMUL (and its F16 weights, staged once to
  // the cpu plugin) on cpu.
  const CommandResult cpu = Run("--device cpu:0");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  const CommandResult fb = Run("--config " + Config("embedding,rms_norm,rope,kv_store,attention,swiglu") +
                               " --device emu:0 --op-fallback cpu");
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_NE(fb.err.find("op fallback: matmul(f16) run on cpu:0"), std::string::npos) << fb.err;
  EXPECT_EQ(TokenIds(fb.err), TokenIds(cpu.err));
}

// An adapter of a mixture of experts' experts is MOE's low-rank terms (ABI 1.7): with MOE
// fallen back, the terms travel with it (their A and B staged like the experts) and the tokens
// are the cpu plugin's, which the adapter changes.
TEST_F(OpFallbackTest, ExpertAdapterTermsFallBackWithMoe) {
  const std::string model = (dir_ / "moe.gguf").string(), adapter = (dir_ / "experts.gguf").string();
  const CommandResult synth = RunCommand(
      kBin + " gguf synth --quiet --vocab " + ShellQuote(kModel) + " --shape qwen3moe-tiny" +
      " --layers 2 --type F16 --seed 7 --weight-std 0.08 --out " + ShellQuote(model));
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  const CommandResult lora = RunCommand(
      kBin + " gguf synth --quiet --lora-for " + ShellQuote(model) + " --lora-rank 8" +
      " --lora-alpha 16 --type Q8_0 --lora-targets experts --weight-std 0.3 --out " +
      ShellQuote(adapter));
  ASSERT_EQ(lora.exit_code, 0) << lora.err;
  auto run = [&](const std::string& flags) {
    return RunCommand(kBin + " run " + flags + " --print-tokens --ignore-eos -n 12 --model-path " +
                      ShellQuote(model) + " --prompt " + ShellQuote("And God said"));
  };
  const std::string with = " --lora e=" + ShellQuote(adapter);
  const CommandResult base = run("--device cpu:0");
  const CommandResult cpu = run("--device cpu:0" + with);
  ASSERT_EQ(base.exit_code, 0) << base.err;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  ASSERT_EQ(TokenIds(cpu.err).size(), 12u);
  EXPECT_NE(TokenIds(cpu.err), TokenIds(base.err)) << "the adapter changes nothing";
  const CommandResult fb =
      run("--config " + Config("embedding,rms_norm,rope,kv_store,attention,swiglu,matmul") +
          " --device emu:0 --op-fallback cpu" + with);
  ASSERT_EQ(fb.exit_code, 0) << fb.err;
  EXPECT_NE(fb.err.find("op fallback: moe(f16->f16->f16) run on cpu:0"), std::string::npos) << fb.err;
  EXPECT_EQ(TokenIds(fb.err), TokenIds(cpu.err));
}

TEST_F(OpFallbackTest, DoctorPrintsTheModelsCoverageTable) {
  const std::string config = Config("matmul,swiglu");
  const CommandResult gaps = RunCommand(kBin + " doctor --config " + config +
                                        " --device emu:0 --model-path " + ShellQuote(kModel));
  EXPECT_EQ(gaps.exit_code, 1) << gaps.out << gaps.err;
  EXPECT_TRUE(std::regex_search(gaps.out, std::regex(R"(matmul +f16 +supported +blk\.\*\.attn_q)")))
      << gaps.out;
  EXPECT_TRUE(std::regex_search(gaps.out, std::regex(R"(swiglu +f32 +supported)"))) << gaps.out;
  EXPECT_TRUE(std::regex_search(gaps.out, std::regex(R"(attention +f16 +missing +blk\.\*\.k_cache)")))
      << gaps.out;
  const CommandResult covered =
      RunCommand(kBin + " doctor --config " + config + " --device emu:0 --op-fallback cpu " +
                 "--model-path " + ShellQuote(kModel));
  EXPECT_EQ(covered.exit_code, 0) << covered.out << covered.err;
  EXPECT_TRUE(std::regex_search(covered.out, std::regex(R"(attention +f16 +fallback +blk\.\*\.k_cache)")))
      << covered.out;
  EXPECT_NE(covered.out.find("every op is covered"), std::string::npos) << covered.out;
}

TEST_F(OpFallbackTest, UnknownOpNameInOnlyOpsIsAClearError) {
  const CommandResult r = Run("--config " + Config("matmul,softmax") + " --device emu:0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown op 'softmax'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rms_norm"), std::string::npos) << "lists the known ops\n" << r.err;
}

}  // namespace
}  // namespace polychip
