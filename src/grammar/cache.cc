#include "grammar/cache.h"

#include <nlohmann/json.hpp>

namespace polychip::grammar {

StatusOr<std::string> ConstraintToEbnf(ConstraintKind kind, std::string_view text,
                                       const JsonSchemaOptions& options) {
  switch (kind) {
    case ConstraintKind::kJsonObject:
      return JsonObjectEbnf(options);
    case ConstraintKind::kJsonSchema: {
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return InvalidArgument("json_schema: not valid JSON");
      return JsonSchemaToEbnf(schema, options);
    }
    case ConstraintKind::kRegex: {
      PC_ASSIGN_OR_RETURN(std::string body, RegexToEbnf(text));
      return "root ::= " + body + "\n";
    }
    case ConstraintKind::kEbnf:
      return std::string(text);
  }
  return Internal("unknown constraint kind");
}

StatusOr<std::shared_ptr<CompiledGrammar>> GrammarCache::Get(ConstraintKind kind,
                                                             std::string_view text) {
  std::string key = std::to_string(static_cast<int>(kind)) + ":";
  key += text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.grammar;
    }
  }
  // Compiled outside the lock: a large schema must not stall the other requests.
  PC_ASSIGN_OR_RETURN(std::string ebnf, ConstraintToEbnf(kind, text));
  PC_ASSIGN_OR_RETURN(Grammar g, ParseEbnf(ebnf));
  PC_ASSIGN_OR_RETURN(std::shared_ptr<CompiledGrammar> compiled,
                      CompiledGrammar::Create(std::move(g), vocab_));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.grammar;
  lru_.push_front(key);
  entries_[key] = Entry{compiled, lru_.begin()};
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace polychip::grammar
