// `polychip serve`: the OpenAI- and SGLang-compatible HTTP server. Its options are the launch
// table's (launch/launch_options.h): each flag is also a key of the YAML file given with
// --config (`max_running_requests: 64`, dashes or underscores), the command line wins, and an
// unknown key is an error. `--print-config` prints the resolved launch and exits.
// SIGINT/SIGTERM stop accepting, give running requests --shutdown-timeout seconds to finish,
// cancel the rest (streams end with finish_reason "abort" and [DONE]) and exit 0.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "cli/command.h"
#include "cli/launch_flags.h"
#include "cli/model_options.h"
#include "cli/serve_reload.h"
#include "dist/parallel.h"
#include "engine/engine.h"
#include "launch/launch.h"
#include "launch/launch_options.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "server/http_server.h"
#include "server/text_codec.h"

namespace polychip::cli {
namespace {

struct ServeCli {
  GivenFlags flags;
  bool print_config = false;
};

std::atomic<bool> g_stop{false};
extern "C" void OnSignal(int) { g_stop.store(true); }
// SIGHUP: re-read --config and reload the backend if it changed (serve_reload.h).
std::atomic<bool> g_reload{false};
extern "C" void OnHangup(int) { g_reload.store(true); }

// --print-config: the launch as a config file would give it; with a model, also what it
// resolves to on the device (the plugin is loaded, the weights are not).
int PrintConfig(const launch::LaunchSpec& spec, const launch::Sources& sources) {
  std::printf("%s", launch::PrintConfig(spec, launch::kScopeServe, sources).c_str());
  auto runtime = launch::RuntimeConfigOf(spec);
  if (!runtime.ok()) return Fail(runtime.status());
  std::printf("# runtime: backend %s%s%s\n",
              runtime->backend ? runtime->backend->name.c_str() : "(the best one discovered)",
              runtime->backend_source.empty() ? "" : ", from ",
              runtime->backend_source.c_str());
  if (spec.model_path.empty()) return 0;
  if (Status s = launch::CheckModelPath(spec.model_path); !s.ok()) return Fail(s);
  auto mf = model::OpenModelFile(spec.model_path);
  if (!mf.ok()) return Fail(mf.status());
  auto device = model::OpenDevice(spec.config_path, spec.device, spec.threads);
  if (!device.ok()) return Fail(device.status());
  auto resolved = launch::Resolve(spec, *mf, device->get());
  if (!resolved.ok()) return Fail(resolved.status());
  std::printf("# resolved on %s: %s\n", (*device)->props().name.c_str(),
              resolved->kv.Describe().c_str());
  return 0;
}

int Serve(const GlobalOptions& globals, const ServeCli& cli) {
  launch::Sources sources;
  auto spec_or = BuildSpec(globals, launch::kScopeServe, cli.flags, &sources);
  if (!spec_or.ok()) return Fail(spec_or.status());
  const launch::LaunchSpec& spec = *spec_or;
  if (cli.print_config) return PrintConfig(spec, sources);
  if (spec.model_path.empty()) {
    return Fail(InvalidArgument("give the model: --model-path FILE.gguf (or --model, or as the "
                                "first argument)"));
  }
  if (Status s = launch::CheckModelPath(spec.model_path); !s.ok()) return Fail(s);

  auto device = model::OpenDevice(spec.config_path, spec.device, spec.threads);
  if (!device.ok()) return Fail(device.status());
  auto mf = model::OpenModelFile(spec.model_path);
  if (!mf.ok()) return Fail(mf.status());
  // The adapters of --lora, checked against the model before anything is loaded.
  auto loras = std::make_shared<model::LoraRegistry>(mf->config);
  if (Status s = launch::LoadLoras(spec, *loras); !s.ok()) return Fail(s);
  auto resolved = launch::Resolve(spec, *mf, device->get());
  if (!resolved.ok()) return Fail(resolved.status());
  spdlog::info("polychip serve: {}", resolved->kv.Describe());

  // One rank: a runner whose plugin can be hot reloaded. tp_size x pp_size > 1: one process per
  // rank (dist/parallel.h); rank 0 serves, and in the other ranks this call never returns.
  const int ranks = spec.tp_size * spec.pp_size;
  model::ReloadableRunner* reloadable = nullptr;
  StatusOr<std::unique_ptr<engine::ModelRunner>> runner = Internal("no runner");
  if (ranks == 1 && !dist::IsFollowerRank(spec.dist)) {
    // The runner holds the device from now on: a reload must be able to close it.
    auto r = launch::CreateReloadableRunner(*resolved, *mf, std::move(*device));
    if (!r.ok()) return Fail(r.status());
    reloadable = r->get();
    runner = std::unique_ptr<engine::ModelRunner>(std::move(*r));
  } else {
    runner = launch::CreateRunner(*resolved, *mf, nullptr);
  }
  if (!runner.ok()) return Fail(runner.status());
  auto chat_options = ResolveChatTemplateFlags(
      {spec.chat_template, spec.chat_template_file, spec.chat_template_kwargs});
  if (!chat_options.ok()) return Fail(chat_options.status());
  auto codec = server::MakeTokenizerCodec(mf->tokenizer.get(), *chat_options);
  if (!codec.ok()) return Fail(codec.status());
  {
    const server::OutputFormat f = (*codec)->output_format();
    spdlog::info(
        "polychip serve: tool calls in the {} format{}, reasoning {}",
        server::ToolFormatName(f.tools),
        f.tools == server::ToolFormat::kGeneric ? " (the template names no known one)" : "",
        spec.reasoning_parser == "auto" ? server::ReasoningFormatName(f.reasoning)
                                        : std::string_view(spec.reasoning_parser));
  }

  auto draft = launch::CreateDraft(*resolved, *mf);
  if (!draft.ok()) return Fail(draft.status());
  const server::TextCodec* text = codec->get();
  engine::Engine engine(
      runner->get(), resolved->engine, [text](int32_t t) { return text->Piece(t); },
      text->EogTokens(), *draft ? (*draft)->runner.get() : nullptr);
  engine.Start();

  server::ServerOptions so;
  so.host = spec.host;
  so.port = spec.port;
  so.api_key = spec.api_key;
  std::string base = spec.model_path.substr(spec.model_path.find_last_of('/') + 1);
  so.model_name = spec.served_model_name.empty() ? base : spec.served_model_name;
  so.model_aliases = {spec.model_path, base, "default"};
  so.http_threads = spec.http_threads;
  so.pooling = spec.pooling == "mean" ? engine::Pooling::kMean : engine::Pooling::kLast;
  so.shutdown_timeout_s = spec.shutdown_timeout;
  so.http_limits = spec.http_limits;
  so.reasoning_parser = spec.reasoning_parser;
  // The device serving now: a hot reload replaces it, so it is asked each time, never held.
  std::function<std::shared_ptr<runtime::Device>()> current_device;
  if (reloadable != nullptr) {
    current_device = [reloadable] { return reloadable->device(); };
  } else {
    current_device = [dev = *device] { return dev; };
  }
  auto peak = std::make_shared<std::atomic<uint64_t>>(0);
  so.device_memory = [current_device, peak] {
    server::DeviceMemory m;
    uint64_t free_bytes = 0, total_bytes = 0;
    const std::shared_ptr<runtime::Device> dev = current_device();
    if (dev && dev->MemoryInfo(&free_bytes, &total_bytes).ok() && total_bytes >= free_bytes) {
      m.total_bytes = total_bytes;
      m.in_use_bytes = total_bytes - free_bytes;
      uint64_t p = peak->load();
      while (m.in_use_bytes > p && !peak->compare_exchange_weak(p, m.in_use_bytes)) {}
      m.peak_bytes = std::max(p, m.in_use_bytes);
    }
    return m;
  };
  so.server_info = {{"model_path", spec.model_path}, {"schedule_policy", spec.schedule_policy},
                    {"device", spec.device}, {"threads", spec.threads},
                    {"kv_cache_dtype", model::KvCacheDtypesText(launch::KvCacheDtypesOf(spec))}, {"tp_size", spec.tp_size},
                    {"pp_size", spec.pp_size}, {"nnodes", spec.dist.nnodes},
                    {"max_total_tokens", resolved->kv.kv_tokens},
                    {"speculative_algorithm",
                     engine::SpecAlgorithmName(resolved->engine.speculative.algorithm)},
                    {"speculative_num_draft_tokens",
                     resolved->engine.speculative.algorithm == engine::SpecAlgorithm::kNone
                         ? 0
                         : resolved->engine.speculative.num_draft_tokens},
                    {"comm_groups", dist::DescribeComms(**runner)}};
  ServeReloader reloader(&engine, reloadable, ranks, spec.config_path, spec.threads);
  so.admin_key = spec.admin_key;
  so.reload_plugin = [&reloader](const nlohmann::json& body) { return reloader.Handle(body); };
  so.live_info = [&reloader] { return reloader.Info(); };
  so.unavailable = [&reloader] { return reloader.Unavailable(); };
  so.enable_metrics = spec.enable_metrics;
  so.vllm_metrics = spec.vllm_metrics;
  so.loras = loras;
  server::HttpServer http(so, &engine, text);
  if (Status s = http.Bind(); !s.ok()) return Fail(s);

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGHUP, OnHangup);
  std::thread watcher([&http, &reloader] {
    while (!g_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (g_reload.exchange(false)) reloader.ReloadFromConfig();
    }
    http.Stop();
  });
  spdlog::info("polychip serve: model {} on {}:{} (context {}, {} KV blocks of {} tokens)",
               so.model_name, spec.host, http.port(), engine.context_length(),
               (*runner)->num_kv_blocks(), (*runner)->block_size());
  if ((*runner)->num_window_kv_blocks() > 0) {
    spdlog::info("polychip serve: sliding-window layers keep the last {} positions in a pool of "
                 "{} blocks (--swa-full-tokens-ratio {:g})",
                 (*runner)->kv_window(), (*runner)->num_window_kv_blocks(),
                 spec.swa_full_tokens_ratio);
  }
  std::fprintf(stderr, "listening on http://%s:%d\n", spec.host.c_str(), http.port());
  http.Run();
  g_stop.store(true);
  watcher.join();
  engine.Stop();
  spdlog::info("polychip serve: stopped");
  return 0;
}

std::function<int()> SetupServe(CLI::App& app, const GlobalOptions& globals) {
  auto cli = std::make_shared<ServeCli>();
  AddLaunchOptions(app, launch::kScopeServe, &cli->flags);
  // vLLM's `vllm serve MODEL`: the model as the first argument.
  app.add_option_function<std::string>(
      "model", [cli](const std::string& v) { cli->flags.emplace_back("model-path", v); },
      "GGUF model file (the same as --model-path)");
  app.add_flag("--print-config", cli->print_config,
               "print the resolved launch (flags, --config file, environment) as a config file "
               "and exit; with a model, also the context and KV cache it resolves to");
  return [&globals, cli] { return Serve(globals, *cli); };
}

const bool kRegistered =
    RegisterCommand({"serve", "OpenAI/SGLang-compatible HTTP server", SetupServe});

}  // namespace
}  // namespace polychip::cli
