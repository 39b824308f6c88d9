// include/polychip/polychip.h over the framework: the same building blocks as `polychip run`
// and `polychip serve` (model::OpenModelFile, the launch builder, engine::Engine), behind C
// entry points that never let an exception out.
#include "polychip/polychip.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "api/plugin_listing.h"
#include "dist/parallel.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "launch/launch.h"
#include "launch/launch_options.h"
#include "model/lora.h"
#include "model/runner.h"
#include "model/runner_setup.h"
#include "model/tokenizer.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/plugin_loader.h"
#include "util/status.h"

struct polychip_error {
  polychip_code_t code;
  std::string message;
};

struct polychip_model {
  polychip::model::ModelFile file;
  std::unique_ptr<polychip::engine::ModelRunner> runner;
  std::unique_ptr<polychip::launch::DraftModel> draft;  // speculative decoding's, or null
  // The adapters of the `lora` settings; requests hold what they name until they end.
  std::unique_ptr<polychip::model::LoraRegistry> loras;
  std::unique_ptr<polychip::engine::Engine> engine;  // after the runner it drives: freed first
  std::string description;
  std::atomic<int64_t> next_request{0};
};

namespace polychip::api {
namespace {

// StatusCode and polychip_code_t list the same codes in the same order (as pc_code_t does).
static_assert(static_cast<int>(StatusCode::kInternal) == POLYCHIP_CODE_INTERNAL);
static_assert(static_cast<int>(StatusCode::kResourceExhausted) ==
              POLYCHIP_CODE_RESOURCE_EXHAUSTED);

polychip_error_t* ToError(const Status& status) {
  if (status.ok()) return nullptr;
  return new polychip_error{static_cast<polychip_code_t>(status.code()), status.message()};
}

// Runs an entry point's body; an exception (a bug, or std::bad_alloc) becomes INTERNAL.
template <typename Body>
polychip_error_t* Guard(Body&& body) noexcept {
  try {
    return ToError(body());
  } catch (const std::exception& e) {
    return ToError(Internal(std::string("polychip: ") + e.what()));
  } catch (...) {
    return ToError(Internal("polychip: unknown exception"));
  }
}

// Members beyond the caller's struct_size are absent: the caller was built against an older
// header, and the member keeps its default.
#define POLYCHIP_HAS_MEMBER(s, type, member) \
  ((s) != nullptr && (s)->struct_size >= offsetof(type, member) + sizeof(((type*)0)->member))

runtime::PluginParams ToParams(const polychip_param_t* params, size_t n) {
  runtime::PluginParams out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back(params[i].key ? params[i].key : "", params[i].value ? params[i].value : "");
  }
  return out;
}

// <the folder of libpolychip.so>/polychip: where `cmake --install` puts the plugins, so an
// embedding program finds them wherever it lives (the loader's own default is relative to the
// executable, which for an embedding program is not polychip's).
std::vector<std::string> LibrarySearchDirs() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&polychip_api_version), &info) == 0 || !info.dli_fname) {
    return {};
  }
  std::error_code ec;
  const auto lib = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) return {};
  return {(lib.parent_path() / "polychip").string()};
}

Status CheckNotNull(const void* p, const char* what) {
  return p ? Status::Ok() : InvalidArgument(std::string(what) + " is NULL");
}

