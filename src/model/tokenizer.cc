#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <queue>

#include "model/tokenizer_pre.h"
#include "model/unicode.h"

namespace polychip::model {
namespace {

// Per-token attribute bits (llama.cpp's token attributes; LSTRIP/RSTRIP come from model quirks).
constexpr uint32_t kAttrNormal = 1u << 0;
constexpr uint32_t kAttrUnknown = 1u << 1;
constexpr uint32_t kAttrControl = 1u << 2;
constexpr uint32_t kAttrUserDefined = 1u << 3;
constexpr uint32_t kAttrUnused = 1u << 4;
constexpr uint32_t kAttrByte = 1u << 5;
constexpr uint32_t kAttrLstrip = 1u << 6;
constexpr uint32_t kAttrRstrip = 1u << 7;

constexpr std::string_view kSpace = " ";
constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

uint32_t AttrFromType(TokenType type) {
  switch (type) {
    case TokenType::kNormal: return kAttrNormal;
    case TokenType::kUnknown: return kAttrUnknown;
    case TokenType::kControl: return kAttrControl;
    case TokenType::kUserDefined: return kAttrUserDefined;
    case TokenType::kUnused: return kAttrUnused;
    case TokenType::kByte: return kAttrByte;
    default: return 0;
  }
}

// "<0x41>" -> 0x41; -1 if `text` is not a byte token.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string ByteTokenText(uint8_t byte) {
  static const char* kHex = "0123456789ABCDEF";
  return std::string{'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
}

// Doubly-linked symbols over one word, merged in place (the right one is absorbed by the left).
struct Symbol {
  int prev;
  int next;
  size_t start;
  size_t len;  // 0 once absorbed
};

std::vector<Symbol> SplitChars(std::string_view text) {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t len = std::min<size_t>(Utf8SeqLen(static_cast<uint8_t>(text[offset])),
                                        text.size() - offset);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, offset + len == text.size() ? -1 : index + 1, offset, len});
    offset += len;
  }
  return symbols;
}

void MergeInto(std::vector<Symbol>& symbols, int left, int right) {
  symbols[left].len += symbols[right].len;
  symbols[right].len = 0;
  symbols[left].next = symbols[right].next;
  if (symbols[right].next >= 0) symbols[symbols[right].next].prev = left;
}

}  // namespace

Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(Vocab vocab) {
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  tokenizer->vocab_ = std::move(vocab);
  PC_RETURN_IF_ERROR(tokenizer->Init());
  return tokenizer;
}

