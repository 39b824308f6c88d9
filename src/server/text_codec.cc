#include "server/text_codec.h"

#include <algorithm>
#include <unordered_set>

#include "model/tokenizer.h"

namespace polychip::server {
namespace {

class TokenizerCodec : public TextCodec {
 public:
  TokenizerCodec(const model::Tokenizer* tokenizer, model::ChatFormat format)
      : tokenizer_(tokenizer), format_(format) {
    // The hand-written families write their own tool prompt, so the calls follow the family;
    // the reasoning markers are the model's whatever renders the prompt.
    const std::string& jinja = tokenizer->vocab().chat_template;
    output_format_ = OutputFormatForChatFamily(model::ChatFormatName(format));
    if (!jinja.empty()) output_format_.reasoning = DetectReasoningFormat(jinja, nullptr);
    // Control tokens the format is written with are shown in the answer (they are "" by
    // default), so that the parser and a forcing grammar see them.
    const auto eog = tokenizer->eog_ids();
    for (const std::string& text : FormatMarkerTokens(output_format_)) {
      const model::TokenId id = tokenizer->Find(text);
      if (id < 0 || std::find(eog.begin(), eog.end(), id) != eog.end()) continue;
      if (tokenizer->Piece(id).empty()) shown_control_.insert(id);
    }
  }

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
  std::string Piece(int32_t token) const override {
    return tokenizer_->Piece(token, shown_control_.contains(token));
  }
  std::vector<int32_t> EogTokens() const override { return tokenizer_->eog_ids(); }
  int64_t vocab_size() const override { return tokenizer_->n_vocab(); }
  std::string chat_format() const override { return std::string(model::ChatFormatName(format_)); }
  OutputFormat output_format() const override { return output_format_; }

 private:
  const model::Tokenizer* tokenizer_;
  model::ChatFormat format_;
  OutputFormat output_format_;
  std::unordered_set<int32_t> shown_control_;
};

}  // namespace

StatusOr<std::unique_ptr<TextCodec>> MakeTokenizerCodec(const model::Tokenizer* tokenizer,
                                                        const std::string& chat_format) {
  PC_ASSIGN_OR_RETURN(model::ChatFormat format,
                      model::SelectChatFormat(chat_format, tokenizer->vocab().chat_template));
  return std::unique_ptr<TextCodec>(std::make_unique<TokenizerCodec>(tokenizer, format));
}

}  // namespace polychip::server
