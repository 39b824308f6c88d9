#include "cli/model_options.h"

#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

namespace polychip::cli {

void AddChatTemplateOptions(CLI::App& app, ChatTemplateFlags* flags) {
  app.add_option("--chat-template", flags->family,
                 "a built-in chat format instead of the model's own template (chatml, qwen3, "
                 "llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip, llama3, phi3, gemma, "
                 "zephyr); default: the model's tokenizer.chat_template");
  app.add_option("--chat-template-file", flags->file,
                 "a Jinja chat template file instead of the model's own");
  app.add_option("--chat-template-kwargs", flags->kwargs_json,
                 "extra template variables for every chat, as a JSON object (a request's "
                 "chat_template_kwargs override them), e.g. '{\"enable_thinking\": false}'");
}

StatusOr<model::ChatTemplateOptions> ResolveChatTemplateFlags(const ChatTemplateFlags& flags) {
  model::ChatTemplateOptions options;
  options.family = flags.family;
  options.template_file = flags.file;
  if (!flags.kwargs_json.empty()) {
    auto kwargs = nlohmann::ordered_json::parse(flags.kwargs_json, nullptr,
                                                /*allow_exceptions=*/false);
    if (kwargs.is_discarded() || !kwargs.is_object()) {
      return InvalidArgument("--chat-template-kwargs must be a JSON object, got '" +
                             flags.kwargs_json + "'");
    }
    options.default_kwargs = std::move(kwargs);
  }
  return options;
}

}  // namespace polychip::cli
