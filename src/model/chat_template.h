// Chat templates: turn {role, content} messages into the prompt text a chat model was trained
// on. GGUF files carry the template as Jinja (`tokenizer.chat_template`); rather than running
// Jinja we recognise the family by its markers (as llama.cpp does) and format it in C++.
// The result is meant to be tokenized with add_special = true (the tokenizer adds BOS) and
// parse_special = true (so "<|im_start|>" becomes one control token).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "util/status.h"

namespace polychip::model {

enum class ChatFormat {
  kChatMl,          // <|im_start|>role\n...<|im_end|>\n      (Qwen, many fine-tunes)
  kQwen3,           //   ChatML whose assistant turns carry <think>...</think> (Qwen3)
  kLlama2,          // [INST] ... [/INST]                        (no system prompt support)
  kLlama2Sys,       // [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
  kLlama2SysBos,    //   ... with <s> before each later [INST]
  kLlama2SysStrip,  //   ... with message contents trimmed
  kLlama3,          // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  kPhi3,            // <|role|>\n...<|end|>\n
  kGemma,           // <start_of_turn>role\n...<end_of_turn>\n   (assistant is "model")
  kZephyr,          // <|role|>\n...<|endoftext|>\n
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// "chatml", "qwen3", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "llama3",
// "phi3", "gemma", "zephyr".
std::string_view ChatFormatName(ChatFormat format);
StatusOr<ChatFormat> ChatFormatFromName(std::string_view name);

// Recognises the family of a Jinja chat template by its markers; ChatML when none matches.
ChatFormat DetectChatFormat(std::string_view jinja);

// An explicit name (non-empty `override_name`) wins; otherwise the template text decides.
StatusOr<ChatFormat> SelectChatFormat(std::string_view override_name, std::string_view jinja);

// Formats the conversation; `add_generation_prompt` opens the assistant's turn at the end.
std::string ApplyChatTemplate(ChatFormat format, std::span<const ChatMessage> messages,
                              bool add_generation_prompt);

}  // namespace polychip::model
