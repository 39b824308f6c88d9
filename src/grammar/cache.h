// Compiled grammars per request constraint, cached by (kind, text): the agents that send a
// schema send the same one over and over, and a warm grammar also keeps its automaton and its
// per-state masks, so its requests skip the work other requests already did.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "grammar/matcher.h"
#include "util/status.h"

namespace polychip::grammar {

enum class ConstraintKind { kJsonSchema, kJsonObject, kRegex, kEbnf };

// The EBNF text of a constraint (kJsonSchema: the schema as JSON text; kJsonObject: ignored).
StatusOr<std::string> ConstraintToEbnf(ConstraintKind kind, std::string_view text,
                                       const JsonSchemaOptions& options = {});

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocab> vocab, size_t capacity = 64)
      : vocab_(std::move(vocab)), capacity_(capacity) {}

  // The compiled grammar (from the cache, or compiled now). Errors name what is wrong with the
  // constraint (INVALID_ARGUMENT) or what is not supported (UNIMPLEMENTED). Thread-safe.
  StatusOr<std::shared_ptr<CompiledGrammar>> Get(ConstraintKind kind, std::string_view text);

  const TokenVocab& vocab() const { return *vocab_; }

 private:
  std::shared_ptr<const TokenVocab> vocab_;
  size_t capacity_;
  std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<CompiledGrammar> grammar;
    std::list<std::string>::iterator lru;
  };
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace polychip::grammar
