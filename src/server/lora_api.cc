#include "server/lora_api.h"

namespace polychip::server {

using nlohmann::json;

bool IsAdapterModel(const model::LoraRegistry* loras, const std::string& model) {
  return loras != nullptr && !model.empty() && loras->Find(model) != nullptr;
}

std::optional<ApiError> ResolveAdapter(const model::LoraRegistry* loras, const json& body,
                                       ApiRequest* req) {
  std::optional<float> scale;
  if (auto it = body.find("lora_scale"); it != body.end() && !it->is_null()) {
    if (!it->is_number()) return BadRequest("lora_scale", "lora_scale must be a number");
    scale = it->get<float>();
  }
  std::vector<std::shared_ptr<const model::LoraAdapter>> per_input(req->inputs.size());
  if (loras != nullptr) {
    if (auto a = loras->Find(req->model)) per_input.assign(req->inputs.size(), a);
  }
  if (auto it = body.find("lora_path"); it != body.end() && !it->is_null()) {
    auto lookup = [&](const json& v) -> std::optional<ApiError> {
      if (!v.is_string()) return BadRequest("lora_path", "lora_path must be a string or a list");
      return std::nullopt;
    };
    std::vector<json> keys;
    if (it->is_array()) {
      if (it->size() != req->inputs.size()) {
        return BadRequest("lora_path", "lora_path has " + std::to_string(it->size()) +
                                           " entries for " + std::to_string(req->inputs.size()) +
                                           " inputs");
      }
      keys.assign(it->begin(), it->end());
    } else {
      keys.assign(req->inputs.size(), *it);
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i].is_null()) continue;  // the base model
      if (auto e = lookup(keys[i])) return e;
      const std::string key = keys[i].get<std::string>();
      auto a = loras ? loras->FindByNameOrPath(key) : nullptr;
      if (!a) {
        return BadRequest("lora_path", "no LoRA adapter '" + key +
                                           "' is loaded (POST /v1/load_lora_adapter, or --lora)");
      }
      per_input[i] = std::move(a);
    }
  }
  for (size_t i = 0; i < req->inputs.size(); ++i) {
    if (!per_input[i]) continue;
    req->inputs[i].adapter_scale = scale.value_or(per_input[i]->default_scale());
    req->inputs[i].adapter = std::move(per_input[i]);
  }
  return std::nullopt;
}

json AdapterModels(const model::LoraRegistry* loras, const std::string& base, int64_t created,
                   int64_t max_model_len) {
  json data = json::array();
  if (loras == nullptr) return data;
  for (const auto& a : loras->List()) {
    data.push_back({{"id", a->name()},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "polychip"},
                    {"root", a->path()},
                    {"parent", base},
                    {"max_model_len", max_model_len}});
  }
  return data;
}

json AdapterInfo(const model::LoraRegistry* loras) {
  json list = json::array();
  if (loras == nullptr) return list;
  for (const auto& a : loras->List()) {
    list.push_back({{"id", a->id()},
                    {"name", a->name()},
                    {"path", a->path()},
                    {"scale", a->default_scale()},
                    {"alpha", a->alpha()},
                    {"rank", a->max_rank()},
                    {"matrices", a->pairs().size()}});
  }
  return list;
}

namespace {

std::pair<int, std::string> JsonError(int status, const std::string& message,
                                      const std::string& param) {
  ApiError e;
  e.status = status;
  e.message = message;
  e.param = param;
  if (status == 404) e.type = "not_found_error";
  return {status, e.ToJson().dump()};
}

std::optional<std::string> StringField(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) return std::nullopt;
  return it->get<std::string>();
}

}  // namespace

std::pair<int, std::string> LoadAdapter(model::LoraRegistry* loras, const json& body) {
  if (loras == nullptr) return JsonError(400, "this server runs without LoRA adapters", "");
  const auto name = StringField(body, "lora_name");
  const auto path = StringField(body, "lora_path");
  if (!name) return JsonError(400, "lora_name (a string) is required", "lora_name");
  if (!path) return JsonError(400, "lora_path (a string) is required", "lora_path");
  model::LoraSpec spec{*name, *path, 1};
  if (auto it = body.find("lora_scale"); it != body.end() && it->is_number()) {
    spec.scale = it->get<float>();
  }
  auto loaded = loras->Load(spec);
  if (!loaded.ok()) return JsonError(400, loaded.status().message(), "lora_path");
  return {200, "Success: LoRA adapter '" + *name + "' added successfully."};
}

std::pair<int, std::string> UnloadAdapter(model::LoraRegistry* loras, const json& body) {
  if (loras == nullptr) return JsonError(400, "this server runs without LoRA adapters", "");
  const auto name = StringField(body, "lora_name");
  if (!name) return JsonError(400, "lora_name (a string) is required", "lora_name");
  if (Status s = loras->Unload(*name); !s.ok()) return JsonError(404, s.message(), "lora_name");
  return {200, "Success: LoRA adapter '" + *name + "' removed successfully."};
}

}  // namespace polychip::server
