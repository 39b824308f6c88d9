// Every backend plugin the build produced runs a model through the binary, as a user would
// (`polychip run --device <name>:0`, the plugin found in the folder beside the binary): the
// bundled model's greedy continuation has every token asked for and, when the tree has the cpu
// plugin, is the cpu plugin's, token for token. The model's weights are F16, which every
// backend computes in F32 (the cpu plugin quantizes activations only for quantized weights), so
// the greedy tokens agree exactly. A new folder under plugins/backends/ gets this test with no
// edit here (tests/CMakeLists.txt, polychip_test_every_backend).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "common/command.h"

namespace polychip {
namespace {

using testing::CommandResult;
using testing::RunCommand;
using testing::ShellQuote;

const std::vector<std::string>& Backends() {
  static const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return names;
}

constexpr int kTokens = 24;

const std::string kPolychip = std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip";
const std::string kBundledModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";

// Greedy generation of `model` (default: the bundled model) on device 0 of `backend`.
CommandResult RunOn(const std::string& backend, const std::string& model = kBundledModel,
                    const std::string& extra = "") {
  return RunCommand(kPolychip + " run --device " + backend + ":0 --print-tokens --ignore-eos -n " +
                    std::to_string(kTokens) + " --model-path " + ShellQuote(model) +
                    " --prompt " + ShellQuote("And God said") + extra);
}

// A random-weight model of one of `polychip gguf synth`'s shapes in F16 with the llama-spm
// vocabulary (32000 tokens: the embedding table fits emu's 64 MiB largest allocation, which
// qwen2's 151936 rows would not at a width of 256), written once per build directory; "" after
// adding a failure.
// `arch` (optional) overrides the shape's architecture, `vocab` names llama.cpp's vocabulary file.
std::string SynthesizedModel(const std::string& shape, const std::string& arch = "",
                             const std::string& vocab_name = "llama-spm") {
  const std::string vocab =
      (testing::LlamaCppDir() / ("models/ggml-vocab-" + vocab_name + ".gguf")).string();
  const std::string out = std::string(POLYCHIP_BUILD_DIR) + "/test-models/run_" + shape +
                          (arch.empty() ? "" : "_" + arch) +
                          (vocab_name == "llama-spm" ? "" : "_" + vocab_name) + ".gguf";
  // ctest runs the backends' tests in parallel: each writes its own file and renames it into
  // place (the contents are the same), so none reads a half-written model.
  const std::string tmp = out + ".tmp" + std::to_string(getpid());
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  const std::string cmd = kPolychip + " gguf synth --vocab " + ShellQuote(vocab) + " --shape " +
                          shape + (arch.empty() ? "" : " --arch " + arch) +
                          " --type F16 --seed 5 --weight-std 0.08 --quiet --out " + ShellQuote(tmp);
  const CommandResult r = RunCommand(cmd);
  if (r.exit_code != 0) {
    ADD_FAILURE() << cmd << " failed:\n" << r.err;
    return "";
  }
  std::filesystem::rename(tmp, out);
  return out;
}

// The ids of --print-tokens' lines ("token <id> margin <m> piece <hex>") on stderr.
std::vector<int> TokenIds(const std::string& err) {
  std::vector<int> ids;
  static const std::regex re(R"(token (-?[0-9]+) margin )");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator();
       ++it) {
    ids.push_back(std::stoi((*it)[1]));
  }
  return ids;
}

class BackendRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendRunTest, GreedyTokensOfTheBundledModel) {
  const CommandResult ours = RunOn(GetParam());
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  const std::vector<int> ids = TokenIds(ours.err);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kTokens)) << ours.err;

  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  if (GetParam() == "cpu" || !have_cpu) return;  // no other backend to agree with
  const CommandResult cpu = RunOn("cpu");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(ids, TokenIds(cpu.err)) << GetParam() << ":\n" << ours.err << "\ncpu:\n" << cpu.err;
  EXPECT_EQ(ours.out, cpu.out);
}

