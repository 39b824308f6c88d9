// The command line: `polychip gguf info|check|synth` and `polychip quantize` succeed on good
// input and, on bad input, exit non-zero with a one-line error on stderr.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "common/command.h"
#include "model/gguf_writer.h"
#include "test_util.h"

namespace polychip::model {
namespace {

using testing::Patch;
using testing::ReadAll;
using testing::TempDir;
using testing::VocabDir;
using testing::WriteAll;

using Result = polychip::testing::CommandResult;

Result RunCli(const std::string& args) {
  return polychip::testing::RunCommand(std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip " + args);
}

void ExpectCleanFailure(const Result& r, const std::string& fragment) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_LT(r.exit_code, 128) << "killed by a signal";
  EXPECT_EQ(r.err.rfind("polychip: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

std::string TinyF32() {
  static std::string path = [] {
    std::string p = (TempDir() / "cli-tiny.gguf").string();
    Result r = RunCli("gguf synth -q --vocab " + (VocabDir() / "ggml-vocab-llama-spm.gguf").string() +
                   " --shape tiny --type F32 --seed 3 --out " + p);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

TEST(GgufCliTest, InfoOnARealVocabulary) {
  auto vocab = VocabDir() / "ggml-vocab-qwen2.gguf";
  POLYCHIP_REQUIRE_VOCAB(vocab);
  Result r = RunCli("gguf info " + vocab.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GGUF v3"), std::string::npos);
  EXPECT_NE(r.out.find("tokenizer.ggml.pre"), std::string::npos);
  EXPECT_NE(r.out.find("array[string x 151936]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"qwen2\""), std::string::npos);
  EXPECT_LT(r.out.size(), 20000u);  // arrays are abbreviated
}

TEST(GgufCliTest, SynthQuantizeCheck) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-llama-spm.gguf");
  std::string src = TinyF32();
  Result check = RunCli("gguf check " + src);
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_NE(check.out.find("llama vocab=32000"), std::string::npos) << check.out;

  std::string q = (TempDir() / "cli-tiny-q4_0.gguf").string();
  Result quant = RunCli("quantize " + src + " " + q + " q4_0 --threads 2");
  ASSERT_EQ(quant.exit_code, 0) << quant.err;
  EXPECT_NE(quant.err.find("/21] output.weight"), std::string::npos) << quant.err;  // progress
  Result info = RunCli("gguf info --all " + q);
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("blk.1.ffn_down.weight"), std::string::npos);
  EXPECT_NE(info.out.find("Q4_0"), std::string::npos);
  EXPECT_NE(info.out.find("model: llama"), std::string::npos) << info.out;

  ExpectCleanFailure(RunCli("quantize " + src + " " + q + " Q9_9"), "unsupported type 'Q9_9'");
}

TEST(GgufCliTest, BadFilesFailWithOneLine) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-llama-spm.gguf");
  std::string good = ReadAll(TinyF32());
  auto write = [](const std::string& name, const std::string& bytes) {
    std::string p = (TempDir() / name).string();
    WriteAll(p, bytes);
    return p;
  };
  std::string truncated = write("cli-trunc.gguf", good.substr(0, good.size() * 2 / 3));
  ExpectCleanFailure(RunCli("gguf info " + truncated), "beyond the end of the file");
  ExpectCleanFailure(RunCli("gguf check " + truncated), "truncated?");
  ExpectCleanFailure(RunCli("quantize " + truncated + " " + (TempDir() / "x.gguf").string() + " Q8_0"),
                     "beyond the end of the file");
  ExpectCleanFailure(RunCli("gguf info " + write("cli-head.gguf", good.substr(0, 100))), "truncated");

  std::string magic = good;
  magic[0] = 'X';
  ExpectCleanFailure(RunCli("gguf info " + write("cli-magic.gguf", magic)), "not a GGUF file");

  std::string count = good;
  Patch<uint64_t>(count, 8, 1ull << 45);
  ExpectCleanFailure(RunCli("gguf check " + write("cli-count.gguf", count)), "absurd tensor count");

  GgufWriter w;
  w.SetString("general.architecture", "mamba");
  std::string arch = (TempDir() / "cli-arch.gguf").string();
  ASSERT_TRUE(w.Write(arch).ok());
  ExpectCleanFailure(RunCli("gguf check " + arch),
                     "unsupported architecture mamba (supported: llama, qwen2, qwen3, phi3, qwen3moe, "
                     "gemma3, mistral3)");
  ExpectCleanFailure(RunCli("gguf info /nonexistent/model.gguf"), "cannot open");
  ExpectCleanFailure(RunCli("gguf synth --vocab " + truncated + " --shape tiny --out " +
                         (TempDir() / "y.gguf").string()),
                     "beyond the end");
  ExpectCleanFailure(RunCli("gguf synth -q --vocab " + TinyF32() + " --shape huge --out " +
                         (TempDir() / "y.gguf").string()),
                     "unknown shape 'huge'");
}

}  // namespace
}  // namespace polychip::model
