// `polychip template (--model-path M | --template-file T) --messages conv.json [--tools t.json]
//                    [--no-generation-prompt] [--bos S] [--eos S] [--kwargs JSON]`
// Prints the prompt a chat template renders for a conversation, byte for byte (no newline
// added): what the model sees. Reads only the vocabulary of a model file, not its weights.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/model_options.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "util/file.h"

namespace polychip::cli {
namespace {

using ojson = nlohmann::ordered_json;

struct TemplateArgs {
  std::string model_path;
  std::string template_file;
  std::string messages_path;
  std::string tools_path;
  bool no_generation_prompt = false;
  std::string bos, eos;
  std::string kwargs;
  std::string family;
};

StatusOr<ojson> ReadJsonFile(const std::string& path, const char* what) {
  PC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, std::string(what) + " file"));
  ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(path + " is not valid JSON");
  return j;
}

Status Render(const TemplateArgs& args) {
  ChatTemplateFlags flags{args.family, args.template_file, args.kwargs};
  PC_ASSIGN_OR_RETURN(model::ChatTemplateOptions options, ResolveChatTemplateFlags(flags));
  model::ChatTemplate chat_template;
  if (!args.model_path.empty()) {
    PC_ASSIGN_OR_RETURN(auto file, model::GgufFile::Open(args.model_path));
    PC_ASSIGN_OR_RETURN(auto tokenizer, model::Tokenizer::FromGguf(*file));
    PC_ASSIGN_OR_RETURN(chat_template, model::ChatTemplate::ForModel(*tokenizer, options));
  } else if (!args.family.empty()) {
    PC_ASSIGN_OR_RETURN(model::ChatFormat format, model::ChatFormatFromName(args.family));
    chat_template = model::ChatTemplate::FromFamily(format);
  } else {
    PC_ASSIGN_OR_RETURN(std::string text, ReadFileToString(args.template_file, "template file"));
    PC_ASSIGN_OR_RETURN(chat_template, model::ChatTemplate::FromJinja(text, args.bos, args.eos,
                                                                      args.template_file));
    chat_template.set_default_kwargs(options.default_kwargs);
  }
  model::ChatInput input;
  PC_ASSIGN_OR_RETURN(ojson conversation, ReadJsonFile(args.messages_path, "messages"));
  // A bare list of messages, or a request body with "messages" (and maybe "tools").
  if (conversation.is_object()) {
    if (auto t = conversation.find("tools"); t != conversation.end()) input.tools = *t;
    if (auto k = conversation.find("chat_template_kwargs"); k != conversation.end()) {
      input.kwargs = *k;
    }
    conversation = conversation.value("messages", ojson());
  }
  if (!conversation.is_array()) {
    return InvalidArgument(args.messages_path + ": expected a list of messages or an object "
                           "with \"messages\"");
  }
  input.messages = std::move(conversation);
  if (!args.tools_path.empty()) {
    PC_ASSIGN_OR_RETURN(input.tools, ReadJsonFile(args.tools_path, "tools"));
  }
  input.add_generation_prompt = !args.no_generation_prompt;
  PC_ASSIGN_OR_RETURN(std::string prompt, chat_template.Render(input));
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "\n[%s, %zu bytes]\n", chat_template.Describe().c_str(), prompt.size());
  return Status::Ok();
}

std::function<int()> SetupTemplate(CLI::App& app, const GlobalOptions&) {
  auto args = std::make_shared<TemplateArgs>();
  auto* source = app.add_option_group("source", "where the template comes from");
  source->add_option("--model-path,-m", args->model_path,
                     "a GGUF model or vocabulary file: its tokenizer.chat_template");
  source->add_option("--template-file", args->template_file, "a Jinja chat template file");
  source->add_option("--chat-template", args->family,
                     "a built-in format (chatml, llama3, ...) instead");
  source->require_option(1);
  app.add_option("--messages", args->messages_path,
                 "JSON file: a list of OpenAI chat messages, or a body with \"messages\" and "
                 "\"tools\"")
      ->required();
  app.add_option("--tools", args->tools_path, "JSON file: a list of OpenAI tools");
  app.add_flag("--no-generation-prompt", args->no_generation_prompt,
               "do not open the assistant's turn at the end");
  app.add_option("--bos", args->bos, "bos_token's text (with --template-file; default empty)");
  app.add_option("--eos", args->eos, "eos_token's text (with --template-file; default empty)");
  app.add_option("--kwargs", args->kwargs,
                 "extra template variables as a JSON object, e.g. '{\"enable_thinking\":false}'");
  return [args] {
    Status s = Render(*args);
    if (!s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  };
}

const bool kRegistered = RegisterCommand(
    {"template", "print the prompt a chat template renders for a conversation", SetupTemplate});

}  // namespace
}  // namespace polychip::cli