Status Tokenizer::Init() {
  Vocab& v = vocab_;
  const size_t n = v.tokens.size();
  if (n == 0) return InvalidArgument("tokenizer: the vocabulary has no tokens");
  if (!v.scores.empty() && v.scores.size() != n) {
    return InvalidArgument("tokenizer: " + std::to_string(v.scores.size()) + " scores for " +
                           std::to_string(n) + " tokens");
  }
  if (!v.types.empty() && v.types.size() != n) {
    return InvalidArgument("tokenizer: " + std::to_string(v.types.size()) + " token types for " +
                           std::to_string(n) + " tokens");
  }

  // Kind and llama.cpp's per-kind defaults (the file's own values override them below).
  TokenId def_bos = kNoToken, def_eos = kNoToken, def_unk = kNoToken;
  std::string pre = v.pre;
  if (v.model == "llama") {
    kind_ = Kind::kSpm;
    def_bos = 1, def_eos = 2, def_unk = 0;
    add_space_prefix_ = true;
    add_bos_ = true;
    escape_whitespace_ = true;
    clean_spaces_ = false;
  } else if (v.model == "gpt2" || v.model == "gemma4") {
    kind_ = Kind::kBpe;
    if (v.model == "gpt2") def_bos = def_eos = 11;
    if (v.model == "gemma4") pre = "gemma4";
    PC_ASSIGN_OR_RETURN(PreTokenizerSpec spec, LookupPreTokenizer(pre));
    for (const std::string& pattern : spec.regexes) {
      PC_ASSIGN_OR_RETURN(auto regex, Regex::Compile(pattern));
      regexes_.push_back(std::move(regex));
    }
    ignore_merges_ = spec.ignore_merges;
    clean_spaces_ = spec.clean_spaces;
    escape_whitespace_ = spec.escape_whitespace;
    byte_encode_ = spec.byte_encode;
    whole_newline_runs_ = spec.whole_newline_runs;
    add_bos_ = spec.add_bos.value_or(false);
    if (v.merges.empty()) return InvalidArgument("tokenizer: BPE vocabulary without merges");
  } else if (v.model == "bert" || v.model == "t5") {
    return Unimplemented("tokenizer model '" + v.model + "' (" +
                         (v.model == "bert" ? "WordPiece" : "Unigram") + ") is not supported");
  } else {
    return Unimplemented("unknown tokenizer model '" + v.model + "' (tokenizer.ggml.model)");
  }
  if (v.add_space_prefix) add_space_prefix_ = *v.add_space_prefix;
  if (v.add_bos) add_bos_ = *v.add_bos;
  if (v.add_eos) add_eos_ = *v.add_eos;
  if (pre == "gemma4") add_bos_ = true;  // as llama.cpp: gemma4 files may say false, wrongly

  auto pick = [n](TokenId given, TokenId fallback) {
    if (given >= 0 && static_cast<size_t>(given) < n) return given;
    if (fallback >= 0 && static_cast<size_t>(fallback) < n) return fallback;
    return kNoToken;
  };
  bos_ = pick(v.bos, def_bos);
  eos_ = pick(v.eos, def_eos);
  unk_ = pick(v.unk, def_unk);
  pad_ = pick(v.pad, kNoToken);
  eot_ = pick(v.eot, kNoToken);
  eom_ = pick(v.eom, kNoToken);

  // Token table. Empty strings would collide in the lookup; later duplicates win, as upstream.
  attrs_.assign(n, kAttrNormal);
  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (v.tokens[i].empty()) v.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";
    if (!v.types.empty()) attrs_[i] = AttrFromType(v.types[i]);
  }
  for (size_t i = 0; i < n; ++i) token_to_id_[v.tokens[i]] = static_cast<TokenId>(i);

  merge_ranks_.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    const size_t space = m.find(' ', 1);
    std::string key = space == std::string::npos
                          ? std::string(1, '\0')
                          : m.substr(0, space) + '\0' + m.substr(space + 1);
    merge_ranks_.emplace(std::move(key), static_cast<int>(i));  // the first rank wins
  }
  // The ranks hold the merges now: keeping the list too would cost ~5 MB for a 150k vocabulary.
  v.merges.clear();
  v.merges.shrink_to_fit();

  // End-of-turn tokens are recognised by their text when the file does not name them; they
  // must be control tokens whatever the file says, or they would be printed and split.
  static constexpr std::string_view kEotTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
      "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>"};
  if (eot_ == kNoToken) {
    for (std::string_view text : kEotTexts) {
      if (TokenId id = Find(text); id != kNoToken) {
        eot_ = id;
        break;
      }
    }
  }
  if (eom_ == kNoToken) eom_ = Find("<|eom_id|>");
  for (TokenId id : {eot_, eom_}) {
    if (id != kNoToken) attrs_[id] |= kAttrControl;
  }
  for (TokenId id : {eos_, eot_, eom_}) {
    if (id != kNoToken && !IsEog(id)) eog_ids_.push_back(id);
  }
  for (std::string_view text : kEotTexts) {
    const TokenId id = Find(text);
    if (id != kNoToken && !IsEog(id)) eog_ids_.push_back(id);
  }
  if (const TokenId id = Find("<|eom_id|>"); id != kNoToken && !IsEog(id)) eog_ids_.push_back(id);

  // Special tokens are matched longest first so that "<|im_start|>" is not cut by "<|im".
  for (size_t i = 0; i < n; ++i) {
    if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      special_ids_.push_back(static_cast<TokenId>(i));
    }
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [&](TokenId a, TokenId b) {
    return v.tokens[a].size() > v.tokens[b].size();
  });

  // Phi-3's special tokens swallow the whitespace after them (its HF tokenizer says rstrip).
  std::string name = v.model_name;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : special_ids_) attrs_[id] |= kAttrRstrip;
    if (TokenId id = Find("</s>"); id != kNoToken) attrs_[id] |= kAttrRstrip;
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (TokenId id = Find(text); id != kNoToken) attrs_[id] &= ~kAttrRstrip;
    }
  }

  pieces_.resize(n);
  for (size_t i = 0; i < n; ++i) pieces_[i] = ComputePiece(static_cast<TokenId>(i));
  return Status::Ok();
}

TokenId Tokenizer::Find(std::string_view text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? kNoToken : it->second;
}

bool Tokenizer::IsControl(TokenId id) const {
  return id >= 0 && id < n_vocab() && (attrs_[id] & kAttrControl);
}

