// Vocab from the `tokenizer.*` metadata of a GGUF file (keys as written by llama.cpp's
// convert_hf_to_gguf.py).
#include <cstdint>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace polychip::model {
namespace {

// A special-token id key, or kNoToken when absent or not an integer.
TokenId OptionalId(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr || !IsGgufIntegerType(v->type)) return kNoToken;
  if (v->i < 0 || v->i > INT32_MAX) return kNoToken;
  return static_cast<TokenId>(v->i);
}

std::optional<bool> OptionalBool(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr || v->type != GgufType::kBool) return std::nullopt;
  return v->u != 0;
}

}  // namespace

StatusOr<Vocab> LoadVocabFromGguf(const GgufFile& file) {
  Vocab vocab;
  PC_ASSIGN_OR_RETURN(vocab.model, file.GetString("tokenizer.ggml.model"));
  vocab.pre = file.GetString("tokenizer.ggml.pre", "");
  PC_ASSIGN_OR_RETURN(const std::vector<std::string_view>* tokens,
                      file.GetStringArrayView("tokenizer.ggml.tokens"));
  vocab.tokens.assign(tokens->begin(), tokens->end());
  const size_t n = vocab.tokens.size();

  if (file.Has("tokenizer.ggml.scores")) {
    PC_ASSIGN_OR_RETURN(vocab.scores, file.GetF32Array("tokenizer.ggml.scores"));
    if (vocab.scores.size() < n) {
      return InvalidArgument(file.path() + ": tokenizer.ggml.scores has " +
                             std::to_string(vocab.scores.size()) + " entries for " +
                             std::to_string(n) + " tokens");
    }
    vocab.scores.resize(n);
  }
  if (file.Has("tokenizer.ggml.token_type")) {
    PC_ASSIGN_OR_RETURN(std::vector<int32_t> types, file.GetI32Array("tokenizer.ggml.token_type"));
    if (types.size() < n) {
      return InvalidArgument(file.path() + ": tokenizer.ggml.token_type has " +
                             std::to_string(types.size()) + " entries for " + std::to_string(n) +
                             " tokens");
    }
    vocab.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      vocab.types[i] = types[i] >= 0 && types[i] <= 6 ? static_cast<TokenType>(types[i])
                                                      : TokenType::kUndefined;
    }
  }
  if (file.Has("tokenizer.ggml.merges")) {
    PC_ASSIGN_OR_RETURN(const std::vector<std::string_view>* merges,
                        file.GetStringArrayView("tokenizer.ggml.merges"));
    vocab.merges.assign(merges->begin(), merges->end());
  }

  vocab.bos = OptionalId(file, "tokenizer.ggml.bos_token_id");
  vocab.eos = OptionalId(file, "tokenizer.ggml.eos_token_id");
  vocab.eot = OptionalId(file, "tokenizer.ggml.eot_token_id");
  vocab.eom = OptionalId(file, "tokenizer.ggml.eom_token_id");
  vocab.unk = OptionalId(file, "tokenizer.ggml.unknown_token_id");
  vocab.pad = OptionalId(file, "tokenizer.ggml.padding_token_id");
  vocab.sep = OptionalId(file, "tokenizer.ggml.seperator_token_id");  // sic, as in GGUF
  vocab.add_bos = OptionalBool(file, "tokenizer.ggml.add_bos_token");
  vocab.add_eos = OptionalBool(file, "tokenizer.ggml.add_eos_token");
  vocab.add_space_prefix = OptionalBool(file, "tokenizer.ggml.add_space_prefix");
  vocab.model_name = file.GetString("general.name", "");
  vocab.chat_template = file.GetString("tokenizer.chat_template", "");
  return vocab;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  PC_ASSIGN_OR_RETURN(Vocab vocab, LoadVocabFromGguf(file));
  auto tokenizer = Create(std::move(vocab));
  if (!tokenizer.ok()) {
    return Status(tokenizer.status().code(), file.path() + ": " + tokenizer.status().message());
  }
  return tokenizer;
}

}  // namespace polychip::model
