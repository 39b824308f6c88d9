// Tokenizers built from GGUF metadata, with the semantics of llama.cpp (the reference):
//   - SentencePiece-style (`tokenizer.ggml.model = llama`): score-driven merging of adjacent
//     pieces, spaces as U+2581, optional space prefix, byte fallback to <0xXX> tokens;
//   - byte-level BPE (`gpt2`, and `gemma4`'s raw-UTF-8 variant): a pre-tokenizer regex set
//     chosen by `tokenizer.ggml.pre`, then merges applied by rank.
// Special (control / user-defined) tokens written in the text are matched as whole tokens
// before either algorithm runs. WordPiece (`bert`) and Unigram (`t5`) are not supported.
//
// A Tokenizer is immutable after Create and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util/status.h"

namespace polychip::model {

class GgufFile;
class Regex;

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// Token types as stored in `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// Everything a tokenizer needs, independent of the file format.
struct Vocab {
  std::string model;  // tokenizer.ggml.model: "llama", "gpt2", "gemma4", ...
  std::string pre;    // tokenizer.ggml.pre: "llama-bpe", "qwen2", "gpt-2", ... ("" = default)
  std::vector<std::string> tokens;
  std::vector<float> scores;       // empty, or one per token (SPM merge priority)
  std::vector<TokenType> types;    // empty (all normal), or one per token
  std::vector<std::string> merges; // BPE merges "left right", rank = index (emptied in a
                                   // built Tokenizer's vocab(): it keeps them as ranks)

  // Special token ids (kNoToken = absent). When a loader leaves them at kNoToken the tokenizer
  // applies llama.cpp's per-model defaults.
  TokenId bos = kNoToken;
  TokenId eos = kNoToken;
  TokenId eot = kNoToken;
  TokenId eom = kNoToken;
  TokenId unk = kNoToken;
  TokenId pad = kNoToken;
  TokenId sep = kNoToken;

  // Flags; nullopt = the model kind's default.
  std::optional<bool> add_bos;
  std::optional<bool> add_eos;
  std::optional<bool> add_space_prefix;

  std::string model_name;     // general.name (a few models get per-token strip rules)
  std::string chat_template;  // tokenizer.chat_template, may be empty
  // Named variants, tokenizer.chat_template.<name> (e.g. "tool_use"), in file order.
  std::vector<std::pair<std::string, std::string>> named_chat_templates;
};

// Reads the `tokenizer.*` keys of a GGUF file.
StatusOr<Vocab> LoadVocabFromGguf(const GgufFile& file);

struct EncodeOptions {
  bool add_special = true;     // BOS/EOS as the vocabulary's add_bos/add_eos say
  bool parse_special = false;  // match control tokens written in the text ("<|im_end|>")
};

struct DecodeOptions {
  bool remove_special = false;         // drop a leading BOS / trailing EOS that encode added
  bool render_special = false;         // print control tokens' text instead of nothing
  std::optional<bool> clean_spaces;    // " ," -> "," etc.; nullopt = the vocabulary's default
};

class Tokenizer {
 public:
  enum class Kind { kSpm, kBpe };

  static StatusOr<std::unique_ptr<Tokenizer>> Create(Vocab vocab);
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  ~Tokenizer();

  std::vector<TokenId> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  std::string Decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;
  // The bytes token `id` stands for ("" for control tokens unless render_special). A single
  // piece may be an incomplete UTF-8 sequence; see StreamDecoder.
  const std::string& Piece(TokenId id, bool render_special = false) const;

  Kind kind() const { return kind_; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  const Vocab& vocab() const { return vocab_; }
  const std::string& TokenText(TokenId id) const { return vocab_.tokens[id]; }
  TokenId Find(std::string_view text) const;  // kNoToken if absent

  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  TokenId eot() const { return eot_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  bool IsControl(TokenId id) const;
  // End of generation: EOS, EOT, EOM and the end-of-turn tokens of the common chat formats.
  bool IsEog(TokenId id) const;
  const std::vector<TokenId>& eog_ids() const { return eog_ids_; }

 private:
  struct Fragment {
    TokenId token;          // kNoToken for raw text
    std::string_view text;  // raw text (when token == kNoToken)
  };

  Tokenizer() = default;
  Status Init();
  std::vector<Fragment> PartitionSpecial(std::string_view text, bool parse_special) const;
  void EncodeSpm(std::string_view text, std::vector<TokenId>& out) const;
  void EncodeBpe(std::string_view text, std::vector<TokenId>& out) const;
  void EncodeBpeWord(std::string_view word, std::vector<TokenId>& out) const;
  TokenId ByteToken(uint8_t byte) const;
  std::string ComputePiece(TokenId id) const;
  int MergeRank(std::string_view left, std::string_view right) const;

  Vocab vocab_;
  Kind kind_ = Kind::kSpm;
  std::vector<uint32_t> attrs_;  // kAttr* bits per token
  std::unordered_map<std::string_view, TokenId> token_to_id_;
  std::unordered_map<std::string, int> merge_ranks_;  // key: left + '\0' + right
  std::vector<TokenId> special_ids_;                  // partition order: longest text first
  std::vector<std::string> pieces_;                   // decoded bytes per token
  std::vector<TokenId> eog_ids_;
  std::vector<std::unique_ptr<Regex>> regexes_;       // pre-tokenizer (BPE only)

  TokenId bos_ = kNoToken, eos_ = kNoToken, eot_ = kNoToken, eom_ = kNoToken;
  TokenId unk_ = kNoToken, pad_ = kNoToken;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
  bool escape_whitespace_ = false;  // spaces <-> U+2581 (SPM, gemma4)
  bool byte_encode_ = true;         // GPT-2 byte<->unicode mapping (BPE)
  bool ignore_merges_ = false;      // a pre-token that is a whole token skips merging
  bool whole_newline_runs_ = false; // gemma4: a run of newlines that is a token stays whole
  bool clean_spaces_ = false;
};

// Turns a stream of generated tokens into text that is always valid UTF-8: a multibyte
// character split across tokens is held back until its last byte arrives.
class StreamDecoder {
 public:
  // `strip_leading_space`: drop the space an SPM tokenizer put in front of the text, as Decode
  // does, when the stream starts at the beginning of an encoded text (not for generations).
  explicit StreamDecoder(const Tokenizer& tokenizer, bool render_special = false,
                         bool strip_leading_space = false)
      : tokenizer_(tokenizer),
        render_special_(render_special),
        strip_space_(strip_leading_space && tokenizer.add_space_prefix()) {}

  // Returns the text that became complete with this token (may be empty).
  std::string Push(TokenId id);
  // Returns whatever is still held (an unfinished sequence becomes U+FFFD) and resets.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool render_special_;
  bool strip_space_;
  std::string pending_;
};

}  // namespace polychip::model