bool Tokenizer::IsEog(TokenId id) const {
  return id != kNoToken && std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

// ---- encoding -------------------------------------------------------------------------------

std::vector<Tokenizer::Fragment> Tokenizer::PartitionSpecial(std::string_view text,
                                                             bool parse_special) const {
  std::vector<Fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({kNoToken, text});
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::vector<Fragment> next;
  // One special token at a time over every raw fragment (llama.cpp's order, which decides
  // between overlapping candidates).
  for (TokenId id : special_ids_) {
    const uint32_t attr = attrs_[id];
    // Control tokens only count when asked; user-defined ones always (HF "added tokens").
    if (!parse_special && (attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string& special = vocab_.tokens[id];
    bool any = false;
    for (const Fragment& f : fragments) {
      if (f.token == kNoToken && f.text.find(special) != std::string_view::npos) any = true;
    }
    if (!any) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      while (!rest.empty()) {
        const size_t hit = rest.find(special);
        if (hit == std::string_view::npos) {
          next.push_back({kNoToken, rest});
          break;
        }
        std::string_view left = rest.substr(0, hit);
        if (attr & kAttrLstrip) {
          while (!left.empty() && is_space(left.back())) left.remove_suffix(1);
        }
        if (!left.empty()) next.push_back({kNoToken, left});
        next.push_back({id, {}});
        rest = rest.substr(hit + special.size());
        if (attr & kAttrRstrip) {
          while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
        }
      }
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<TokenId> out;
  const std::vector<Fragment> fragments = PartitionSpecial(text, options.parse_special);
  if (options.add_special && add_bos_ && bos_ != kNoToken) out.push_back(bos_);
  // SPM prefixes a space to the text at the start and after each special token.
  bool prev_special = true;
  for (const Fragment& f : fragments) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (kind_ == Kind::kSpm) {
      std::string prefixed;
      if (add_space_prefix_ && prev_special) prefixed = kSpace;
      prefixed.append(f.text);
      EncodeSpm(ReplaceAll(prefixed, kSpace, kSpmSpace), out);
    } else {
      EncodeBpe(f.text, out);
    }
    prev_special = false;
  }
  if (options.add_special && add_eos_ && eos_ != kNoToken) out.push_back(eos_);
  return out;
}

TokenId Tokenizer::ByteToken(uint8_t byte) const {
  TokenId id = Find(ByteTokenText(byte));
  if (id == kNoToken) id = Find(std::string(1, static_cast<char>(byte)));
  return id == kNoToken ? unk_ : id;
}

// SentencePiece BPE: repeatedly merge the adjacent pair whose union is the highest-scoring
// token (leftmost on ties). A pair is only merged when its union is a token, so every final
// symbol is either a token or a single character, which falls back to its bytes.
void Tokenizer::EncodeSpm(std::string_view text, std::vector<TokenId>& out) const {
  struct Bigram {
    int left, right;
    float score;
    size_t len;
  };
  auto lower_priority = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower_priority)> queue(lower_priority);
  std::vector<Symbol> symbols = SplitChars(text);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view joined =
        text.substr(symbols[left].start, symbols[left].len + symbols[right].len);
    const TokenId id = Find(joined);
    if (id == kNoToken) return;
    const float score = vocab_.scores.empty() ? 0.0f : vocab_.scores[id];
    queue.push({left, right, score, joined.size()});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;  // stale
    MergeInto(symbols, b.left, b.right);
    try_add(symbols[b.left].prev, b.left);
    try_add(b.left, symbols[b.left].next);
  }
  if (symbols.empty()) return;
  for (int i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].len);
    if (const TokenId id = Find(piece); id != kNoToken) {
      out.push_back(id);
    } else {
      for (char c : piece) {
        if (const TokenId id = ByteToken(static_cast<uint8_t>(c)); id != kNoToken) out.push_back(id);
      }
    }
  }
}

int Tokenizer::MergeRank(std::string_view left, std::string_view right) const {
  thread_local std::string key;
  key.assign(left);
  key += '\0';
  key.append(right);
  auto it = merge_ranks_.find(key);
  return it == merge_ranks_.end() ? -1 : it->second;
}

void Tokenizer::EncodeBpe(std::string_view text, std::vector<TokenId>& out) const {
  std::string escaped;
  if (escape_whitespace_) {
    escaped = ReplaceAll(text, kSpace, kSpmSpace);
    text = escaped;
  }
  std::string word;
  for (std::string_view piece : SplitWithRegexes(text, regexes_)) {
    if (byte_encode_) {
      word.clear();
      for (char c : piece) word += ByteToUnicode(static_cast<uint8_t>(c));
      EncodeBpeWord(word, out);
    } else {
      EncodeBpeWord(piece, out);
    }
  }
}

