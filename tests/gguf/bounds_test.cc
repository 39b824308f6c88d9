// Hostile GGUF metadata (issue 16): counts the file cannot back are refused before anything is
// sized by them, and values the loader replaces (an out-of-range BOS id, a chat template of no
// known format) are said in the log. Each case patches one value of the bundled model in place.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "common/command.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "test_util.h"

namespace polychip::model {
namespace {

using polychip::testing::CommandResult;
using polychip::testing::RunCommand;
using polychip::testing::ShellQuote;
using testing::Patch;
using testing::ReadAll;
using testing::TempDir;
using testing::WriteAll;

const std::string& BundledModel() {
  static const std::string bytes =
      ReadAll(std::string(POLYCHIP_SOURCE_DIR) + "/models/polychip-tiny.gguf");
  return bytes;
}

// The bundled model with the u32 value of metadata `key` replaced, written to a temp file.
std::string WithU32(std::string_view key, uint32_t value, const std::string& name) {
  std::string bytes = BundledModel();
  std::string needle(8, '\0');
  Patch<uint64_t>(needle, 0, key.size());
  needle += key;
  const size_t at = bytes.find(needle);
  EXPECT_NE(at, std::string::npos) << key;
  const size_t type_at = at + needle.size();
  uint32_t type = 0;
  std::memcpy(&type, bytes.data() + type_at, 4);
  EXPECT_EQ(type, static_cast<uint32_t>(GgufType::kU32)) << key;
  Patch<uint32_t>(bytes, type_at + 4, value);
  const std::string path = (TempDir() / name).string();
  WriteAll(path, bytes);
  return path;
}

// The CLI under a 2 GiB address-space limit, so that a regression fails fast with bad_alloc
// instead of taking the machine's memory (before the fix: 5 GB in 10 s). Sanitizer builds
// reserve terabytes of shadow memory and cannot run under the limit.
CommandResult RunCli(const std::string& args) {
#if defined(__SANITIZE_ADDRESS__)
  const std::string limit;
#else
  const std::string limit = "ulimit -v 2097152; ";
#endif
  return RunCommand(limit + std::string(POLYCHIP_BUILD_DIR) + "/bin/polychip " + args);
}

void ExpectRefused(const CommandResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_LT(r.seconds, 5.0);
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

TEST(GgufBoundsTest, BlockCountBeyondTheTensorsIsRefused) {
  for (uint32_t n : {1000000000u, 2147483647u, 10u}) {
    SCOPED_TRACE(n);
    const std::string path = WithU32("llama.block_count", n, "blocks.gguf");
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    const std::string want = "'llama.block_count' = " + std::to_string(n) + " but the file has 57 "
                             "tensors";
    EXPECT_NE(ModelConfig::FromGguf(**f).status().message().find(want), std::string::npos)
        << ModelConfig::FromGguf(**f).status().message();
    ExpectRefused(RunCli("gguf check " + path), want);
    // `gguf info` lists the file and says why the model does not load.
    CommandResult info = RunCli("gguf info " + path);
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_NE(info.out.find("model: not loadable: " + want), std::string::npos) << info.out;
  }
}

TEST(GgufBoundsTest, ZeroContextLengthIsRefused) {
  const std::string path = WithU32("llama.context_length", 0, "ctx0.gguf");
  ExpectRefused(RunCli("gguf check " + path), "hyper-parameter 'llama.context_length' is 0");
}

TEST(GgufBoundsTest, OutOfRangeBosIdIsLogged) {
  const std::string path = WithU32("tokenizer.ggml.bos_token_id", 99999, "bos.gguf");
  CommandResult r = RunCli("tokenize --ids-only -m " + path + " -p hello");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("tokenizer.ggml.bos_token_id = 99999 is outside the vocabulary (4096 "
                       "tokens)"),
            std::string::npos)
      << r.err;
}

TEST(GgufBoundsTest, UnrecognisedChatTemplateIsLogged) {
  std::string bytes = BundledModel();
  // Same length, so the file stays valid: the template no longer names any known marker.
  for (size_t at; (at = bytes.find("<|im_start|>")) != std::string::npos;) {
    bytes.replace(at, 12, "<|xx_begin|>");
  }
  const std::string path = (TempDir() / "template.gguf").string();
  WriteAll(path, bytes);
  CommandResult r = RunCli("tokenize --chat -m " + path + " -p hello");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The model's own template renders the chat, whatever markers it uses.
  EXPECT_NE(r.err.find("chat template: Jinja template from tokenizer.chat_template"),
            std::string::npos)
      << r.err;
  // The untouched model's template is recognised, silently.
  CommandResult good = RunCli("tokenize --chat -m " +
                              ShellQuote(std::string(POLYCHIP_SOURCE_DIR) +
                                         "/models/polychip-tiny.gguf") +
                              " -p hello");
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_EQ(good.err.find("no known format"), std::string::npos) << good.err;
}

}  // namespace
}  // namespace polychip::model
