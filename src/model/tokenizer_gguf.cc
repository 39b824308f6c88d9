// Vocab from the `tokenizer.*` metadata of a GGUF file (keys as written by llama.cpp's
// convert_hf_to_gguf.py).
#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace polychip::model {
namespace {

// A special-token id key, or kNoToken when absent. A value that is not a token id of this
// vocabulary is ignored as llama.cpp does (the tokenizer's default for that role applies), but
// said in the log: a silently missing BOS changes every output.
TokenId OptionalId(const GgufFile& file, std::string_view key, size_t n_tokens) {
  const GgufValue* v = file.Find(key);
  if (v == nullptr) return kNoToken;
  if (!IsGgufIntegerType(v->type)) {
    spdlog::warn("{}: {} is {}, not a token id; ignored", file.path(), key, GgufTypeName(v->type));
    return kNoToken;
  }
  const bool in_range = v->type == GgufType::kU64 ? v->u < n_tokens
                                                  : v->i >= 0 && static_cast<uint64_t>(v->i) <
                                                                     n_tokens;
  if (!in_range) {
    spdlog::warn("{}: {} = {} is outside the vocabulary ({} tokens); ignored, the tokenizer's "
                 "default applies",
                 file.path(), key,
                 v->type == GgufType::kU64 ? std::to_string(v->u) : std::to_string(v->i),
                 n_tokens);
    return kNoToken;
  }
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

  vocab.bos = OptionalId(file, "tokenizer.ggml.bos_token_id", n);
  vocab.eos = OptionalId(file, "tokenizer.ggml.eos_token_id", n);
  vocab.eot = OptionalId(file, "tokenizer.ggml.eot_token_id", n);
  vocab.eom = OptionalId(file, "tokenizer.ggml.eom_token_id", n);
  vocab.unk = OptionalId(file, "tokenizer.ggml.unknown_token_id", n);
  vocab.pad = OptionalId(file, "tokenizer.ggml.padding_token_id", n);
  vocab.sep = OptionalId(file, "tokenizer.ggml.seperator_token_id", n);  // sic, as in GGUF
  vocab.add_bos = OptionalBool(file, "tokenizer.ggml.add_bos_token");
  vocab.add_eos = OptionalBool(file, "tokenizer.ggml.add_eos_token");
  vocab.add_space_prefix = OptionalBool(file, "tokenizer.ggml.add_space_prefix");
  vocab.model_name = file.GetString("general.name", "");
  if (const GgufValue* t = file.Find("tokenizer.chat_template")) {
    if (t->type == GgufType::kString) {
      vocab.chat_template = std::string(t->str);
    } else {
      spdlog::warn("{}: tokenizer.chat_template is {}, not a string; ignored", file.path(),
                   GgufTypeName(t->type));
    }
  }
  constexpr std::string_view kNamedPrefix = "tokenizer.chat_template.";
  for (const auto& [key, value] : file.metadata()) {
    if (key.starts_with(kNamedPrefix) && value.type == GgufType::kString) {
      vocab.named_chat_templates.emplace_back(key.substr(kNamedPrefix.size()),
                                              std::string(value.str));
    }
  }
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