// The polychip_model_params_t settings: a launch spec whose params are `polychip serve`'s
// options by their config key (launch/launch_options.h), with the same checks.
StatusOr<launch::LaunchSpec> ReadSettings(const polychip_model_params_t* p) {
  launch::LaunchSpec s;
  if (p == nullptr) return s;
  if (POLYCHIP_HAS_MEMBER(p, polychip_model_params_t, device) && p->device) s.device = p->device;
  if (POLYCHIP_HAS_MEMBER(p, polychip_model_params_t, config_path) && p->config_path) {
    s.config_path = p->config_path;
  }
  if (!POLYCHIP_HAS_MEMBER(p, polychip_model_params_t, n_params) || p->params == nullptr) return s;
  std::vector<std::string> keys;
  for (const launch::Option& o : launch::Options()) {
    if (o.scope & (launch::kScopeModel | launch::kScopeServe)) keys.push_back(o.name);
  }
  for (const auto& [key, value] : ToParams(p->params, p->n_params)) {
    const launch::Option* o = launch::FindOption(key);
    if (o == nullptr || o->name == "model-path") {
      const std::string near = launch::Nearest(key, keys);
      return InvalidArgument("unknown model parameter '" + key + "'" +
                             (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                             "; the keys are polychip serve's options (docs/configuration.md)");
    }
    if (Status st = o->set(s, value); !st.ok()) {
      return InvalidArgument("model parameter " + key + ": " + st.message());
    }
  }
  PC_RETURN_IF_ERROR(launch::Validate(s));
  return s;
}

// Loads the backend the settings select (or the best one discovered) with the library's own
// plugin folder on the search path, so that the runner's device lookup below finds it loaded.
// Returns the --device value naming it.
StatusOr<std::string> SelectBackend(const launch::LaunchSpec& s) {
  PC_ASSIGN_OR_RETURN(runtime::RuntimeConfig config, launch::RuntimeConfigOf(s));
  for (std::string& dir : LibrarySearchDirs()) config.extra_search_path.push_back(dir);
  // RuntimeConfigOf gave the named backend its threads; a discovered one gets them here, as
  // model::OpenDevice below would pass them (it finds this load and reuses it).
  const runtime::PluginParams params = model::ThreadsParams(s.threads);
  PC_ASSIGN_OR_RETURN(runtime::Selection selection,
                      runtime::SelectPlugins(config, runtime::Discovery::kBest, params));
  if (!selection.backend) {
    return NotFound("no device backend found (pass a device, e.g. \"cpu:0\")");
  }
  return s.device.empty() && !config.backend ? selection.backend->name() : s.device;
}

Status LoadModel(const char* path, const polychip_model_params_t* params,
                 polychip_model_t** out) {
  PC_RETURN_IF_ERROR(CheckNotNull(path, "path"));
  PC_RETURN_IF_ERROR(CheckNotNull(out, "model"));
  *out = nullptr;
  PC_ASSIGN_OR_RETURN(launch::LaunchSpec spec, ReadSettings(params));
  PC_RETURN_IF_ERROR(launch::CheckModelPath(path));
  auto m = std::make_unique<polychip_model>();
  PC_ASSIGN_OR_RETURN(m->file, model::OpenModelFile(path));
  // The adapters first: a mismatch with the model fails before the device is touched.
  m->loras = std::make_unique<model::LoraRegistry>(m->file.config);
  PC_RETURN_IF_ERROR(launch::LoadLoras(spec, *m->loras));
  PC_ASSIGN_OR_RETURN(spec.device, SelectBackend(spec));
  // One rank: several ranks would start copies of the embedding program itself.
  spec.tp_size = spec.pp_size = 1;
  PC_ASSIGN_OR_RETURN(auto device,
                      model::OpenDevice(spec.config_path, spec.device, spec.threads));
  PC_ASSIGN_OR_RETURN(launch::ResolvedLaunch launch,
                      launch::Resolve(spec, m->file, device.get()));
  PC_ASSIGN_OR_RETURN(m->runner, launch::CreateRunner(launch, m->file, std::move(device)));
  m->description = m->file.config.Summary() + " on " + dist::DescribeRunner(*m->runner);

  PC_ASSIGN_OR_RETURN(m->draft, launch::CreateDraft(launch, m->file));
  const model::Tokenizer* tok = m->file.tokenizer.get();
  m->engine = std::make_unique<engine::Engine>(
      m->runner.get(), launch.engine, [tok](int32_t t) { return tok->Piece(t); },
      tok->eog_ids(), m->draft ? m->draft->runner.get() : nullptr);
  m->engine->Start();
  *out = m.release();
  return Status::Ok();
}

engine::SamplingParams ToSamplingParams(const polychip_sampling_t* in) {
  polychip_sampling_t s;
  polychip_sampling_init(&s);
  if (in != nullptr) std::memcpy(&s, in, std::min(in->struct_size, sizeof(s)));
  engine::SamplingParams p;
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.frequency_penalty = s.frequency_penalty;
  p.presence_penalty = s.presence_penalty;
  if (s.seed >= 0) p.seed = static_cast<uint64_t>(s.seed);
  p.max_tokens = s.max_tokens;
  p.ignore_eos = s.ignore_eos != 0;
  p.want_logprob = false;
  for (size_t i = 0; s.stop != nullptr && i < s.n_stop; ++i) {
    if (s.stop[i] != nullptr) p.stop.emplace_back(s.stop[i]);
  }
  return p;
}

Status Generate(polychip_model_t* m, const polychip_request_t* in, polychip_result_t* result) {
  PC_RETURN_IF_ERROR(CheckNotNull(m, "model"));
  PC_RETURN_IF_ERROR(CheckNotNull(in, "request"));
  polychip_request_t r;
  polychip_request_init(&r);
  std::memcpy(&r, in, std::min(in->struct_size, sizeof(r)));

  engine::GenerateInput input;
  input.rid = "api-" + std::to_string(m->next_request.fetch_add(1));
  if (r.prompt_tokens != nullptr) {
    input.prompt.assign(r.prompt_tokens, r.prompt_tokens + r.n_prompt_tokens);
  } else {
    PC_RETURN_IF_ERROR(CheckNotNull(r.prompt, "request prompt"));
    model::EncodeOptions enc;
    enc.add_special = true;
    enc.parse_special = true;  // as `polychip run`
    input.prompt = m->file.tokenizer->Encode(std::string_view(r.prompt, r.prompt_len), enc);
  }
  if (input.prompt.empty()) return InvalidArgument("the prompt is empty after tokenization");
  input.params = ToSamplingParams(r.sampling);
  input.priority = r.priority;
  if (POLYCHIP_HAS_MEMBER(&r, polychip_request_t, lora) && r.lora != nullptr) {
    std::shared_ptr<const model::LoraAdapter> adapter = m->loras->FindByNameOrPath(r.lora);
    if (!adapter) {
      std::string loaded;
      for (const auto& a : m->loras->List()) loaded += (loaded.empty() ? "" : ", ") + a->name();
      return NotFound("no LoRA adapter '" + std::string(r.lora) + "' (loaded with the model: " +
                      (loaded.empty() ? "none; give the lora setting NAME=PATH" : loaded) + ")");
    }
    const bool scaled = POLYCHIP_HAS_MEMBER(&r, polychip_request_t, lora_scale) &&
                        r.lora_scale != 0;
    input.adapter_scale = scaled ? r.lora_scale : adapter->default_scale();
    input.adapter = std::move(adapter);
  }
  PC_ASSIGN_OR_RETURN(auto stream, m->engine->Submit(std::move(input)));

  bool cancelled = false;
  auto deliver = [&](int32_t token, const std::string& text) {
    if (cancelled || r.on_token == nullptr) return;
    if (r.on_token(r.user_data, token, text.data(), text.size()) != 0) {
      cancelled = true;
      m->engine->Abort(stream);
    }
  };
  for (;;) {
    for (engine::StreamEvent& ev : stream->Pop(std::chrono::milliseconds(100))) {
      // The event's text is what its tokens completed: it goes with the last of them.
      for (size_t i = 0; i < ev.tokens.size(); ++i) {
        deliver(ev.tokens[i], i + 1 == ev.tokens.size() ? ev.text : std::string());
      }
      if (ev.tokens.empty() && !ev.text.empty()) deliver(-1, ev.text);
      if (!ev.finished) continue;
      if (!ev.error.ok() && !(cancelled && ev.error.code() == StatusCode::kCancelled)) {
        return ev.error;
      }
      if (result != nullptr) {
        polychip_result_t out{};
        out.struct_size = sizeof(out);
        out.finish = cancelled                              ? POLYCHIP_FINISH_CANCELLED
                     : ev.finish == engine::FinishReason::kLength ? POLYCHIP_FINISH_LENGTH
                                                                  : POLYCHIP_FINISH_STOP;
        out.prompt_tokens = ev.prompt_tokens;
        out.completion_tokens = ev.completion_tokens;
        out.cached_tokens = ev.cached_tokens;
        std::memcpy(result, &out, std::min(result->struct_size, sizeof(out)));
      }
      return Status::Ok();
    }
  }
}

// The convention of polychip_tokenize/detokenize: report the size, copy only if it fits.
template <typename T>
Status CopyOut(const std::vector<T>& data, T* out, size_t capacity, size_t* size,
               const char* what) {
  PC_RETURN_IF_ERROR(CheckNotNull(size, what));
  *size = data.size();
  if (data.size() > capacity) {
    return ResourceExhausted(std::string(what) + ": " + std::to_string(data.size()) +
                             " needed, capacity " + std::to_string(capacity));
  }
  if (!data.empty()) std::memcpy(out, data.data(), data.size() * sizeof(T));
  return Status::Ok();
}

}  // namespace
}  // namespace polychip::api

