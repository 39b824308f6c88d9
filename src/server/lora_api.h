// The server's side of LoRA adapters (model/lora.h): which adapter a request runs (its `model`
// names one, or SGLang's `lora_path`; `lora_scale` overrides its scale), the adapters listed by
// /v1/models (with their `parent`) and /get_server_info, and vLLM's run-time routes
// POST /v1/load_lora_adapter {"lora_name", "lora_path"} and /v1/unload_lora_adapter
// {"lora_name"}.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "model/lora.h"
#include "server/api.h"

namespace polychip::server {

// Whether `model` is the name of a loaded adapter.
bool IsAdapterModel(const model::LoraRegistry* loras, const std::string& model);

// Sets the adapter of every input of `req` from its model, `lora_path` (a name or path; a list
// gives one per input, as SGLang's batch) and `lora_scale`. A lora_path naming no loaded adapter
// is a 400.
std::optional<ApiError> ResolveAdapter(const model::LoraRegistry* loras, const nlohmann::json& body,
                                       ApiRequest* req);

// /v1/models' entries of the adapters, each with `parent` = `base`.
nlohmann::json AdapterModels(const model::LoraRegistry* loras, const std::string& base,
                             int64_t created, int64_t max_model_len);
// /get_server_info's "lora_adapters".
nlohmann::json AdapterInfo(const model::LoraRegistry* loras);

// The routes' work: (HTTP status, body text or JSON) as vLLM answers (a text line on success).
std::pair<int, std::string> LoadAdapter(model::LoraRegistry* loras, const nlohmann::json& body);
std::pair<int, std::string> UnloadAdapter(model::LoraRegistry* loras, const nlohmann::json& body);

}  // namespace polychip::server
