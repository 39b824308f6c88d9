// The constrained-decoding grammar: one internal representation for every constraint a request
// can carry. JSON Schema, json_object and regular expressions are translated to EBNF text
// (json_schema.cc, regex.cc) and every EBNF (SGLang's `ebnf`, llama.cpp's GBNF) is parsed into a
// Grammar: a context-free grammar over BYTES, not characters. Working on bytes is what lets one
// token carry several grammar symbols or half a UTF-8 character: a character class is compiled
// to the UTF-8 byte sequences of its code points, and a token is simply a run of bytes.
//
// The module is hardware- and tokenizer-agnostic: it knows a vocabulary only as the bytes of each
// token (matcher.h).
#pragma once

#include <bitset>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace polychip::grammar {

using ByteSet = std::bitset<256>;

// One symbol of an alternative.
struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  int32_t value = 0;  // kBytes: index into Grammar::byte_sets; kRule: rule id
};

// Alternatives are stored back to back in `elements`, each ended by a kEnd element, so that a
// parser position is one index (the matcher's stacks hold such indices).
struct Grammar {
  std::vector<ByteSet> byte_sets;
  std::vector<Element> elements;
  std::vector<std::vector<int32_t>> rule_alts;  // rule -> start index of each alternative
  std::vector<std::string> rule_names;
  int32_t root = 0;

  // The grammar as GBNF-like text, one rule a line (tests and error messages).
  std::string ToString() const;
};

// Parses an EBNF grammar in the syntax shared by llama.cpp's GBNF and SGLang's (xgrammar's)
// EBNF: `name ::= alternatives`, "literals" (with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes),
// [character classes] (ranges, ^ negation), ( groups ), `.` (any character), the postfixes
// * + ? {m} {m,} {m,n}, and # comments. `root` names the start rule.
StatusOr<Grammar> ParseEbnf(std::string_view text, std::string_view root = "root");

// A regular expression (the common subset of ECMAScript and PCRE: literals, escapes, ., [...]
// classes with \d \w \s, groups (...) (?:...), |, * + ? {m,n}, ^ and $ at the ends) as the body
// of an EBNF rule that matches the whole text. Backreferences and lookaround are UNIMPLEMENTED.
// `json_string`: the text is the content of a JSON string, so a quote, a backslash or a control
// character the regex allows is produced in its escaped JSON form, never raw.
StatusOr<std::string> RegexToEbnf(std::string_view regex, bool json_string = false);

struct JsonSchemaOptions {
  // An object schema without "additionalProperties" allows no other keys (as OpenAI's strict
  // mode and xgrammar do); true follows the JSON Schema default (any other key).
  bool allow_additional_properties = false;
  // Whitespace allowed between JSON tokens: one space, or one newline and at most this many
  // spaces or tabs of indentation (a bound keeps a sampling model from spending its tokens on
  // layout).
  int32_t max_whitespace = 12;
};

// A JSON Schema (the subset: type, properties, required, additionalProperties, items,
// prefixItems, minItems/maxItems, minLength/maxLength, pattern, format, enum, const,
// minimum/maximum and their exclusive forms, anyOf/oneOf, allOf of one schema, $ref to
// #/$defs, #/definitions or #) as a complete EBNF grammar with a `root` rule. A keyword that
// would constrain the output and is not implemented is an UNIMPLEMENTED error naming it.
// Numbers have at most 16 integer and 16 fraction digits (beyond what a double holds). Object
// properties come in the order the schema lists them (ordered_json keeps it).
StatusOr<std::string> JsonSchemaToEbnf(const nlohmann::ordered_json& schema,
                                       const JsonSchemaOptions& options = {});

// `bytes` as an EBNF literal ("..." with the escapes the parser reads back).
std::string EbnfLiteral(std::string_view bytes);

// The grammar with every rule name prefixed (references included), so that several grammars
// can be pasted into one without clashes.
std::string PrefixRuleNames(std::string_view ebnf, std::string_view prefix);

// Any JSON object (OpenAI's response_format json_object).
std::string JsonObjectEbnf(const JsonSchemaOptions& options = {});

}  // namespace polychip::grammar