using polychip::Status;
using polychip::api::Guard;

extern "C" {

void polychip_api_version(uint32_t* major, uint32_t* minor) {
  if (major) *major = POLYCHIP_API_MAJOR;
  if (minor) *minor = POLYCHIP_API_MINOR;
}

polychip_code_t polychip_error_code(const polychip_error_t* error) {
  return error ? error->code : POLYCHIP_CODE_OK;
}
const char* polychip_error_message(const polychip_error_t* error) {
  return error ? error->message.c_str() : "";
}
void polychip_error_free(polychip_error_t* error) { delete error; }
void polychip_string_free(char* text) { delete[] text; }

polychip_error_t* polychip_register_backend_table(const struct pc_backend_iface* table,
                                                  const polychip_param_t* params,
                                                  size_t n_params) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(table, "table"));
    PC_ASSIGN_OR_RETURN(auto backend,
                        polychip::runtime::PluginRegistry::Global().RegisterBackendTable(
                            table, polychip::api::ToParams(params, n_params)));
    polychip::api::MarkRegisteredByProgram(polychip::runtime::PluginKind::kBackend,
                                           backend->name());
    return Status::Ok();
  });
}

polychip_error_t* polychip_register_backend_path(const char* path, const polychip_param_t* params,
                                                 size_t n_params) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(path, "path"));
    PC_ASSIGN_OR_RETURN(auto backend,
                        polychip::runtime::LoadBackendFromPath(
                            path, polychip::api::ToParams(params, n_params)));
    polychip::api::MarkRegisteredByProgram(polychip::runtime::PluginKind::kBackend,
                                           backend->name());
    return Status::Ok();
  });
}

