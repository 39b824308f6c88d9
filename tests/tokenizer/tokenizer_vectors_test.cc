// llama.cpp's tokenizer test vectors: for every vocabulary GGUF shipped with node-llama-cpp that
// has `.inp`/`.out` files, every case must tokenize to exactly the expected ids. The vectors
// were produced like llama.cpp's tests/test-tokenizer-0.cpp does: no BOS/EOS (add_special =
// false) and no parsing of control tokens in the text (parse_special = false).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace polychip::model {
namespace {

namespace fs = std::filesystem;

fs::path ModelsDir() {
  const char* env = std::getenv("POLYCHIP_LLAMA_CPP_DIR");
  return fs::path(env && *env ? env : "/root/.cache/polychip/llama.cpp") / "models";
}

constexpr const char* kHowToFetch =
    "tokenizer test vectors not found. They ship with the npm package node-llama-cpp@3.21.1 "
    "(llama.cpp's source as a git bundle); run tests/setup/setup-test-deps.sh (or `make "
    "test-setup`), or point POLYCHIP_LLAMA_CPP_DIR at a llama.cpp checkout whose models/ holds "
    "ggml-vocab-*.gguf(.inp/.out).";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<TokenId> ids;
};

// Same splitting as test-tokenizer-0.cpp: inputs separated by "\n__ggml_vocab_test__\n", one
// output line of space-separated ids per input.
std::vector<Case> ReadCases(const fs::path& vocab) {
  const std::string raw = ReadFile(vocab.string() + ".inp");
  std::vector<std::string> inputs;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(vocab.string() + ".out");
  std::vector<Case> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    Case c;
    if (i < inputs.size()) c.text = inputs[i];
    std::istringstream ids(line);
    for (long id; ids >> id;) c.ids.push_back(static_cast<TokenId>(id));
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(inputs.size(), cases.size()) << "input/output case count differs for " << vocab;
  return cases;
}

std::string Show(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) s += std::to_string(id) + " ";
  return s;
}

// Vocabularies whose tokenizer model we deliberately do not implement.
bool Unsupported(const std::string& name) {
  return name == "ggml-vocab-bert-bge.gguf";  // WordPiece
}

std::vector<std::string> VocabsWithVectors() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ModelsDir(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ggml-vocab-", 0) == 0 && entry.path().extension() == ".gguf" &&
        fs::exists(entry.path().string() + ".inp") && fs::exists(entry.path().string() + ".out") &&
        !Unsupported(name)) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto file = GgufFile::Open((ModelsDir() / name).string());
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return nullptr;
  auto tokenizer = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  if (!tokenizer.ok()) return nullptr;
  return std::move(tokenizer).value();
}

TEST(TokenizerVectors, RequiredVocabsPresent) {
  const auto names = VocabsWithVectors();
  for (const char* required : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf",
                               "ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf",
                               "ggml-vocab-phi-3.gguf"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), required), names.end())
        << required << " missing from " << ModelsDir() << ": " << kHowToFetch;
  }
}

class VocabVectors : public testing::TestWithParam<std::string> {};

