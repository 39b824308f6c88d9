// Pre-tokenizers of byte-level BPE vocabularies, selected by `tokenizer.ggml.pre`. The regexes
// are the `Split` patterns of each model's HF tokenizer.json (case-insensitive contractions are
// spelled out as [sS] etc., since (?i) would also fold non-ASCII letters such as U+017F).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace polychip::model {

struct PreTokenizerSpec {
  std::vector<std::string> regexes;  // applied in turn, each splitting the previous pieces
  bool ignore_merges = false;        // a piece that is itself a token is emitted unmerged
  bool clean_spaces = true;          // decode: " ," -> "," (HF clean_up_tokenization_spaces)
  std::optional<bool> add_bos;       // default add_bos before the file's own flag
  bool escape_whitespace = false;    // spaces become U+2581 before splitting (gemma4)
  bool byte_encode = true;           // GPT-2 byte<->unicode mapping
  bool whole_newline_runs = false;   // a run of '\n' that is a token is emitted whole (gemma4)
};

// NotFound for an unknown name; "" and "default" give the generic default.
StatusOr<PreTokenizerSpec> LookupPreTokenizer(std::string_view pre);

}  // namespace polychip::model
