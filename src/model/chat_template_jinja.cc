// ChatTemplate: the model's own Jinja chat template, rendered as transformers renders it, with
// the hand-written families (chat_template.cc) where a file has none.
#include <spdlog/spdlog.h>

#include "jinja/jinja.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "util/file.h"

namespace polychip::model {

using ojson = nlohmann::ordered_json;

struct ChatTemplate::Compiled {
  jinja::Template main;
  std::optional<jinja::Template> tool_use;  // the variant for requests that offer tools
};

namespace {

// Template variables a request's kwargs may not replace: they are the conversation itself.
constexpr std::string_view kReservedVariables[] = {"messages", "tools", "add_generation_prompt"};

std::string TokenTextOrEmpty(const Tokenizer& tokenizer, TokenId id) {
  if (id < 0 || id >= tokenizer.n_vocab()) return "";
  return tokenizer.TokenText(id);
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view source, std::string bos_token,
                                               std::string eos_token, std::string origin,
                                               std::string_view tool_use) {
  auto compiled = std::make_shared<Compiled>();
  PC_ASSIGN_OR_RETURN(compiled->main, jinja::Template::Parse(source, "chat template"));
  if (!tool_use.empty()) {
    PC_ASSIGN_OR_RETURN(jinja::Template t,
                        jinja::Template::Parse(tool_use, "chat template 'tool_use'"));
    compiled->tool_use = std::move(t);
  }
  ChatTemplate t;
  t.jinja_ = std::move(compiled);
  t.source_ = std::string(source);
  t.origin_ = std::move(origin);
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  t.family_ = DetectChatFormat(source);
  return t;
}

ChatTemplate ChatTemplate::FromFamily(ChatFormat format) {
  ChatTemplate t;
  t.family_ = format;
  return t;
}

StatusOr<ChatTemplate> ChatTemplate::ForModel(const Tokenizer& tokenizer,
                                              const ChatTemplateOptions& options) {
  const Vocab& vocab = tokenizer.vocab();
  if (!options.family.empty() && !options.template_file.empty()) {
    return InvalidArgument("--chat-template and --chat-template-file name two templates: "
                           "give one");
  }
  ChatTemplate result;
  if (!options.family.empty()) {
    PC_ASSIGN_OR_RETURN(ChatFormat format, ChatFormatFromName(options.family));
    result = FromFamily(format);
  } else {
    const std::string bos = TokenTextOrEmpty(tokenizer, tokenizer.bos());
    const std::string eos = TokenTextOrEmpty(tokenizer, tokenizer.eos());
    if (!options.template_file.empty()) {
      PC_ASSIGN_OR_RETURN(std::string text,
                          ReadFileToString(options.template_file, "chat template file"));
      PC_ASSIGN_OR_RETURN(result, FromJinja(text, bos, eos, options.template_file));
    } else if (!vocab.chat_template.empty()) {
      std::string_view tool_use;
      for (const auto& [name, text] : vocab.named_chat_templates) {
        if (name == "tool_use") tool_use = text;
      }
      auto t = FromJinja(vocab.chat_template, bos, eos, "tokenizer.chat_template", tool_use);
      if (!t.ok()) {
        return InvalidArgument("the model's chat template does not parse: " +
                               t.status().message() +
                               " (--chat-template-file F.jinja or --chat-template NAME "
                               "to use another)");
      }
      result = std::move(*t);
    } else {
      spdlog::info("the model file has no chat template; using the built-in chatml format "
                   "(--chat-template NAME or --chat-template-file F.jinja to choose)");
      result = FromFamily(ChatFormat::kChatMl);
    }
  }
  if (!options.default_kwargs.is_null() && !options.default_kwargs.is_object()) {
    return InvalidArgument("--chat-template-kwargs must be a JSON object");
  }
  if (options.default_kwargs.is_object()) result.default_kwargs_ = options.default_kwargs;
  return result;
}

std::string ChatTemplate::Describe() const {
  if (!jinja_) return std::string(ChatFormatName(family_)) + " (built in)";
  std::string d = "Jinja template from " + origin_;
  if (jinja_->tool_use) d += " (with its tool_use variant)";
  return d;
}

bool ChatTemplate::StartsWithBos(std::string_view prompt) const {
  return !bos_token_.empty() && prompt.starts_with(bos_token_);
}

StatusOr<std::string> ChatTemplate::Render(const ChatInput& input) const {
  PC_ASSIGN_OR_RETURN(ojson messages, NormalizeChatMessages(input.messages));
  const bool has_tools = input.tools.is_array() && !input.tools.empty();
  if (!jinja_) {
    std::vector<ChatMessage> plain;
    plain.reserve(messages.size());
    for (const auto& m : messages) {
      ChatMessage msg;
      msg.role = m.value("role", "");
      if (auto c = m.find("content"); c != m.end() && c->is_string()) msg.content = *c;
      plain.push_back(std::move(msg));
    }
    return ApplyChatTemplate(family_, plain, input.add_generation_prompt);
  }
  ojson vars = ojson::object();
  vars["messages"] = std::move(messages);
  if (has_tools) vars["tools"] = input.tools;
  vars["add_generation_prompt"] = input.add_generation_prompt;
  vars["bos_token"] = bos_token_;
  vars["eos_token"] = eos_token_;
  for (const ojson* kwargs : {&default_kwargs_, &input.kwargs}) {
    if (!kwargs->is_object()) continue;
    for (const auto& [key, value] : kwargs->items()) {
      for (std::string_view reserved : kReservedVariables) {
        if (key == reserved) {
          return InvalidArgument("chat_template_kwargs cannot set '" + key +
                                 "': it is the conversation itself");
        }
      }
      vars[key] = value;
    }
  }
  const jinja::Template& t =
      has_tools && jinja_->tool_use ? *jinja_->tool_use : jinja_->main;
  return t.Render(vars);
}

StatusOr<ojson> NormalizeChatMessages(const ojson& messages) {
  if (!messages.is_array()) return InvalidArgument("'messages' must be an array");
  ojson out = ojson::array();
  for (const ojson& m : messages) {
    if (!m.is_object()) return InvalidArgument("each message must be an object");
    ojson msg = m;
    if (msg.value("role", "") == "developer") msg["role"] = "system";
    if (auto c = msg.find("content"); c != msg.end() && c->is_array()) {
      std::string text;
      for (const ojson& part : *c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return InvalidArgument("only text content parts are supported");
        }
        text += part["text"].get<std::string>();
      }
      *c = std::move(text);
    }
    if (auto calls = msg.find("tool_calls"); calls != msg.end() && calls->is_array()) {
      for (ojson& call : *calls) {
        if (!call.is_object()) continue;
        auto fn = call.find("function");
        if (fn == call.end() || !fn->is_object()) continue;
        auto args = fn->find("arguments");
        if (args == fn->end() || !args->is_string()) continue;
        // Arguments the model wrote as JSON text become the object templates print; text
        // that is not JSON stays as it is.
        ojson parsed = ojson::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_discarded()) *args = std::move(parsed);
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace polychip::model
