#include "model/chat_template.h"

#include <spdlog/spdlog.h>

#include <array>
#include <utility>

namespace polychip::model {
namespace {

constexpr std::array<std::pair<ChatFormat, std::string_view>, 10> kNames = {{
    {ChatFormat::kChatMl, "chatml"},
    {ChatFormat::kQwen3, "qwen3"},
    {ChatFormat::kLlama2, "llama2"},
    {ChatFormat::kLlama2Sys, "llama2-sys"},
    {ChatFormat::kLlama2SysBos, "llama2-sys-bos"},
    {ChatFormat::kLlama2SysStrip, "llama2-sys-strip"},
    {ChatFormat::kLlama3, "llama3"},
    {ChatFormat::kPhi3, "phi3"},
    {ChatFormat::kGemma, "gemma"},
    {ChatFormat::kZephyr, "zephyr"},
}};

std::string Trim(std::string_view s) {
  const char* kSpaces = " \t\n\r\f\v";
  const size_t begin = s.find_first_not_of(kSpaces);
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(kSpaces);
  return std::string(s.substr(begin, end - begin + 1));
}

std::string FormatLlama2(ChatFormat format, std::span<const ChatMessage> messages) {
  const bool system_block = format != ChatFormat::kLlama2;
  const bool bos_in_history = format == ChatFormat::kLlama2SysBos;
  const bool strip = format == ChatFormat::kLlama2SysStrip;
  // The first [INST] follows the BOS the tokenizer adds; later turns open their own.
  std::string out = "[INST] ";
  bool inside_turn = true;
  for (const ChatMessage& m : messages) {
    const std::string content = strip ? Trim(m.content) : m.content;
    if (!inside_turn) {
      out += bos_in_history ? "<s>[INST] " : "[INST] ";
      inside_turn = true;
    }
    if (m.role == "system") {
      // Without <<SYS>> support the system text still goes first, as plain text.
      out += system_block ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
    } else if (m.role == "user") {
      out += content + " [/INST]";
    } else {
      out += content + "</s>";
      inside_turn = false;
    }
  }
  return out;
}

std::string StripChars(std::string_view s, bool front, bool back, std::string_view chars) {
  size_t begin = 0, end = s.size();
  while (front && begin < end && chars.find(s[begin]) != s.npos) ++begin;
  while (back && end > begin && chars.find(s[end - 1]) != s.npos) --end;
  return std::string(s.substr(begin, end - begin));
}

// Qwen3's template: ChatML, where the model's reasoning rides in the assistant's content as
// "<think>...</think>". Turns answered before the last user message lose their reasoning (the
// model was trained to see only answers there); the turns after it (a tool-calling loop, or an
// assistant prefix to continue) keep it, re-wrapped as Qwen3 writes it. Nothing is added after
// the generation prompt, so the model opens its own <think> block, which the answer passes
// through untouched.
std::string FormatQwen3(std::span<const ChatMessage> messages, bool add_generation_prompt) {
  // Without a user message no turn counts as after it (as in Qwen3's template).
  size_t last_query = messages.empty() ? 0 : messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    if (messages[i].role == "user") {
      last_query = i;
      break;
    }
  }
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "assistant") {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      continue;
    }
    // The answer follows the last "</think>"; the reasoning precedes the first one.
    const std::string_view text = m.content;
    std::string content = m.content, reasoning;
    if (const size_t last_close = text.rfind("</think>"); last_close != text.npos) {
      content = StripChars(text.substr(last_close + 8), true, false, "\n");
      std::string_view before = text.substr(0, text.find("</think>"));
      if (const size_t open = before.rfind("<think>"); open != before.npos) {
        before = before.substr(open + 7);
      }
      reasoning = StripChars(before, true, true, "\n");
    }
    out += "<|im_start|>assistant\n";
    if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      out += "<think>\n" + reasoning + "\n</think>\n\n";
    }
    out += content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

std::string_view ChatFormatName(ChatFormat format) {
  for (const auto& [f, name] : kNames) {
    if (f == format) return name;
  }
  return "?";
}

StatusOr<ChatFormat> ChatFormatFromName(std::string_view name) {
  for (const auto& [f, n] : kNames) {
    if (n == name) return f;
  }
  std::string known;
  for (const auto& [f, n] : kNames) known += (known.empty() ? "" : ", ") + std::string(n);
  return InvalidArgument("unknown chat template '" + std::string(name) + "' (known: " + known +
                         ")");
}

ChatFormat DetectChatFormat(std::string_view jinja) {
  auto has = [jinja](std::string_view marker) { return jinja.find(marker) != jinja.npos; };
  if (has("<|im_start|>")) return has("<think>") ? ChatFormat::kQwen3 : ChatFormat::kChatMl;
  if (has("[INST]")) {
    if (has("content.strip()")) return ChatFormat::kLlama2SysStrip;
    if (has("bos_token + '[INST]")) return ChatFormat::kLlama2SysBos;
    if (has("<<SYS>>")) return ChatFormat::kLlama2Sys;
    return ChatFormat::kLlama2;
  }
  if (has("<|assistant|>") && has("<|end|>")) return ChatFormat::kPhi3;
  if (has("<|user|>") && has("<|endoftext|>")) return ChatFormat::kZephyr;
  if (has("<start_of_turn>")) return ChatFormat::kGemma;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatFormat::kLlama3;
  return ChatFormat::kChatMl;  // the most common format of fine-tunes without a template
}

StatusOr<ChatFormat> SelectChatFormat(std::string_view override_name, std::string_view jinja) {
  if (!override_name.empty()) return ChatFormatFromName(override_name);
  const ChatFormat format = DetectChatFormat(jinja);
  // ChatML is also the answer when nothing matched: say so, since a model prompted in the
  // wrong format still answers, only worse.
  if (jinja.empty()) {
    spdlog::info("the model has no chat template; using chatml (--chat-template to choose)");
  } else if (format == ChatFormat::kChatMl && jinja.find("<|im_start|>") == jinja.npos) {
    spdlog::warn("the model's chat template matches no known format; using chatml "
                 "(--chat-template to choose)");
  }
  return format;
}

std::string ApplyChatTemplate(ChatFormat format, std::span<const ChatMessage> messages,
                              bool add_generation_prompt) {
  std::string out;
  switch (format) {
    case ChatFormat::kChatMl:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kQwen3:
      out = FormatQwen3(messages, add_generation_prompt);
      break;
    case ChatFormat::kLlama2:
    case ChatFormat::kLlama2Sys:
    case ChatFormat::kLlama2SysBos:
    case ChatFormat::kLlama2SysStrip:
      // The assistant's turn is already open after " [/INST]".
      out = FormatLlama2(format, messages);
      break;
    case ChatFormat::kLlama3:
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + Trim(m.content) +
               "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFormat::kPhi3:
    case ChatFormat::kZephyr: {
      const char* end = format == ChatFormat::kPhi3 ? "<|end|>\n" : "<|endoftext|>\n";
      for (const ChatMessage& m : messages) out += "<|" + m.role + "|>\n" + m.content + end;
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    }
    case ChatFormat::kGemma: {
      // Gemma has no system role: the system text is put in front of the next user turn.
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system += Trim(m.content);
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n";
        if (!system.empty() && role != "model") {
          out += system + "\n\n";
          system.clear();
        }
        out += Trim(m.content) + "<end_of_turn>\n";
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
  }
  return out;
}

}  // namespace polychip::model
