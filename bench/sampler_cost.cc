// The sampler's time per token at a real vocabulary, free and under a grammar (bench/sampler-
// cost.sh builds and runs it): where a constrained token's time goes once the device step is
// done. Random logits, a 300-token walk per case (run twice: the first warms the mask cache,
// the second is timed), no logprobs (as the server samples without them).
// usage: sampler_cost VOCAB.gguf
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/sampler.h"
#include "grammar/cache.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

using namespace polychip;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s VOCAB.gguf\n", argv[0]);
    return 2;
  }
  auto file = model::GgufFile::Open(argv[1]);
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
  auto tok = model::Tokenizer::FromGguf(**file);
  if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().ToString().c_str()), 1;
  const int n = (*tok)->n_vocab();
  std::vector<std::string> pieces(n);
  for (int i = 0; i < n; ++i) pieces[i] = (*tok)->Piece(i);
  grammar::GrammarCache cache(
      std::make_shared<grammar::TokenVocab>(std::move(pieces), std::vector<int32_t>{}));
  // bench/structured-outputs.sh's constraints: they cannot complete within the walk.
  const std::string schema =
      R"({"type":"array","minItems":1000,"items":{"type":"object","properties":{)"
      R"("id":{"type":"integer","minimum":0,"maximum":9999},"name":{"type":"string","maxLength":12},)"
      R"("tag":{"enum":["red","green","blue"]}},"required":["id","name","tag"],)"
      R"("additionalProperties":false}})";
  struct Case {
    const char* name;
    std::shared_ptr<grammar::CompiledGrammar> grammar;
  };
  std::vector<Case> cases = {{"free", nullptr}};
  for (auto [name, kind, text] :
       {std::tuple{"json_schema", grammar::ConstraintKind::kJsonSchema, schema},
        std::tuple{"regex", grammar::ConstraintKind::kRegex, std::string("([a-z]+ ){1000}")}}) {
    auto g = cache.Get(kind, text);
    if (!g.ok()) return std::fprintf(stderr, "%s\n", g.status().ToString().c_str()), 1;
    cases.push_back({name, *g});
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<std::vector<float>> rows(64, std::vector<float>(n));
  for (auto& r : rows) {
    for (float& x : r) x = normal(rng);
  }
  std::printf("| temperature | constraint | sampler ms/token |\n|---|---|---|\n");
  for (float temperature : {0.f, 1.f}) {
    for (const Case& c : cases) {
      double ms = 0;
      for (int pass = 0; pass < 2; ++pass) {
        engine::SamplingParams p;
        p.temperature = temperature;
        p.seed = 5;  // the same walk in both passes
        p.want_logprob = false;
        p.grammar = c.grammar;
        engine::Sampler s(p, n, {});
        constexpr int kTokens = 300;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kTokens; ++i) s.Sample(rows[i % rows.size()]);
        ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                 .count() /
             kTokens;
      }
      std::printf("| %g | %s | %.3f |\n", temperature, c.name, ms);
    }
  }
  return 0;
}