// Every architecture runs on every backend and gives the cpu plugin's greedy tokens, token for
// token: qwen3 (per-head q/k norms, a head size of its own), phi3 (fused matrices cut by rows,
// partial rotary, LongRoPE factors).
// Runs `model` on `backend` and on cpu and compares their greedy tokens; returns the backend's
// run (stderr holds its log).
CommandResult ExpectCpuTokensOf(const std::string& backend, const std::string& model,
                                const std::string& extra = "") {
  if (model.empty()) return {};
  const CommandResult ours = RunOn(backend, model, extra);
  EXPECT_EQ(ours.exit_code, 0) << ours.err;
  const std::vector<int> ids = TokenIds(ours.err);
  EXPECT_EQ(ids.size(), static_cast<size_t>(kTokens)) << ours.err;
  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  if (backend == "cpu" || !have_cpu || ours.exit_code != 0) return ours;
  const CommandResult cpu = RunOn("cpu", model);
  EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(ids, TokenIds(cpu.err)) << backend << ":\n" << ours.err << "\ncpu:\n" << cpu.err;
  return ours;
}
void ExpectCpuTokens(const std::string& backend, const std::string& shape,
                     const std::string& extra = "") {
  ExpectCpuTokensOf(backend, SynthesizedModel(shape), extra);
}

TEST_P(BackendRunTest, GreedyTokensOfASynthesizedQwen3) {
  ExpectCpuTokens(GetParam(), "qwen3-tiny");
}
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedPhi3) {
  ExpectCpuTokens(GetParam(), "phi3-tiny");
}
// qwen3moe (the MOE op): a backend without MOE (vulkan) runs it on the cpu plugin through the op
// fallback, which stages the 3-D expert tensors once as weights; the others run it themselves.
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedQwen3Moe) {
  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  ExpectCpuTokens(GetParam(), "qwen3moe-tiny", have_cpu ? " --op-fallback cpu" : "");
}

// gemma3 (GEGLU, SCALE, ATTENTION's window on six of its seven layers). llama-spm's vocabulary,
// as above: the real Gemma one (262144 rows of 256) is past emu's largest allocation.
TEST_P(BackendRunTest, GreedyTokensOfASynthesizedGemma3) {
  ExpectCpuTokens(GetParam(), "gemma3-tiny");
}

// A quantized KV cache, K and V of two types: every backend gives the cpu plugin's tokens. A
// backend without them (vulkan) is refused at load with the ops and types named, and runs them
// on the cpu plugin with --op-fallback.
TEST_P(BackendRunTest, GreedyTokensWithAQuantizedKvCache) {
  const std::string kv = " --kv-cache-dtype-k q8_0 --kv-cache-dtype-v q4_0";
  CommandResult ours = RunOn(GetParam(), kBundledModel, kv);
  const bool have_cpu = std::ranges::find(Backends(), "cpu") != Backends().end();
  if (ours.exit_code != 0) {
    EXPECT_NE(ours.err.find("attention (k=q8_0 v=q4_0)"), std::string::npos) << ours.err;
    if (!have_cpu) return;
    ours = RunOn(GetParam(), kBundledModel, kv + " --op-fallback cpu");
    EXPECT_NE(ours.err.find("op fallback: kv_store(k=q8_0 v=q4_0)"), std::string::npos)
        << ours.err;
  }
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  const std::vector<int> ids = TokenIds(ours.err);
  ASSERT_EQ(ids.size(), static_cast<size_t>(kTokens)) << ours.err;
  if (GetParam() == "cpu" || !have_cpu) return;
  const CommandResult cpu = RunOn("cpu", kBundledModel, kv);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(ids, TokenIds(cpu.err)) << GetParam() << ":\n" << ours.err << "\ncpu:\n" << cpu.err;
}

bool HaveEmuAndCpu() {
  return std::ranges::find(Backends(), "emu") != Backends().end() &&
         std::ranges::find(Backends(), "cpu") != Backends().end();
}

// The architectures `polychip gguf synth --arch` knows, from its help ("llama|qwen2|...").
std::vector<std::string> SynthArchitectures() {
  const CommandResult help = RunCommand(kPolychip + " gguf synth --help");
  std::smatch m;
  static const std::regex re(R"(--arch\s+TEXT\s+([a-z0-9_|]+))");
  std::vector<std::string> arches;
  if (!std::regex_search(help.out, m, re)) return arches;
  std::stringstream list(m[1].str());
  for (std::string a; std::getline(list, a, '|');) arches.push_back(a);
  return arches;
}

