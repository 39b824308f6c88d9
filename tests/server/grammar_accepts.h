// Whether an EBNF grammar (our grammar engine, over a vocabulary of the 256 bytes) accepts a
// whole text: how the tool tests check a forcing grammar without a model.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "grammar/cache.h"

namespace polychip::server::testing {

inline bool GrammarAccepts(const std::string& ebnf, const std::string& text) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  grammar::GrammarCache cache(std::make_shared<grammar::TokenVocab>(bytes, std::vector<int32_t>{}));
  auto g = cache.Get(grammar::ConstraintKind::kEbnf, ebnf);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << ebnf;
  if (!g.ok()) return false;
  const int32_t st = (*g)->Advance(0, text);
  return st >= 0 && (*g)->IsAccepting(st);
}

}  // namespace polychip::server::testing