TEST_P(VocabVectors, EveryCaseMatches) {
  auto tokenizer = Load(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  const auto cases = ReadCases(ModelsDir() / GetParam());
  ASSERT_FALSE(cases.empty());
  int failures = 0;
  for (const Case& c : cases) {
    const auto got = tokenizer->Encode(c.text, {.add_special = false, .parse_special = false});
    if (got != c.ids) {
      ++failures;
      ADD_FAILURE() << GetParam() << ": '" << c.text << "'\n  expected: " << Show(c.ids)
                    << "\n  got:      " << Show(got);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size() << " cases";
}

// Without clean-up of spaces, decoding what we encoded gives the text back (the space SPM puts
// in front is taken off again, as llama.cpp's detokenizer does when no BOS leads).
TEST_P(VocabVectors, RoundTrip) {
  auto tokenizer = Load(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  for (const Case& c : ReadCases(ModelsDir() / GetParam())) {
    const auto ids = tokenizer->Encode(c.text, {.add_special = false});
    EXPECT_EQ(tokenizer->Decode(ids, {.clean_spaces = false}), c.text)
        << GetParam() << ": ids " << Show(ids);
    // add_special only adds BOS/EOS around the same ids, as the vocabulary's flags say.
    std::vector<TokenId> expected;
    if (tokenizer->add_bos() && tokenizer->bos() != kNoToken) expected.push_back(tokenizer->bos());
    expected.insert(expected.end(), ids.begin(), ids.end());
    if (tokenizer->add_eos() && tokenizer->eos() != kNoToken) expected.push_back(tokenizer->eos());
    EXPECT_EQ(tokenizer->Encode(c.text, {.add_special = true}), expected);
  }
}

// The streaming decoder, fed one token at a time, yields the same text, and every chunk it
// yields is valid UTF-8 on its own (nothing split inside a character).
TEST_P(VocabVectors, StreamingDecodeMatchesAndStaysValid) {
  auto tokenizer = Load(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  for (const Case& c : ReadCases(ModelsDir() / GetParam())) {
    const auto ids = tokenizer->Encode(c.text, {.add_special = false});
    StreamDecoder stream(*tokenizer, /*render_special=*/false, /*strip_leading_space=*/true);
    std::string joined;
    for (TokenId id : ids) {
      std::string chunk = stream.Push(id);
      EXPECT_EQ(chunk, SanitizeUtf8(chunk)) << "chunk is not valid UTF-8";
      joined += chunk;
    }
    joined += stream.Flush();
    EXPECT_EQ(joined, tokenizer->Decode(ids, {.clean_spaces = false}));
  }
}

// Long inputs (many pre-tokens, long merge chains) encode completely; speed is printed for
// information only (benchmarks are scripts, never timed tests).
TEST_P(VocabVectors, EncodesLongText) {
  auto tokenizer = Load(GetParam());
  ASSERT_NE(tokenizer, nullptr);
  std::string text;
  for (const Case& c : ReadCases(ModelsDir() / GetParam())) text += c.text + "\n";
  while (text.size() < 20000) text += text;
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tokenizer->Encode(text);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ timing ] %s: %zu bytes -> %zu tokens in %.2f ms\n", GetParam().c_str(),
              text.size(), ids.size(), ms);
  EXPECT_GT(ids.size(), 3000u);
}

// Chat markers written in a prompt become single control tokens with parse_special, and stay
// plain text without it; the chat template picked from the file's metadata produces them.
TEST(TokenizerSpecial, ChatMarkersOfRealVocabularies) {
  struct Expect {
    const char* vocab;
    const char* marker;
    ChatFormat format;
    int count;         // occurrences of the marker in a one-message prompt
    bool round_trips;  // phi-3's specials strip the whitespace after them (rstrip), as in HF
  };
  for (const Expect& e :
       {Expect{"ggml-vocab-qwen2.gguf", "<|im_start|>", ChatFormat::kChatMl, 2, true},
        Expect{"ggml-vocab-phi-3.gguf", "<|user|>", ChatFormat::kPhi3, 1, false}}) {
    if (!fs::exists(ModelsDir() / e.vocab)) GTEST_SKIP() << kHowToFetch;
    auto tokenizer = Load(e.vocab);
    ASSERT_NE(tokenizer, nullptr);
    const TokenId marker = tokenizer->Find(e.marker);
    ASSERT_NE(marker, kNoToken) << e.marker;
    const ChatFormat format = DetectChatFormat(tokenizer->vocab().chat_template);
    EXPECT_EQ(format, e.format) << e.vocab;
    const std::vector<ChatMessage> chat = {{"user", "Hi"}};
    const std::string prompt = ApplyChatTemplate(format, chat, true);
    const auto ids = tokenizer->Encode(prompt, {.add_special = false, .parse_special = true});
    EXPECT_EQ(std::count(ids.begin(), ids.end(), marker), e.count) << e.vocab << ": " << Show(ids);
    if (e.round_trips) {
      EXPECT_EQ(tokenizer->Decode(ids, {.render_special = true, .clean_spaces = false}), prompt);
    }
    const auto plain = tokenizer->Encode(prompt, {.add_special = false, .parse_special = false});
    if (tokenizer->IsControl(marker)) {
      EXPECT_EQ(std::count(plain.begin(), plain.end(), marker), 0) << e.vocab;
    }
  }
}

// The families of real chat templates (llama.cpp's models/templates, the files' Jinja): Qwen3's
// reasoning template is told apart from Qwen2.5's plain ChatML by its <think> handling.
TEST(ChatTemplateFiles, DetectsRealTemplates) {
  struct Expect {
    const char* file;
    ChatFormat format;
  };
  for (const Expect& e : {Expect{"Qwen-Qwen3-0.6B.jinja", ChatFormat::kQwen3},
                          Expect{"Qwen-Qwen2.5-7B-Instruct.jinja", ChatFormat::kChatMl},
                          Expect{"microsoft-Phi-3.5-mini-instruct.jinja", ChatFormat::kPhi3},
                          Expect{"google-gemma-2-2b-it.jinja", ChatFormat::kGemma}}) {
    const fs::path path = ModelsDir() / "templates" / e.file;
    if (!fs::exists(path)) GTEST_SKIP() << kHowToFetch;
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(DetectChatFormat(text.str()), e.format) << e.file;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabVectors, testing::ValuesIn(VocabsWithVectors()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(strlen("ggml-vocab-"));
                           name = name.substr(0, name.size() - strlen(".gguf"));
                           for (char& ch : name) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(VocabVectors);

}  // namespace
}  // namespace polychip::model
