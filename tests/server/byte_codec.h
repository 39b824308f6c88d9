// A toy TextCodec for server tests over a fake model runner: token b+1 is byte b, 0 is EOS,
// and a chat renders as "role: content" lines. Options cover what the tests vary: the text
// after the messages, how tokens above the bytes decode, the chat family and output format.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/text_codec.h"

namespace polychip::server::testing {

struct ByteCodecOptions {
  std::string prompt_suffix;        // after the messages, e.g. "assistant: " (an open turn)
  bool letters_above_bytes = true;  // tokens above 256 decode as 'a' + t % 26, else as ""
  std::string family = "chatml";    // chat_format()
  std::optional<OutputFormat> output_format;  // unset: the family's
  int64_t vocab_size = 300;
};

class ByteCodec : public TextCodec {
 public:
  explicit ByteCodec(ByteCodecOptions options = {}) : options_(std::move(options)) {}

  std::vector<int32_t> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> out;
    for (unsigned char c : text) out.push_back(c + 1);
    return out;
  }
  StatusOr<std::string> RenderChat(const model::ChatInput& input) const override {
    auto messages = model::NormalizeChatMessages(input.messages);
    if (!messages.ok()) return messages.status();
    std::string s;
    for (const auto& m : *messages) {
      auto content = m.find("content");
      s += m.value("role", "") + ": ";
      if (content != m.end() && content->is_string()) s += content->get<std::string>();
      s += "\n";
    }
    return s + options_.prompt_suffix;
  }
  std::string Decode(std::span<const int32_t> tokens) const override {
    std::string s;
    for (int32_t t : tokens) s += Piece(t);
    return s;
  }
  std::string Piece(int32_t t) const override {
    if (t >= 1 && t <= 256) return std::string(1, static_cast<char>(t - 1));
    if (t > 256 && options_.letters_above_bytes) return std::string(1, static_cast<char>('a' + t % 26));
    return "";
  }
  std::vector<int32_t> EogTokens() const override { return {0}; }
  int64_t vocab_size() const override { return options_.vocab_size; }
  std::string chat_format() const override { return options_.family; }
  OutputFormat output_format() const override {
    return options_.output_format ? *options_.output_format : TextCodec::output_format();
  }

 private:
  ByteCodecOptions options_;
};

}  // namespace polychip::server::testing
