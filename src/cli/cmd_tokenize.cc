// `polychip tokenize --model-path M --prompt P [--ids-only] [--no-bos] [--parse-special]
//                    [--chat [--chat-template NAME | --chat-template-file F] [--system S]]`
// Prints the tokens of a prompt with the model's tokenizer, one "id 'piece'" per line (or the
// ids alone on one line), for debugging prompts and comparing against llama-tokenize.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/model_options.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"

namespace polychip::cli {
namespace {

struct TokenizeArgs {
  std::string model_path;
  std::string prompt;
  bool ids_only = false;
  bool no_bos = false;
  bool parse_special = false;
  bool chat = false;
  ChatTemplateFlags chat_template;
  std::string system;
};

// Control characters and quotes escaped so that every piece stays on one line; a piece that is
// part of a multibyte character shows its bytes as \xNN.
std::string Printable(const std::string& s) {
  const bool valid = model::SanitizeUtf8(s) == s;
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\'') {
      out += "\\'";
    } else if (c < 0x20 || (c >= 0x80 && !valid)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int RunTokenize(const TokenizeArgs& args) {
  auto file = model::GgufFile::Open(args.model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "error: %s\n", file.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = model::Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const model::Tokenizer& tok = **tokenizer;

  std::string text = args.prompt;
  bool parse_special = args.parse_special;
  bool add_special = !args.no_bos;
  if (args.chat) {
    auto chat_options = ResolveChatTemplateFlags(args.chat_template);
    auto chat_template = chat_options.ok() ? model::ChatTemplate::ForModel(tok, *chat_options)
                                           : StatusOr<model::ChatTemplate>(chat_options.status());
    if (!chat_template.ok()) {
      std::fprintf(stderr, "error: %s\n", chat_template.status().ToString().c_str());
      return 1;
    }
    model::ChatInput chat;
    if (!args.system.empty()) chat.messages.push_back({{"role", "system"}, {"content", args.system}});
    chat.messages.push_back({{"role", "user"}, {"content", args.prompt}});
    auto rendered = chat_template->Render(chat);
    if (!rendered.ok()) {
      std::fprintf(stderr, "error: %s\n", rendered.status().ToString().c_str());
      return 1;
    }
    text = std::move(*rendered);
    parse_special = true;  // the template's markers are control tokens
    add_special = add_special && !chat_template->StartsWithBos(text);
    std::fprintf(stderr, "chat template: %s\n", chat_template->Describe().c_str());
  }

  const auto ids = tok.Encode(text, {.add_special = add_special, .parse_special = parse_special});
  if (args.ids_only) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::printf("%s\n", line.c_str());
  } else {
    for (model::TokenId id : ids) {
      std::printf("%6d '%s'\n", id, Printable(tok.Piece(id, /*render_special=*/true)).c_str());
    }
  }
  std::fprintf(stderr, "%zu tokens\n", ids.size());
  return 0;
}

std::function<int()> SetupTokenize(CLI::App& app, const GlobalOptions&) {
  auto args = std::make_shared<TokenizeArgs>();
  app.add_option("--model-path,-m", args->model_path, "GGUF model or vocabulary file")->required();
  app.add_option("--prompt,-p", args->prompt, "text to tokenize")->required();
  app.add_flag("--ids-only", args->ids_only, "print only the ids, space-separated, on one line");
  app.add_flag("--no-bos", args->no_bos, "do not add BOS/EOS even if the vocabulary asks for them");
  app.add_flag("--parse-special", args->parse_special,
               "match control tokens written in the prompt (e.g. <|im_end|>)");
  app.add_flag("--chat", args->chat, "wrap the prompt as a user message in the chat template");
  AddChatTemplateOptions(app, &args->chat_template);
  app.add_option("--system", args->system, "system message (with --chat)");
  return [args] { return RunTokenize(*args); };
}

const bool kRegistered =
    RegisterCommand({"tokenize", "print the tokens of a prompt (tokenizer debugging)", SetupTokenize});

}  // namespace
}  // namespace polychip::cli
