#include "server/text_codec.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <unordered_set>

#include "model/tokenizer.h"

namespace polychip::server {
namespace {

class TokenizerCodec : public TextCodec {
 public:
  TokenizerCodec(const model::Tokenizer* tokenizer, model::ChatTemplate chat_template)
      : tokenizer_(tokenizer),
        template_(std::move(chat_template)),
        renders_tools_(template_.is_jinja() &&
                       template_.source().find("tools") != std::string::npos) {
    // A template that renders tools told the model its own call format; otherwise the server
    // writes the family's tool prompt, so the calls follow the family. The reasoning markers
    // are the model's whatever renders the prompt.
    const std::string& jinja = template_.source();
    if (renders_tools_) {
      output_format_ = DetectOutputFormat(jinja);
    } else {
      output_format_ = OutputFormatForChatFamily(model::ChatFormatName(template_.family()));
      const std::string& markers = jinja.empty() ? tokenizer->vocab().chat_template : jinja;
      if (!markers.empty()) output_format_.reasoning = DetectReasoningFormat(markers, nullptr);
    }
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
  StatusOr<std::string> RenderChat(const model::ChatInput& input) const override {
    return template_.Render(input);
  }
  StatusOr<std::vector<int32_t>> EncodeChat(const model::ChatInput& input) const override {
    PC_ASSIGN_OR_RETURN(std::string text, template_.Render(input));
    model::EncodeOptions opt;
    // A template that writes bos_token itself (Llama 3.x, Mistral, Gemma) must not get a
    // second one from the tokenizer.
    opt.add_special = !template_.StartsWithBos(text);
    opt.parse_special = true;
    return tokenizer_->Encode(text, opt);
  }
  std::string Decode(std::span<const int32_t> tokens) const override {
    return tokenizer_->Decode(tokens);
  }
  std::string Piece(int32_t token) const override {
    return tokenizer_->Piece(token, shown_control_.contains(token));
  }
  std::vector<int32_t> EogTokens() const override { return tokenizer_->eog_ids(); }
  int64_t vocab_size() const override { return tokenizer_->n_vocab(); }
  std::string chat_format() const override {
    return std::string(model::ChatFormatName(template_.family()));
  }
  OutputFormat output_format() const override { return output_format_; }
  bool template_renders_tools() const override { return renders_tools_; }

 private:
  const model::Tokenizer* tokenizer_;
  model::ChatTemplate template_;
  const bool renders_tools_;  // a Jinja template that mentions tools
  OutputFormat output_format_;
  std::unordered_set<int32_t> shown_control_;
};

}  // namespace

StatusOr<std::unique_ptr<TextCodec>> MakeTokenizerCodec(
    const model::Tokenizer* tokenizer, const model::ChatTemplateOptions& options) {
  PC_ASSIGN_OR_RETURN(model::ChatTemplate chat_template,
                      model::ChatTemplate::ForModel(*tokenizer, options));
  spdlog::info("chat template: {}", chat_template.Describe());
  return std::unique_ptr<TextCodec>(
      std::make_unique<TokenizerCodec>(tokenizer, std::move(chat_template)));
}

}  // namespace polychip::server