polychip_error_t* polychip_register_comm_table(const struct pc_comm_iface* table,
                                               const polychip_param_t* params, size_t n_params) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(table, "table"));
    PC_ASSIGN_OR_RETURN(auto comm, polychip::runtime::PluginRegistry::Global().RegisterCommTable(
                                       table, polychip::api::ToParams(params, n_params)));
    polychip::api::MarkRegisteredByProgram(polychip::runtime::PluginKind::kComm, comm->name());
    return Status::Ok();
  });
}

polychip_error_t* polychip_register_comm_path(const char* path, const polychip_param_t* params,
                                              size_t n_params) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(path, "path"));
    PC_ASSIGN_OR_RETURN(auto comm, polychip::runtime::LoadCommFromPath(
                                       path, polychip::api::ToParams(params, n_params)));
    polychip::api::MarkRegisteredByProgram(polychip::runtime::PluginKind::kComm, comm->name());
    return Status::Ok();
  });
}

polychip_error_t* polychip_list_plugins(uint32_t flags, char** text) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(text, "text"));
    *text = nullptr;
    polychip::runtime::RuntimeConfig config;
    config.extra_search_path = polychip::api::LibrarySearchDirs();
    PC_ASSIGN_OR_RETURN(auto listing,
                        polychip::api::ListPlugins(
                            config, (flags & POLYCHIP_LIST_DISCOVER)
                                        ? polychip::api::ListingScope::kDiscovered
                                        : polychip::api::ListingScope::kLoaded));
    const std::string s = (flags & POLYCHIP_LIST_JSON)
                              ? listing.dump(2)
                              : polychip::api::RenderPluginListing(listing);
    *text = new char[s.size() + 1];
    std::memcpy(*text, s.c_str(), s.size() + 1);
    return Status::Ok();
  });
}

