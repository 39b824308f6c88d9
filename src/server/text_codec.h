// What the HTTP server needs from a tokenizer and a chat template. The real one wraps
// model::Tokenizer and model::ChatTemplate (MakeTokenizerCodec); tests plug in a toy codec so
// that the server can run over a fake ModelRunner.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"
#include "server/tool_format.h"
#include "util/status.h"

namespace polychip::model {
class Tokenizer;
}

namespace polychip::server {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Plain text prompt (completions, /generate, /tokenize): BOS as the vocabulary says.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special) const = 0;
  // The chat prompt's text, as the model's template writes it. Errors (InvalidArgument): the
  // template refused the conversation or failed (its line named).
  virtual StatusOr<std::string> RenderChat(const model::ChatInput& input) const = 0;
  // The chat prompt's tokens: control tokens written by the template are parsed as such, and
  // BOS is added only where the template did not write it.
  virtual StatusOr<std::vector<int32_t>> EncodeChat(const model::ChatInput& input) const {
    auto text = RenderChat(input);
    if (!text.ok()) return text.status();
    return Encode(*text, true);
  }
  virtual std::string Decode(std::span<const int32_t> tokens) const = 0;
  // The bytes of one token (streaming; may be part of a UTF-8 sequence).
  virtual std::string Piece(int32_t token) const = 0;
  virtual std::vector<int32_t> EogTokens() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The chat family's name (model::ChatFormatName): the hand-written format, or the one the
  // model's Jinja template resembles. Tool calls of the built-in families are written by it.
  virtual std::string chat_format() const { return "chatml"; }
  // How the model writes tool calls and reasoning: what the prompt told it (the model's own
  // template, or the hand-written family's tool prompt).
  virtual OutputFormat output_format() const { return OutputFormatForChatFamily(chat_format()); }
  ToolFormat tool_call_format() const { return output_format().tools; }
  // True when the model's own (Jinja) template renders tools, tool calls and tool results
  // itself; false when the server must write them into the messages (built-in families and
  // templates that never mention tools).
  virtual bool template_renders_tools() const { return false; }
};

// The tokenizer must outlive the codec. `options` choose the template (the model's own by
// default); the choice is logged.
StatusOr<std::unique_ptr<TextCodec>> MakeTokenizerCodec(
    const model::Tokenizer* tokenizer, const model::ChatTemplateOptions& options);

}  // namespace polychip::server
