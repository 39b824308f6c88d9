// libFuzzer target: chat format detection on an arbitrary Jinja text and the renderer on
// arbitrary messages. Input: one byte choosing the format and the generation prompt, then
// role\0content\0role\0content... (also given whole to the detector).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace polychip::model;
  if (size == 0) return 0;
  const uint8_t choice = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  const ChatFormat detected = DetectChatFormat(rest);
  (void)SelectChatFormat(ChatFormatName(detected), rest);
  (void)ChatFormatFromName(rest);

  std::vector<ChatMessage> messages;
  size_t pos = 0;
  while (pos <= rest.size() && messages.size() < 64) {
    size_t role_end = rest.find('\0', pos);
    if (role_end == std::string_view::npos) role_end = rest.size();
    size_t content_end = role_end < rest.size() ? rest.find('\0', role_end + 1) : rest.size();
    if (content_end == std::string_view::npos) content_end = rest.size();
    ChatMessage m;
    m.role = std::string(rest.substr(pos, role_end - pos));
    if (role_end < rest.size()) m.content = std::string(rest.substr(role_end + 1, content_end - role_end - 1));
    messages.push_back(std::move(m));
    pos = content_end + 1;
  }
  constexpr ChatFormat kFormats[] = {
      ChatFormat::kChatMl,         ChatFormat::kQwen3,  ChatFormat::kLlama2,
      ChatFormat::kLlama2Sys,      ChatFormat::kLlama2SysBos, ChatFormat::kLlama2SysStrip,
      ChatFormat::kLlama3,         ChatFormat::kPhi3,   ChatFormat::kGemma,
      ChatFormat::kZephyr};
  const ChatFormat format = kFormats[(choice >> 1) % std::size(kFormats)];
  const std::string out = ApplyChatTemplate(format, messages, choice & 1);
  // The formats that copy contents verbatim (others trim them or move the reasoning of an
  // assistant turn) lose none of them.
  const bool verbatim = format == ChatFormat::kChatMl || format == ChatFormat::kPhi3 ||
                        format == ChatFormat::kZephyr;
  for (const auto& m : messages) {
    if (verbatim && out.find(m.content) == std::string::npos) __builtin_trap();
  }
  return 0;
}
