// Tensor and pipeline parallelism end to end through the polychip binary on emu devices, with
// the trained tiny model (models/polychip-tiny.gguf): tp=2, pp=2 and tp=2 x pp=2 give the
// single rank's greedy tokens and perplexity (tp: with 1/tp of the weights on rank 0, the
// vocabulary tables included), with speculative decoding and with a LoRA adapter too; a bad
// device list fails before
// anything starts; a killed rank ends the job within 10 s.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/command.h"

namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf";
const std::string kText = std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.heldout.txt";

using Result = polychip::testing::CommandResult;

// Runs the binary with `args` (a shell word list), capturing stdout and stderr separately;
// `launcher` goes before the binary (e.g. mpirun and its flags).
Result Polychip(const std::string& args, const std::string& launcher = "") {
  return polychip::testing::RunCommand("timeout 120 " + launcher + " " +
                                       std::string(POLYCHIP_BINARY) + " " + args);
}

std::vector<int> Tokens(const std::string& err) {
  std::vector<int> ids;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("token ", 0) == 0) ids.push_back(std::atoi(line.c_str() + 6));
  }
  return ids;
}

double Ppl(const std::string& text) {
  const size_t at = text.find("PPL = ");
  return at == std::string::npos ? -1 : std::atof(text.c_str() + at + 6);
}

// The weights on rank 0 in MiB, from the start-up line ("..., 6.1 MiB of weights"); -1 if absent.
double WeightMib(const std::string& err) {
  const size_t at = err.find(" MiB of weights");
  if (at == std::string::npos) return -1;
  const size_t from = err.rfind(' ', at - 1);
  return std::atof(err.c_str() + from + 1);
}

// (tp, pp) layouts against the single-rank run: 2 ranks of tensor parallel, 2 pipeline
// stages, and 2 x 2 (four processes, each on its own emu device).
class Layouts : public ::testing::TestWithParam<std::pair<int, int>> {
 protected:
  static std::string Flags(int tp, int pp) {
    return " --device emu:0,1,2,3 --tp-size " + std::to_string(tp) + " --pp-size " +
           std::to_string(pp);
  }
};

TEST_P(Layouts, RunGivesTheSameGreedyTokens) {
  const auto [tp, pp] = GetParam();
  const std::string args =
      "run -m " + kModel + " -p 'And God said, Let there be light' -n 32 --print-tokens";
  Result one = Polychip(args + Flags(1, 1));
  Result many = Polychip(args + Flags(tp, pp));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_EQ(Tokens(one.err).size(), 32u) << one.err;
  EXPECT_EQ(Tokens(one.err), Tokens(many.err));
  EXPECT_EQ(one.out, many.out);
  EXPECT_NE(many.err.find("tensor parallel x" + std::to_string(tp) + ", pipeline x" +
                          std::to_string(pp)),
            std::string::npos)
      << many.err;
  EXPECT_NE(many.err.find("comm plugin 'shm'"), std::string::npos) << many.err;
  // Tensor parallel splits every matrix, the embedding and output tables by vocabulary rows
  // included: rank 0 holds 1/tp of the weights, but for the replicated norms (replicated tables
  // would add 2 MiB here).
  if (pp == 1) {
    const double one_mib = WeightMib(one.err), rank0_mib = WeightMib(many.err);
    ASSERT_GT(one_mib, 1.0) << one.err;
    EXPECT_LT(rank0_mib, one_mib / tp + 0.25) << many.err;
  }
}