// Byte-level BPE on one pre-token: merge the adjacent pair with the lowest merge rank (leftmost
// on ties) until no listed merge applies.
void Tokenizer::EncodeBpeWord(std::string_view word, std::vector<TokenId>& out) const {
  if (ignore_merges_ || (whole_newline_runs_ && word.find_first_not_of('\n') == word.npos)) {
    if (const TokenId id = Find(word); id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  struct Bigram {
    int rank;
    int left, right;
    size_t left_len, right_len;
  };
  auto lower_priority = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower_priority)> queue(lower_priority);
  std::vector<Symbol> symbols = SplitChars(word);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int rank = MergeRank(word.substr(l.start, l.len), word.substr(r.start, r.len));
    if (rank >= 0) queue.push({rank, left, right, l.len, r.len});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    // Stale if either side changed since the pair was queued (merging only grows symbols).
    if (l.len != b.left_len || r.len != b.right_len || l.next != b.right) continue;
    MergeInto(symbols, b.left, b.right);
    try_add(symbols[b.left].prev, b.left);
    try_add(b.left, symbols[b.left].next);
  }
  if (symbols.empty()) return;
  for (int i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = word.substr(symbols[i].start, symbols[i].len);
    if (const TokenId id = Find(piece); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    // Not in the vocabulary: fall back to byte tokens (skipping bytes that have none).
    for (char c : piece) {
      const TokenId id = byte_encode_ ? Find(std::string_view(&c, 1))
                                      : Find(ByteTokenText(static_cast<uint8_t>(c)));
      if (id != kNoToken) out.push_back(id);
    }
  }
}

// ---- decoding -------------------------------------------------------------------------------

std::string Tokenizer::ComputePiece(TokenId id) const {
  const uint32_t attr = attrs_[id];
  const std::string& text = vocab_.tokens[id];
  if (attr & (kAttrControl | kAttrUnknown | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    if (escape_whitespace_) return ReplaceAll(text, kSpmSpace, kSpace);
    return UnicodeToBytes(text);
  }
  if (attr & kAttrByte) {
    const int byte = ParseByteToken(text);
    if (byte >= 0) return std::string(1, static_cast<char>(byte));
    return UnicodeToBytes(text);
  }
  return {};  // unused / undefined tokens print nothing
}

const std::string& Tokenizer::Piece(TokenId id, bool render_special) const {
  static const std::string kEmpty;
  if (id < 0 || id >= n_vocab()) return kEmpty;
  if (!render_special && (attrs_[id] & (kAttrControl | kAttrUnknown))) return kEmpty;
  return pieces_[id];
}

namespace {

// HF's clean_up_tokenization_spaces, as llama.cpp applies it.
std::string CleanSpaces(const std::string& in) {
  std::string a;
  a.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {  // " ?" " !" " ." " ,"
    const char c = in[i];
    if (i > 0 && in[i - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ',')) a.pop_back();
    a += c;
  }
  std::string b;
  for (size_t i = 0; i < a.size(); ++i) {  // " ' " -> "'"
    if (a[i] == '\'' && i > 0 && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      b += '\'';
      ++i;
      continue;
    }
    b += a[i];
  }
  std::string c;
  for (size_t i = 0; i < b.size(); ++i) {  // " 's" " 'm" " 're" " 've"
    if (i > 0 && b[i - 1] == ' ' && b[i] == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      if (x1 == 's' || x1 == 'm' || (x2 == 'e' && (x1 == 'r' || x1 == 'v'))) c.pop_back();
    }
    c += b[i];
  }
  return c;
}

}  // namespace

std::string Tokenizer::Decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  bool strip_space = add_space_prefix_;  // the space SPM put in front of the text
  if (options.remove_special && add_bos_ && !ids.empty() && ids.front() == bos_) {
    strip_space = false;
    ids = ids.subspan(1);
  }
  if (options.remove_special && add_eos_ && !ids.empty() && ids.back() == eos_) {
    ids = ids.subspan(0, ids.size() - 1);
  }
  std::string text;
  for (TokenId id : ids) {
    std::string_view piece = Piece(id, options.render_special);
    if (strip_space && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
    strip_space = false;
    text.append(piece);
  }
  if (options.clean_spaces.value_or(clean_spaces_)) text = CleanSpaces(text);
  return text;
}

std::string StreamDecoder::Push(TokenId id) {
  std::string_view piece = tokenizer_.Piece(id, render_special_);
  if (strip_space_ && !piece.empty() && piece.front() == ' ') piece.remove_prefix(1);
  strip_space_ = false;
  pending_.append(piece);
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = SanitizeUtf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace polychip::model
