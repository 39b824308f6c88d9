#include "server/text_codec.h"

#include "model/tokenizer.h"

namespace polychip::server {
namespace {

class TokenizerCodec : public TextCodec {
 public:
  TokenizerCodec(const model::Tokenizer* tokenizer, model::ChatFormat format)
      : tokenizer_(tokenizer), format_(format) {}

  std::vector<int32_t> Encode(std::string_view text, bool add_special) const override {
    model::EncodeOptions opt;
    opt.add_special = add_special;
    return tokenizer_->Encode(text, opt);
  }
  std::vector<int32_t> EncodeChat(std::span<const model::ChatMessage> messages) const override {
    model::EncodeOptions opt;
    opt.add_special = true;
    opt.parse_special = true;
    return tokenizer_->Encode(model::ApplyChatTemplate(format_, messages, true), opt);
  }
  std::string Decode(std::span<const int32_t> tokens) const override {
    return tokenizer_->Decode(tokens);
  }
  std::string Piece(int32_t token) const override { return tokenizer_->Piece(token); }
  std::vector<int32_t> EogTokens() const override { return tokenizer_->eog_ids(); }
  int64_t vocab_size() const override { return tokenizer_->n_vocab(); }
  std::string chat_format() const override { return std::string(model::ChatFormatName(format_)); }

 private:
  const model::Tokenizer* tokenizer_;
  model::ChatFormat format_;
};

}  // namespace

StatusOr<std::unique_ptr<TextCodec>> MakeTokenizerCodec(const model::Tokenizer* tokenizer,
                                                        const std::string& chat_format) {
  PC_ASSIGN_OR_RETURN(model::ChatFormat format,
                      model::SelectChatFormat(chat_format, tokenizer->vocab().chat_template));
  return std::unique_ptr<TextCodec>(std::make_unique<TokenizerCodec>(tokenizer, format));
}

}  // namespace polychip::server
