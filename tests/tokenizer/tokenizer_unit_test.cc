// Tokenizer behaviour on small hand-built vocabularies, where the expected ids follow from the
// algorithm's definition (the real-vocabulary checks are in tokenizer_vectors_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "model/unicode.h"

namespace polychip::model {
namespace {

const std::string kSp = "\xE2\x96\x81";  // U+2581

// SPM: <unk> <s> </s>, the 256 byte tokens, then pieces scored so that longer ones win; the
// only merge path to "▁hello" is he + ll -> hell, + o -> hello, ▁ + hello.
Vocab SpmVocab() {
  Vocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.tokens.push_back(buf);
    v.types.push_back(TokenType::kByte);
  }
  for (const std::string& piece : {kSp, std::string("h"), std::string("e"), std::string("l"),
                                   std::string("o"), std::string("he"),
                                   std::string("ll"), std::string("hell"), std::string("hello"),
                                   kSp + "hello", std::string("<|user|>")}) {
    v.tokens.push_back(piece);
    v.types.push_back(piece == "<|user|>" ? TokenType::kUserDefined : TokenType::kNormal);
  }
  v.scores.assign(v.tokens.size(), 0.0f);
  for (size_t i = 259; i < v.tokens.size(); ++i) v.scores[i] = static_cast<float>(v.tokens[i].size());
  return v;
}

TokenId Id(const Tokenizer& t, const std::string& text) {
  const TokenId id = t.Find(text);
  EXPECT_NE(id, kNoToken) << text;
  return id;
}

TEST(SpmTokenizer, MergesByScoreAddsSpacePrefixAndBos) {
  auto t = Tokenizer::Create(SpmVocab());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.Encode("hello"), (std::vector<TokenId>{1, Id(tok, kSp + "hello")}));
  EXPECT_EQ(tok.Encode("hello hello", {.add_special = false}),
            (std::vector<TokenId>{Id(tok, kSp + "hello"), Id(tok, kSp + "hello")}));
  EXPECT_EQ(tok.Decode(tok.Encode("hello hello", {.add_special = false})), "hello hello");
}

