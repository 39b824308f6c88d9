// The grammar engine on its own: EBNF, regex and JSON Schema compiled to the byte automaton,
// strings accepted and rejected, and token masks over a toy vocabulary whose tokens span
// several symbols or split UTF-8 characters.
#include "grammar/grammar.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "grammar/cache.h"
#include "grammar/matcher.h"

namespace polychip::grammar {
namespace {

using json = nlohmann::ordered_json;

// A vocabulary of every single byte plus a few multi-byte tokens (ids 256...), EOG last.
std::shared_ptr<const TokenVocab> ToyVocab(std::vector<std::string> extra = {}) {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  for (auto& e : extra) pieces.push_back(e);
  pieces.push_back("");  // EOG (a control token: no text)
  const int32_t eog = static_cast<int32_t>(pieces.size()) - 1;
  return std::make_shared<TokenVocab>(std::move(pieces), std::vector<int32_t>{eog});
}

std::shared_ptr<CompiledGrammar> Compile(ConstraintKind kind, std::string_view text,
                                         std::shared_ptr<const TokenVocab> vocab = ToyVocab()) {
  GrammarCache cache(std::move(vocab));
  auto g = cache.Get(kind, text);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : nullptr;
}

// Whole-string acceptance: every byte keeps the grammar alive and it accepts at the end.
bool Matches(CompiledGrammar& g, std::string_view s) {
  const int32_t st = g.Advance(g.initial_state(), s);
  return st != CompiledGrammar::kDead && g.IsAccepting(st);
}

bool Allowed(const TokenMask& m, int32_t t) { return (m[t >> 6] >> (t & 63)) & 1; }

TEST(Ebnf, LiteralsClassesRepetition) {
  auto g = Compile(ConstraintKind::kEbnf, R"(
    root ::= "ab" [0-9]+ ("x" | "yz")? tail
    tail ::= "!"{1,3}   # a comment
  )");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(*g, "ab1!"));
  EXPECT_TRUE(Matches(*g, "ab123yz!!!"));
  EXPECT_FALSE(Matches(*g, "ab!"));
  EXPECT_FALSE(Matches(*g, "ab1!!!!"));
  EXPECT_FALSE(Matches(*g, "ab1y!"));
  EXPECT_FALSE(Matches(*g, "ab1"));  // alive but not accepting
}

TEST(Ebnf, RecursionAndUnicodeClasses) {
  auto g = Compile(ConstraintKind::kEbnf, R"g(
root ::= list
list ::= "(" (item ("," item)*)? ")"
item ::= list | [^(),]
)g");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(*g, "()"));
  EXPECT_TRUE(Matches(*g, "(a,(b,(é,日)),c)"));
  EXPECT_FALSE(Matches(*g, "(a,(b)"));
  EXPECT_FALSE(Matches(*g, "(\xE6\x97)"));  // half a character
  // Deep nesting stays cheap: a right-recursive repetition keeps one state per depth.
  EXPECT_TRUE(Matches(*g, std::string(200, '(') + std::string(200, ')')));
}

TEST(Ebnf, Errors) {
  GrammarCache cache(ToyVocab());
  EXPECT_FALSE(cache.Get(ConstraintKind::kEbnf, "root ::= foo").ok());
  EXPECT_FALSE(cache.Get(ConstraintKind::kEbnf, "root ::= \"a").ok());
  EXPECT_FALSE(cache.Get(ConstraintKind::kEbnf, "start ::= \"a\"").ok());
  EXPECT_FALSE(cache.Get(ConstraintKind::kEbnf, "root ::= [b-a]").ok());
}

TEST(Regex, Basics) {
  auto g = Compile(ConstraintKind::kRegex, R"(^(\d{3})-[A-Z]{2,3}(\.x)?|foo.bar$)");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(*g, "123-AB"));
  EXPECT_TRUE(Matches(*g, "123-ABC.x"));
  EXPECT_TRUE(Matches(*g, "foo_bar"));
  EXPECT_FALSE(Matches(*g, "foo\nbar"));
  EXPECT_FALSE(Matches(*g, "12-AB"));
  EXPECT_FALSE(Matches(*g, "123-ABCD"));
  auto words = Compile(ConstraintKind::kRegex, R"([^\s,]+(, [\w]+)*)");
  EXPECT_TRUE(Matches(*words, "héllo, world, x_1"));
  EXPECT_FALSE(Matches(*words, "a b"));
  GrammarCache cache(ToyVocab());
  EXPECT_EQ(cache.Get(ConstraintKind::kRegex, R"((a)\1)").status().code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(cache.Get(ConstraintKind::kRegex, R"(a(?=b))").status().code(),
            StatusCode::kUnimplemented);
}

// Found by fuzz_api: the empty regex's state has no stacks (undefined behaviour in interning it,
// reported by UBSan in the asan preset). It accepts exactly the empty text.
TEST(Regex, EmptyPatternAcceptsOnlyTheEmptyText) {
  auto g = Compile(ConstraintKind::kRegex, "");
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(*g, ""));
  EXPECT_FALSE(Matches(*g, "a"));
}

TEST(JsonSchema, ObjectsArraysEnumsRefs) {
  const json schema = {
      {"type", "object"},
      {"$defs",
       {{"point",
         {{"type", "object"},
          {"properties", {{"x", {{"type", "integer"}}}, {"y", {{"type", "integer"}}}}},
          {"required", {"x", "y"}}}}}},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 5}}},
        {"kind", {{"enum", {"a", "b", 3}}}},
        {"tags", {{"type", "array"}, {"items", {{"type", "boolean"}}}, {"maxItems", 2}}},
        {"at", {{"$ref", "#/$defs/point"}}},
        {"note", {{"type", "null"}}}}},
      {"required", {"name", "kind", "at"}}};
  auto g = Compile(ConstraintKind::kJsonSchema, schema.dump());
  ASSERT_TRUE(g);
  EXPECT_TRUE(Matches(*g, R"({"name":"bob","kind":"a","at":{"x":1,"y":-2}})"));
  EXPECT_TRUE(Matches(
      *g,
      R"({ "name": "", "kind": 3, "tags": [true, false], "at": {"x": 0, "y": 0}, "note": null })"));
  EXPECT_FALSE(Matches(*g, R"({"name":"toolong","kind":"a","at":{"x":1,"y":2}})"));
  EXPECT_FALSE(Matches(*g, R"({"name":"bob","kind":"c","at":{"x":1,"y":2}})"));
  EXPECT_FALSE(Matches(*g, R"({"name":"bob","at":{"x":1,"y":2}})"));     // required
  EXPECT_FALSE(Matches(*g, R"({"name":"b","kind":"a","at":{"x":1}})"));  // nested
  EXPECT_FALSE(Matches(*g, R"({"name":"b","kind":"a","tags":[1],"at":{"x":1,"y":2}})"));
  EXPECT_FALSE(
      Matches(*g, R"({"name":"b","kind":"a","tags":[true,true,true],"at":{"x":1,"y":2}})"));
  EXPECT_FALSE(Matches(*g, R"({"name":"b","kind":"a","at":{"x":1,"y":2},"other":1})"));
}

