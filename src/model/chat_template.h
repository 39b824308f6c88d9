// Chat templates: turn a conversation into the prompt text a chat model was trained on.
// GGUF files carry the model's own template as Jinja (`tokenizer.chat_template`, and named
// variants such as `tokenizer.chat_template.tool_use`): ChatTemplate renders it with our
// Jinja engine (src/jinja/) as Hugging Face transformers does. The hand-written families
// below (ChatFormat) serve only files that carry no template, or a user who names one.
// The result is meant to be tokenized with parse_special = true (so "<|im_start|>" becomes one
// control token); ChatTemplate::starts_with_bos says whether the tokenizer must still add BOS.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

class Tokenizer;  // model/tokenizer.h

// The conversation handed to a chat template, in OpenAI's shape: messages with role, content,
// tool_calls, tool_call_id, name, reasoning_content; keys in the order the client sent them
// (templates print tool schemas with tojson, and Python keeps dict order).
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // an array of OpenAI tools; null = none offered
  bool add_generation_prompt = true;
  // Extra template variables (a request's chat_template_kwargs over the server's default),
  // such as Qwen3's enable_thinking.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// How a model's chat template is chosen (serve/run/tokenize/template flags).
struct ChatTemplateOptions {
  std::string family;         // --chat-template NAME: a hand-written family instead
  std::string template_file;  // --chat-template-file F.jinja: a Jinja template instead
  nlohmann::ordered_json default_kwargs = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // A Jinja template. `origin` says where it came from, for logs and errors
  // ("tokenizer.chat_template", a file path). `tool_use`: the named variant used when tools
  // are offered (transformers' rule), or "".
  static StatusOr<ChatTemplate> FromJinja(std::string_view source, std::string bos_token,
                                          std::string eos_token, std::string origin,
                                          std::string_view tool_use = {});
  static ChatTemplate FromFamily(ChatFormat format);
  // The model's template unless `options` name another; a family only where the file has
  // none (logged). Errors: an unknown family, an unreadable file, a template that does not
  // parse (its line named).
  static StatusOr<ChatTemplate> ForModel(const Tokenizer& tokenizer,
                                         const ChatTemplateOptions& options);

  // The prompt text. Errors (InvalidArgument): the template refused the conversation
  // (raise_exception) or failed, naming the template line; a bad kwarg.
  StatusOr<std::string> Render(const ChatInput& input) const;

  bool is_jinja() const { return jinja_ != nullptr; }
  // The Jinja source ("" for a family): what tool-call and reasoning formats are read from.
  const std::string& source() const { return source_; }
  // The family: the hand-written one, or the one a Jinja template's markers resemble.
  ChatFormat family() const { return family_; }
  // "the model's template (tokenizer.chat_template)", "chatml (built in)", ...
  std::string Describe() const;
  // Whether a rendered prompt begins with the BOS text (then the tokenizer must not add one).
  bool StartsWithBos(std::string_view prompt) const;
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  const nlohmann::ordered_json& default_kwargs() const { return default_kwargs_; }
  void set_default_kwargs(nlohmann::ordered_json kwargs) { default_kwargs_ = std::move(kwargs); }

 private:
  struct Compiled;
  ChatFormat family_ = ChatFormat::kChatMl;
  std::shared_ptr<const Compiled> jinja_;  // null for a family
  std::string source_, origin_, bos_token_, eos_token_;
  nlohmann::ordered_json default_kwargs_ = nlohmann::ordered_json::object();
};

// What transformers, vLLM and llama-server do to messages before a template sees them:
// content given as text parts is joined, `developer` is `system`, tool-call arguments given
// as JSON text become objects (templates print them with tojson). Errors: a part that is not
// text.
StatusOr<nlohmann::ordered_json> NormalizeChatMessages(const nlohmann::ordered_json& messages);

}  // namespace polychip::model
