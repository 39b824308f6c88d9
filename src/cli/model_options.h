// The chat template options of the commands that render chats (serve, run, tokenize, template),
// written once so their spelling, help text and validation stay the same everywhere; serve takes
// them from the launch table (launch/launch_options.h) to have them as config keys too.
#pragma once

#include <string>

#include "model/chat_template.h"
#include "util/status.h"

namespace CLI {
class App;
}

namespace polychip::cli {

// --chat-template NAME, --chat-template-file F.jinja, --chat-template-kwargs JSON: the flags
// that choose how a chat is rendered (the model's own template by default).
struct ChatTemplateFlags {
  std::string family;
  std::string file;
  std::string kwargs_json;
};
void AddChatTemplateOptions(CLI::App& app, ChatTemplateFlags* flags);
// Errors: kwargs that are not a JSON object.
StatusOr<model::ChatTemplateOptions> ResolveChatTemplateFlags(const ChatTemplateFlags& flags);

}  // namespace polychip::cli
