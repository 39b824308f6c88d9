// Options shared by the commands that run a model (run, perplexity, serve, bench), written once
// so their spelling, help text and validation stay the same everywhere.
#pragma once

#include <string>

#include "model/chat_template.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace CLI {
class App;
}

namespace polychip::cli {

// --tp-size and --pp-size: ranks = tp x pp, one process per rank (dist/parallel.h).
void AddParallelOptions(CLI::App& app, int* tp_size, int* pp_size);

// The KV cache element type named on the command line ("f16", "f32", "bf16").
StatusOr<DType> ParseKvCacheType(const std::string& name);

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