// Speculative decoding across ranks: rank 0 drafts (n-gram lookup, or the model itself as its
// draft model, on rank 0's device) and every rank verifies; greedy text as one rank without it.
TEST_P(Layouts, SpeculativeRunGivesTheSameGreedyText) {
  const auto [tp, pp] = GetParam();
  // A prompt holding its continuation, so that n-gram lookup finds drafts.
  const std::string args =
      "run -m " + kModel + " -p 'In the beginning God created the heaven and the earth. In the "
      "beginning' -n 24 --temp 0";
  Result plain = Polychip(args + Flags(1, 1));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_GT(plain.out.size(), 24u);
  for (const std::string& algorithm :
       {std::string(" --speculative-algorithm ngram"), " --speculative-draft-model " + kModel}) {
    Result many = Polychip(args + Flags(tp, pp) + algorithm);
    ASSERT_EQ(many.exit_code, 0) << algorithm << "\n" << many.err;
    EXPECT_EQ(many.out, plain.out) << algorithm;
    // "speculative: ngram, k 4 | 6 verification steps, 19 draft tokens, 13 accepted ..."
    const size_t at = many.err.find("draft tokens, ");
    ASSERT_NE(at, std::string::npos) << many.err;
    EXPECT_GT(std::atoi(many.err.c_str() + at + 14), 0) << many.err;
  }
}

// A quantized KV cache (K and V of two types) split across ranks: each rank stores and reads
// its heads' blocks; the tokens are the single rank's with the same cache types.
TEST_P(Layouts, QuantizedKvCacheGivesTheSameGreedyTokens) {
  const auto [tp, pp] = GetParam();
  const std::string args = "run -m " + kModel +
                           " -p 'And God said, Let there be light' -n 24 --print-tokens"
                           " --kv-cache-dtype-k q8_0 --kv-cache-dtype-v q4_0";
  Result one = Polychip(args + Flags(1, 1));
  Result many = Polychip(args + Flags(tp, pp));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_EQ(Tokens(one.err).size(), 24u) << one.err;
  EXPECT_EQ(Tokens(one.err), Tokens(many.err)) << many.err;
}

// A LoRA adapter for the tiny model (Q8_0, so that a rank's columns of A for Wo and Wdown are
// cut from dequantized rows), synthesized once per build directory; "" if that failed.
std::string TinyAdapter() {
  const std::string out = std::string(POLYCHIP_BUILD_DIR) + "/test-data/tp-lora-q8_0.gguf";
  if (access(out.c_str(), R_OK) == 0) return out;
  std::system(("mkdir -p " + std::string(POLYCHIP_BUILD_DIR) + "/test-data").c_str());
  // Tests may run in parallel: write aside, then rename into place.
  const std::string tmp = out + ".tmp" + std::to_string(getpid());
  Result r = Polychip("gguf synth --lora-for " + kModel + " --lora-rank 8 --lora-alpha 16 "
                      "--type Q8_0 --weight-std 0.2 -q --seed 103 --out " + tmp);
  if (r.exit_code != 0 || std::rename(tmp.c_str(), out.c_str()) != 0) return "";
  return out;
}

// A LoRA adapter on every matrix (the untied output included) split as each base matrix is:
// every rank applies its share, and the tokens are the single rank's with the adapter (which
// are not the base's).
TEST_P(Layouts, LoraGivesTheSameGreedyTokens) {
  const auto [tp, pp] = GetParam();
  const std::string adapter = TinyAdapter();
  ASSERT_FALSE(adapter.empty());
  const std::string args =
      "run -m " + kModel + " -p 'And God said, Let there be light' -n 24 --print-tokens";
  const std::string lora = " --lora a=" + adapter + ":0.5";
  Result base = Polychip(args + Flags(1, 1));
  Result one = Polychip(args + lora + Flags(1, 1));
  Result many = Polychip(args + lora + Flags(tp, pp));
  ASSERT_EQ(base.exit_code, 0) << base.err;
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(many.exit_code, 0) << many.err;
  EXPECT_EQ(Tokens(one.err).size(), 24u) << one.err;
  EXPECT_NE(Tokens(one.err), Tokens(base.err));
  EXPECT_EQ(Tokens(one.err), Tokens(many.err)) << many.err;
}