void polychip_model_params_init(polychip_model_params_t* params) {
  if (params == nullptr) return;
  *params = polychip_model_params_t{};
  params->struct_size = sizeof(*params);
}

polychip_error_t* polychip_model_load(const char* path, const polychip_model_params_t* params,
                                      polychip_model_t** model) {
  return Guard([&] { return polychip::api::LoadModel(path, params, model); });
}

void polychip_model_free(polychip_model_t* model) {
  try {
    if (model && model->engine) model->engine->Stop();
    delete model;
  } catch (...) {
    // Nothing can be reported from here; the model is gone either way.
  }
}

int32_t polychip_model_vocab_size(const polychip_model_t* model) {
  return model ? static_cast<int32_t>(model->runner->vocab_size()) : 0;
}

int64_t polychip_model_context_length(const polychip_model_t* model) {
  return model ? model->engine->context_length() : 0;
}

const char* polychip_model_describe(const polychip_model_t* model) {
  return model ? model->description.c_str() : "";
}

polychip_error_t* polychip_tokenize(const polychip_model_t* model, const char* text,
                                    size_t text_len, int32_t add_special, int32_t parse_special,
                                    int32_t* tokens, size_t capacity, size_t* n_tokens) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(model, "model"));
    if (text_len > 0) PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(text, "text"));
    polychip::model::EncodeOptions enc;
    enc.add_special = add_special != 0;
    enc.parse_special = parse_special != 0;
    const std::vector<int32_t> ids =
        model->file.tokenizer->Encode(std::string_view(text, text_len), enc);
    return polychip::api::CopyOut(ids, tokens, capacity, n_tokens, "tokens");
  });
}

polychip_error_t* polychip_detokenize(const polychip_model_t* model, const int32_t* tokens,
                                      size_t n_tokens, int32_t render_special, char* text,
                                      size_t capacity, size_t* text_len) {
  return Guard([&]() -> Status {
    PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(model, "model"));
    if (n_tokens > 0) PC_RETURN_IF_ERROR(polychip::api::CheckNotNull(tokens, "tokens"));
    const int32_t n_vocab = model->file.tokenizer->n_vocab();
    for (size_t i = 0; i < n_tokens; ++i) {
      if (tokens[i] < 0 || tokens[i] >= n_vocab) {
        return polychip::InvalidArgument("token " + std::to_string(tokens[i]) +
                                         " is outside the vocabulary (" +
                                         std::to_string(n_vocab) + " tokens)");
      }
    }
    polychip::model::DecodeOptions dec;
    dec.render_special = render_special != 0;
    const std::string s = model->file.tokenizer->Decode({tokens, n_tokens}, dec);
    return polychip::api::CopyOut(std::vector<char>(s.begin(), s.end()), text, capacity,
                                  text_len, "text");
  });
}

void polychip_sampling_init(polychip_sampling_t* sampling) {
  if (sampling == nullptr) return;
  *sampling = polychip_sampling_t{};
  sampling->struct_size = sizeof(*sampling);
  sampling->temperature = 0.f;
  sampling->top_p = 1.f;
  sampling->repetition_penalty = 1.f;
  sampling->seed = -1;
  sampling->max_tokens = 128;
}

void polychip_request_init(polychip_request_t* request) {
  if (request == nullptr) return;
  *request = polychip_request_t{};
  request->struct_size = sizeof(*request);
}

polychip_error_t* polychip_generate(polychip_model_t* model, const polychip_request_t* request,
                                    polychip_result_t* result) {
  return Guard([&] { return polychip::api::Generate(model, request, result); });
}

}  // extern "C"