// Layout is one space, or one line break and an indentation of at most 12: a model cannot
// spend its tokens on whitespace between keys (json_object and schemas alike).
TEST(JsonSchema, WhitespaceIsBounded) {
  const json schema = {{"type", "object"},
                       {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "string"}}}}},
                       {"required", {"a", "b"}}};
  for (auto g : {Compile(ConstraintKind::kJsonSchema, schema.dump()),
                 Compile(ConstraintKind::kJsonObject, "")}) {
    ASSERT_TRUE(g);
    EXPECT_TRUE(Matches(*g, R"({"a":1,"b":"x"})"));
    EXPECT_TRUE(Matches(*g, R"({ "a" : 1, "b": "x" })"));
    EXPECT_TRUE(Matches(*g, "{\n  \"a\": 1,\n  \"b\": \"x\"\n}"));
    EXPECT_TRUE(Matches(*g, "{\n\t\"a\": 1,\n\t\"b\": \"x\"\n}"));
    EXPECT_FALSE(Matches(*g, "{\n\t\n\t\"a\": 1, \"b\": \"x\"}"));  // two line breaks
    EXPECT_FALSE(Matches(*g, "{  \"a\": 1, \"b\": \"x\"}"));        // two spaces
    EXPECT_FALSE(Matches(*g, "{\n" + std::string(13, '\t') + "\"a\": 1, \"b\": \"x\"}"));
    // A run of layout dies inside the grammar, whatever comes after it.
    EXPECT_EQ(g->Advance(g->initial_state(), "{\n\t\t\t\t\n"), CompiledGrammar::kDead);
  }
}

