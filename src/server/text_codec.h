// What the HTTP server needs from a tokenizer and a chat template. The real one wraps
// model::Tokenizer (MakeTokenizerCodec); tests plug in a toy codec so that the server can run
// over a fake ModelRunner.
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
  // A chat prompt: control tokens written by the template are parsed as such.
  virtual std::vector<int32_t> EncodeChat(std::span<const model::ChatMessage> messages) const = 0;
  virtual std::string Decode(std::span<const int32_t> tokens) const = 0;
  // The bytes of one token (streaming; may be part of a UTF-8 sequence).
  virtual std::string Piece(int32_t token) const = 0;
  virtual std::vector<int32_t> EogTokens() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The chat format's name (model::ChatFormatName), which decides how tool calls are written.
  virtual std::string chat_format() const { return "chatml"; }
  // How the model writes tool calls and reasoning: what the prompt told it (the model's own
  // template, or the hand-written family's tool prompt).
  virtual OutputFormat output_format() const { return OutputFormatForChatFamily(chat_format()); }
  ToolFormat tool_call_format() const { return output_format().tools; }
};

// `chat_format`: an explicit chat format name ("chatml", "llama3", ...) or "" to detect it from
// the vocabulary's template. The tokenizer must outlive the codec.
StatusOr<std::unique_ptr<TextCodec>> MakeTokenizerCodec(const model::Tokenizer* tokenizer,
                                                        const std::string& chat_format);

}  // namespace polychip::server
