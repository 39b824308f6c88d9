#include "cli/model_options.h"

#include <CLI/CLI.hpp>

#include "dist/parallel.h"

namespace polychip::cli {

void AddParallelOptions(CLI::App& app, int* tp_size, int* pp_size) {
  app.add_option("--tp-size", *tp_size,
                 "tensor-parallel ranks, one process each (--device emu:0,1: a device per rank)")
      ->check(CLI::Range(1, 64));
  app.add_option("--pp-size", *pp_size,
                 "pipeline stages (layers split), one process per rank; ranks = tp x pp")
      ->check(CLI::Range(1, 64));
  // Several hosts, spelled as SGLang spells them (dist/parallel.h).
  dist::LaunchFlags& f = dist::GlobalLaunchFlags();
  app.add_option("--nnodes", f.nnodes, "hosts (nodes) of the job; each lists its own --device")
      ->check(CLI::Range(1, 1024));
  app.add_option("--node-rank", f.node_rank, "this node's index, 0..nnodes-1 (0 serves)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--dist-init-addr", f.dist_init_addr,
                 "HOST:PORT where node 0 serves the job's bootstrap store");
  app.add_option("--dist-token", f.dist_token,
                 "secret shared by every node of the job (default: env POLYCHIP_DIST_TOKEN)");
  app.add_option_function<double>(
      "--dist-timeout", [&f](double s) { f.dist_timeout_ms = int64_t(s * 1000); },
      "seconds to wait for every node and rank at start-up (default 60)");
  app.add_option("--comm-tp", f.comm_tp, "comm plugin of the tensor-parallel groups (pins it)");
  app.add_option("--comm-pp", f.comm_pp, "comm plugin of the pipeline groups (pins it)");
  app.add_option("--comm-world", f.comm_world,
                 "comm plugin of the world (step broadcast, logits) (pins it)");
}

StatusOr<DType> ParseKvCacheType(const std::string& name) {
  auto type = DTypeFromName(name);
  if (!type) return InvalidArgument("unknown KV cache type " + name);
  return *type;
}

}  // namespace polychip::cli

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