TEST_P(Layouts, PerplexityWithinATenthOfAPercent) {
  const auto [tp, pp] = GetParam();
  const std::string args = "perplexity -m " + kModel + " -f " + kText + " -c 128 --chunks 4";
  Result one = Polychip(args + Flags(1, 1));
  Result many = Polychip(args + Flags(tp, pp));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(many.exit_code, 0) << many.err;
  const double p1 = Ppl(one.out + one.err), p2 = Ppl(many.out + many.err);
  ASSERT_GT(p1, 1.0) << one.out << one.err;
  EXPECT_NEAR(p2, p1, p1 * 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Dist, Layouts,
                         ::testing::Values(std::pair{2, 1}, std::pair{1, 2}, std::pair{2, 2}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.first) + "_pp" +
                                  std::to_string(info.param.second);
                         });

// `mpirun -np 2 polychip run --tp-size 2` with the mpi comm plugin (when Open MPI is here).
TEST(TensorParallel, MpirunWithTheMpiPlugin) {
  const std::string plugin = std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_comm_mpi.so";
  if (access(plugin.c_str(), R_OK) != 0) GTEST_SKIP() << "mpi comm plugin not built (no MPI)";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string args = "run -m " + kModel +
                           " -p 'And God said, Let there be light' -n 16 --print-tokens "
                           "--device emu:0,1 --tp-size ";
  Result one = Polychip(args + "1");
  Result two = Polychip(args + "2", "env POLYCHIP_COMM_BACKEND=mpi mpirun -np 2 "
                                    "--allow-run-as-root --oversubscribe -x POLYCHIP_COMM_BACKEND");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(Tokens(one.err), Tokens(two.err)) << two.err;
  EXPECT_EQ(one.out, two.out);
  EXPECT_NE(two.err.find("comm plugin 'mpi'"), std::string::npos) << two.err;
}

TEST(TensorParallel, ImpossibleDeviceListsFailWithAClearMessage) {
  // Fewer devices than ranks: refused before any rank starts.
  Result few = Polychip("run -m " + kModel + " -p hi -n 2 --device emu:0 --tp-size 2");
  EXPECT_EQ(few.exit_code, 1);
  EXPECT_NE(few.err.find("lists 1 device(s) for 2 ranks"), std::string::npos) << few.err;
  EXPECT_LT(few.seconds, 10);
  // A device that does not exist: rank 1 fails to open it, rank 0 says so.
  Result missing = Polychip("run -m " + kModel + " -p hi -n 2 --device emu:0,99 --tp-size 2");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("rank(s) 1 failed to load"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("rank 1:"), std::string::npos) << missing.err;
  EXPECT_LT(missing.seconds, 30);
}

std::vector<pid_t> Children(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> kids;
  pid_t k;
  while (in >> k) kids.push_back(k);
  return kids;
}

TEST(TensorParallel, KilledRankEndsTheJobNamingIt) {
  polychip::testing::ChildProcess rank0(
      {POLYCHIP_BINARY, "perplexity", "-m", kModel, "-f", kText, "-c", "32", "--device",
       "emu:0,1", "--tp-size", "2"},
      {.stdout_to_log = false, .alarm_seconds = 60});
  ASSERT_TRUE(rank0.running());
  // Wait until both ranks are computing.
  const auto start = Clock::now();
  while (rank0.Log().find("seconds per pass") == std::string::npos &&
         Clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<pid_t> kids = Children(rank0.pid());
  ASSERT_EQ(kids.size(), 1u) << rank0.Log();
  ASSERT_EQ(kill(kids[0], SIGKILL), 0);
  const auto killed = Clock::now();
  const std::optional<int> exit_code = rank0.Wait(15);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  const std::string err = rank0.Log();
  ASSERT_TRUE(exit_code.has_value()) << "rank 0 still running 15 s after rank 1 was killed\n"
                                     << err;
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(*exit_code, 1);
  EXPECT_NE(err.find("rank 1 (pid " + std::to_string(kids[0]) + ") died"), std::string::npos)
      << err;
}

}  // namespace