TEST(JsonSchema, NumbersStringsFormats) {
  auto ints = Compile(ConstraintKind::kJsonSchema,
                      R"({"type":"integer","minimum":-15,"exclusiveMaximum":120})");
  for (int v = -30; v <= 150; ++v) {
    EXPECT_EQ(Matches(*ints, std::to_string(v)), v >= -15 && v < 120) << v;
  }
  EXPECT_FALSE(Matches(*ints, "007"));
  auto nums = Compile(ConstraintKind::kJsonSchema, R"({"type":"number","minimum":-2,"maximum":3})");
  EXPECT_TRUE(Matches(*nums, "2.75"));
  EXPECT_TRUE(Matches(*nums, "-1.5"));
  EXPECT_TRUE(Matches(*nums, "3"));
  EXPECT_FALSE(Matches(*nums, "3.5"));
  EXPECT_FALSE(Matches(*nums, "-2.5"));
  auto any_num = Compile(ConstraintKind::kJsonSchema, R"({"type":"number"})");
  EXPECT_TRUE(Matches(*any_num, "-0.5e+10"));
  EXPECT_FALSE(Matches(*any_num, "01"));
  auto str =
      Compile(ConstraintKind::kJsonSchema, R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(Matches(*str, R"("ab")"));
  EXPECT_TRUE(Matches(*str, R"("\"é\n")"));  // lengths in characters, escapes are one
  EXPECT_FALSE(Matches(*str, R"("a")"));
  EXPECT_FALSE(Matches(*str, R"("abcd")"));
  auto pat = Compile(ConstraintKind::kJsonSchema, R"({"type":"string","pattern":"^[a-z]+-.$"})");
  EXPECT_TRUE(Matches(*pat, R"("ab-x")"));
  EXPECT_TRUE(Matches(*pat, R"("ab-\"")"));  // '.' may be a quote, escaped
  EXPECT_FALSE(Matches(*pat, R"("ab-"")"));
  auto date = Compile(ConstraintKind::kJsonSchema, R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(Matches(*date, R"("2026-12-01T09:30:00Z")"));
  EXPECT_FALSE(Matches(*date, R"("2026-13-01T09:30:00Z")"));
  auto uuid = Compile(ConstraintKind::kJsonSchema, R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(Matches(*uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  auto either = Compile(
      ConstraintKind::kJsonSchema,
      R"({"anyOf":[{"type":"string","const":"x"},{"type":"array","items":{"type":"integer"},"minItems":1}]})");
  EXPECT_TRUE(Matches(*either, R"("x")"));
  EXPECT_TRUE(Matches(*either, "[1, 2]"));
  EXPECT_FALSE(Matches(*either, "[]"));
}

TEST(JsonSchema, RecursiveRefAndJsonObject) {
  auto tree = Compile(ConstraintKind::kJsonSchema, R"({
    "type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#"}}},"required":["v"]})");
  EXPECT_TRUE(Matches(*tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(Matches(*tree, R"({"v":1,"kids":[{"w":2}]})"));
  auto obj = Compile(ConstraintKind::kJsonObject, "");
  EXPECT_TRUE(Matches(*obj, R"({"a": [1, {"b": null}], "c": "d\u00e9"})"));
  EXPECT_FALSE(Matches(*obj, "[1]"));
  EXPECT_FALSE(Matches(*obj, R"({"a": tru})"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  GrammarCache cache(ToyVocab());
  auto r = cache.Get(ConstraintKind::kJsonSchema, R"({"type":"integer","multipleOf":3})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("multipleOf"), std::string::npos);
  EXPECT_FALSE(cache.Get(ConstraintKind::kJsonSchema, "{not json").ok());
  EXPECT_FALSE(cache.Get(ConstraintKind::kJsonSchema, R"({"$ref":"#/$defs/none"})").ok());
}

TEST(Mask, MultiSymbolTokensAndPartialUtf8) {
  // Extra tokens: a token spanning a key, quote and colon; the first two bytes of "é" (C3 A9)
  // split as C3 | A9; a token that is right only up to its middle.
  auto vocab = ToyVocab({"{\"a\":", "\xC3", "\xA9", "\"}", "x\x01", " \"a\""});
  const int32_t kKey = 256, kLead = 257, kTrail = 258, kClose = 259, kBad = 260, kSpaceKey = 261;
  const int32_t eog = vocab->size() - 1;
  auto g =
      Compile(ConstraintKind::kJsonSchema,
              R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})", vocab);
  Matcher m(g);
  auto mask = g->Mask(m.state());
  EXPECT_TRUE(Allowed(*mask, kKey));
  EXPECT_TRUE(Allowed(*mask, '{'));
  EXPECT_FALSE(Allowed(*mask, '"'));
  EXPECT_FALSE(Allowed(*mask, eog));
  ASSERT_TRUE(m.Accept(kKey));
  ASSERT_TRUE(m.Accept('"'));
  mask = g->Mask(m.state());
  EXPECT_TRUE(Allowed(*mask, kLead));    // may start a two-byte character
  EXPECT_FALSE(Allowed(*mask, kTrail));  // a continuation byte cannot start one
  EXPECT_TRUE(Allowed(*mask, kClose));
  EXPECT_FALSE(Allowed(*mask, kBad));
  ASSERT_TRUE(m.Accept(kLead));
  mask = g->Mask(m.state());
  EXPECT_TRUE(Allowed(*mask, kTrail));
  EXPECT_FALSE(Allowed(*mask, 'a'));
  EXPECT_FALSE(Allowed(*mask, kClose));
  ASSERT_TRUE(m.Accept(kTrail));
  EXPECT_FALSE(m.Accept(kSpaceKey));
  ASSERT_TRUE(m.Accept(kClose));
  mask = g->Mask(m.state());
  EXPECT_TRUE(Allowed(*mask, eog));  // the document is complete: only the end
  for (int t = 0; t < eog; ++t) EXPECT_FALSE(Allowed(*mask, t)) << t;
  EXPECT_TRUE(m.Accept(eog));
  EXPECT_TRUE(m.finished());
}

TEST(Mask, ApplyMaskMatchesAccept) {
  // Every token the mask allows is accepted and every other one refused, at each step of a
  // walk through a document.
  auto vocab = ToyVocab({"true", "tr", "ue,", "[1", ", 2", "]", "\"x\"", "nul", "l]"});
  auto g = Compile(
      ConstraintKind::kJsonSchema,
      R"({"type":"array","items":{"anyOf":[{"type":"integer"},{"type":"boolean"},{"type":"null"}]}})",
      vocab);
  const std::vector<int32_t> walk = {259, 260, ',', ' ', 256, ',', 257, 258, ' ', 263, 264};
  Matcher m(g);
  for (int32_t next : walk) {
    std::vector<float> logits(vocab->size(), 0.f);
    m.ApplyMask(logits);
    for (int32_t t = 0; t < vocab->size(); ++t) {
      Matcher probe = m;
      EXPECT_EQ(logits[t] == 0.f, probe.Accept(t)) << "token " << t << " before " << next;
    }
    ASSERT_TRUE(m.Accept(next)) << next;
  }
  EXPECT_TRUE(m.CanEnd());
}

TEST(Mask, ArgMaxAllowedIsTheArgMaxOfTheMaskedRow) {
  // Random logits at every step of a walk (ties included): the greedy fast path picks what
  // ApplyMask followed by an argmax (lowest id among equals) picks.
  auto vocab = ToyVocab({"true", "tr", "ue,", "[1", ", 2", "]", "\"x\"", "nul", "l]"});
  auto g = Compile(
      ConstraintKind::kJsonSchema,
      R"({"type":"array","items":{"anyOf":[{"type":"integer"},{"type":"boolean"},{"type":"null"}]}})",
      vocab);
  const std::vector<int32_t> walk = {259, 260, ',', ' ', 256, ',', 257, 258, ' ', 263, 264};
  Matcher m(g);
  uint32_t rng = 12345;
  for (int32_t next : walk) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> logits(vocab->size());
      for (float& x : logits) {
        rng = rng * 1664525u + 1013904223u;
        x = static_cast<float>((rng >> 24) % 8);  // few values: many ties
      }
      std::vector<float> masked = logits;
      m.ApplyMask(masked);
      const auto best = std::max_element(masked.begin(), masked.end());
      ASSERT_NE(*best, -std::numeric_limits<float>::infinity());
      EXPECT_EQ(m.ArgMaxAllowed(logits), best - masked.begin()) << "before " << next;
    }
    ASSERT_TRUE(m.Accept(next)) << next;
  }
}

TEST(Cache, SameTextSameGrammar) {
  GrammarCache cache(ToyVocab(), 2);
  auto a = cache.Get(ConstraintKind::kRegex, "a+");
  auto b = cache.Get(ConstraintKind::kRegex, "a+");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  auto c = cache.Get(ConstraintKind::kEbnf, "root ::= \"a\"+");
  EXPECT_NE(a->get(), c->get());
}

}  // namespace
}  // namespace polychip::grammar