TEST(SpmTokenizer, UnknownCharactersFallBackToBytes) {
  auto t = Tokenizer::Create(SpmVocab());
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  // "é" = C3 A9 is not a piece: two byte tokens (ids 3 + byte).
  EXPECT_EQ(tok.Encode("hé", {.add_special = false}),
            (std::vector<TokenId>{Id(tok, kSp), Id(tok, "h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.Decode(tok.Encode("hé", {.add_special = false})), "hé");
}

TEST(SpmTokenizer, UserDefinedTokensAreMatchedWholeAndControlOnlyWhenAsked) {
  auto t = Tokenizer::Create(SpmVocab());
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  const TokenId user = Id(tok, "<|user|>");
  // User-defined: always whole; the text after it gets a fresh space prefix.
  EXPECT_EQ(tok.Encode("hello<|user|>hello", {.add_special = false}),
            (std::vector<TokenId>{Id(tok, kSp + "hello"), user, Id(tok, kSp + "hello")}));
  // Control "</s>" in the text: only with parse_special.
  EXPECT_EQ(tok.Encode("</s>", {.add_special = false, .parse_special = true}),
            (std::vector<TokenId>{2}));
  const auto literal = tok.Encode("</s>", {.add_special = false, .parse_special = false});
  EXPECT_GT(literal.size(), 2u);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 2), 0);
  // Control tokens decode to nothing unless rendered.
  const std::vector<TokenId> ids = {1, Id(tok, kSp + "hello"), 2};
  EXPECT_EQ(tok.Decode(ids), " hello");  // the BOS consumed the space strip, as in llama.cpp
  EXPECT_EQ(tok.Decode(ids, {.render_special = true}), "<s> hello</s>");
}

// Byte-level BPE over the 256 GPT-2 byte symbols plus a few merges.
Vocab BpeVocab(std::vector<std::string> merges) {
  Vocab v;
  v.model = "gpt2";
  v.pre = "gpt-2";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(ByteToUnicode(static_cast<uint8_t>(b)));
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    v.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
  }
  v.tokens.push_back("<|end|>");
  v.types.assign(v.tokens.size(), TokenType::kNormal);
  v.types.back() = TokenType::kControl;
  v.merges = std::move(merges);
  return v;
}

TEST(BpeTokenizer, AppliesMergesByRank) {
  auto t = Tokenizer::Create(BpeVocab({"h e", "l l", "he ll", "hell o", "Ġ hello"}));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const Tokenizer& tok = **t;
  EXPECT_EQ(tok.Encode("hello hello"), (std::vector<TokenId>{Id(tok, "hello"), Id(tok, "Ġhello")}));
  // Rank decides: with "e l" first, "ll" can never form and neither can "hello".
  auto t2 = Tokenizer::Create(BpeVocab({"e l", "h e", "l l", "he ll", "hell o"}));
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ((*t2)->Encode("hello"),
            (std::vector<TokenId>{Id(**t2, "h"), Id(**t2, "el"), Id(**t2, "l"), Id(**t2, "o")}));
}

TEST(BpeTokenizer, ControlTokensNeedParseSpecial) {
  auto t = Tokenizer::Create(BpeVocab({"h e", "l l", "he ll", "hell o"}));
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  const TokenId end = Id(tok, "<|end|>");
  EXPECT_EQ(tok.Encode("hello<|end|>", {.parse_special = true}),
            (std::vector<TokenId>{Id(tok, "hello"), end}));
  const auto literal = tok.Encode("hello<|end|>", {.parse_special = false});
  EXPECT_EQ(std::count(literal.begin(), literal.end(), end), 0);
  EXPECT_EQ(tok.Decode(literal), "hello<|end|>");
  EXPECT_TRUE(tok.IsEog(end));
}

TEST(StreamDecoder, HoldsBackSplitMultibyteCharacters) {
  auto t = Tokenizer::Create(BpeVocab({"h e"}));
  ASSERT_TRUE(t.ok());
  const Tokenizer& tok = **t;
  // "é🦙" has no merges: one token per byte, 2 + 4 of them.
  const auto ids = tok.Encode("é🦙");
  ASSERT_EQ(ids.size(), 6u);
  StreamDecoder stream(tok);
  EXPECT_EQ(stream.Push(ids[0]), "");
  EXPECT_EQ(stream.Push(ids[1]), "é");
  EXPECT_EQ(stream.Push(ids[2]), "");
  EXPECT_EQ(stream.Push(ids[3]), "");
  EXPECT_EQ(stream.Push(ids[4]), "");
  EXPECT_EQ(stream.Push(ids[5]), "🦙");
  EXPECT_EQ(stream.Flush(), "");
  // A sequence cut short is flushed as U+FFFD, never as raw partial bytes.
  EXPECT_EQ(stream.Push(ids[2]), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
}

TEST(Unicode, CompletePrefixAndSanitize) {
  EXPECT_EQ(CompleteUtf8Prefix("ab\xC3"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xC3\xA9"), 4u);
  EXPECT_EQ(CompleteUtf8Prefix("\xF0\x9F\xA6"), 0u);
  EXPECT_EQ(CompleteUtf8Prefix("a\xFF"), 2u);  // invalid, nothing to wait for
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(UnicodeToBytes(ByteToUnicode(' ') + ByteToUnicode(0xC3) + ByteToUnicode(0xA9)),
            " \xC3\xA9");
}

TEST(Tokenizer, RejectsUnsupportedModels) {
  Vocab v = SpmVocab();
  v.model = "bert";
  auto t = Tokenizer::Create(v);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  v.model = "gpt2";
  v.pre = "no-such-pre";
  v.merges = {"h e"};
  EXPECT_EQ(Tokenizer::Create(v).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace polychip::model