// emu with Kunlun XRE's capability set (profile=xre: no memset, event query, memory query,
// timing or priorities; ABI 1.5): every architecture synth knows runs on it, through the
// framework's fills by copy and its waits without a query, and gives the cpu plugin's greedy
// tokens on F16. An architecture without a tiny shape of its own takes the llama-shaped one.
TEST(EmuXreProfile, EveryArchitectureGivesTheCpuPluginsTokens) {
  if (!HaveEmuAndCpu()) GTEST_SKIP() << "needs the emu and cpu plugins";
  const std::string config = std::string(POLYCHIP_BUILD_DIR) + "/test-models/emu-xre.yaml";
  std::filesystem::create_directories(std::filesystem::path(config).parent_path());
  std::ofstream(config) << "backend: {name: emu, params: {profile: xre}}\n";
  const std::vector<std::string> arches = SynthArchitectures();
  ASSERT_GE(arches.size(), 6u) << "could not read the architectures from gguf synth --help";
  const std::map<std::string, std::string> shapes = {{"llama", "tiny"},
                                                     {"qwen3", "qwen3-tiny"},
                                                     {"phi3", "phi3-tiny"},
                                                     {"qwen3moe", "qwen3moe-tiny"},
                                                     {"gemma3", "gemma3-tiny"}};
  for (const std::string& arch : arches) {
    SCOPED_TRACE(arch);
    const auto it = shapes.find(arch);
    const std::string model =
        it != shapes.end() ? SynthesizedModel(it->second) : SynthesizedModel("tiny", arch);
    ExpectCpuTokensOf("emu", model, " --config " + ShellQuote(config));
  }
}

// Tensors over the device's max single allocation are split by rows (model_loader.h): with emu's
// limit at 1 MiB every architecture's embedding and output tables (8-16 MiB at F16) are cut into
// pieces, and the greedy tokens are still the cpu plugin's; the load log names each split.
TEST(EmuSplitTensors, EveryArchitectureUnderA1MiBAllocationLimit) {
  if (!HaveEmuAndCpu()) GTEST_SKIP() << "needs the emu and cpu plugins";
  const std::string config = std::string(POLYCHIP_BUILD_DIR) + "/test-models/emu-1mib.yaml";
  std::filesystem::create_directories(std::filesystem::path(config).parent_path());
  std::ofstream(config) << "backend: {name: emu, params: {max_alloc_bytes: 1048576}}\n";
  for (const char* shape : {"tiny", "qwen3-tiny", "phi3-tiny", "gemma3-tiny"}) {
    SCOPED_TRACE(shape);
    const std::string model = SynthesizedModel(shape);
    const CommandResult r = ExpectCpuTokensOf("emu", model, " --config " + ShellQuote(config));
    EXPECT_NE(r.err.find("token_embd.weight"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("split by rows into"), std::string::npos) << r.err;
  }
}

// Expert tensors over the limit: qwen3moe-tiny's (8 experts, 1 MiB per tensor at F16) at 512
// KiB are cut into pieces of whole experts (3, 3 and 2, each with a zero expert) whose MOE
// launches take the routing computed on the host (transformer.cc); the greedy tokens are still
// the cpu plugin's.
TEST(EmuSplitTensors, MoeExpertsOverTheLimit) {
  if (!HaveEmuAndCpu()) GTEST_SKIP() << "needs the emu and cpu plugins";
  const std::string config = std::string(POLYCHIP_BUILD_DIR) + "/test-models/emu-512kib.yaml";
  std::filesystem::create_directories(std::filesystem::path(config).parent_path());
  std::ofstream(config) << "backend: {name: emu, params: {max_alloc_bytes: 524288}}\n";
  const CommandResult r =
      ExpectCpuTokensOf("emu", SynthesizedModel("qwen3moe-tiny"), " --config " + ShellQuote(config));
  for (const char* t : {"gate", "up", "down"}) {
    EXPECT_NE(r.err.find("blk.1.ffn_" + std::string(t) +
                         "_exps.weight (1048576 bytes) split by rows into 3 allocations"),
              std::string::npos)
        << r.err;
  }
}

// The real vocabularies at F16 on emu:0 (64 MiB largest allocation): qwen3 with Qwen's 151,936
// tokens (two 78 MB tables) and gemma3 with Gemma's 262,144 (one tied 134 MB table) run with
// the cpu plugin's greedy tokens.
TEST(EmuSplitTensors, RealVocabulariesOnEmu) {
  if (!HaveEmuAndCpu()) GTEST_SKIP() << "needs the emu and cpu plugins";
  for (const auto& [shape, vocab] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3-tiny", "qwen2"}, {"gemma3-tiny", "gemma-4"}}) {
    SCOPED_TRACE(shape);
    const std::string model = SynthesizedModel(shape, "", vocab);
    ExpectCpuTokensOf("emu", model);
  }
}

// Test names end in the plugin's name: `ctest -L model -R <name>` selects one backend.
INSTANTIATE_TEST_SUITE_P(Plugins, BackendRunTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendRunTest);  // a tree without backends

}  // namespace
}  // namespace polychip
