// The real vocabulary the tokenizer and API fuzz targets run on: the GGUF named by
// POLYCHIP_FUZZ_VOCAB, else the bundled model (models/polychip-tiny.gguf). Loaded once.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace polychip::fuzz {

inline const model::Tokenizer& FuzzTokenizer() {
  static const std::unique_ptr<model::Tokenizer> tokenizer = [] {
    const char* env = std::getenv("POLYCHIP_FUZZ_VOCAB");
    const std::string path = env && *env ? env : POLYCHIP_SOURCE_DIR "/models/polychip-tiny.gguf";
    auto file = model::GgufFile::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "fuzz: cannot open %s: %s\n", path.c_str(),
                   file.status().ToString().c_str());
      std::abort();
    }
    auto t = model::Tokenizer::FromGguf(**file);
    if (!t.ok()) {
      std::fprintf(stderr, "fuzz: no tokenizer in %s: %s\n", path.c_str(),
                   t.status().ToString().c_str());
      std::abort();
    }
    std::fprintf(stderr, "fuzz: vocabulary %s (%d tokens)\n", path.c_str(), (*t)->n_vocab());
    return std::move(*t);
  }();
  return *tokenizer;
}

}  // namespace polychip::fuzz
