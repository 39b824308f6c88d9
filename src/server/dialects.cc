#include "server/dialects.h"

#include <string_view>

#include "server/response_util.h"

namespace polychip::server {

using nlohmann::json;

std::optional<ApiError> ParseDialectRequest(ApiKind kind, const json& body, const TextCodec& codec,
                                            const ParseLimits& limits, ApiRequest* out) {
  // The body again with its keys in their order: JSON schemas are generated in that order.
  auto raw = nlohmann::ordered_json::parse(limits.raw_body, nullptr, /*allow_exceptions=*/false);
  if (!raw.is_object()) raw = nlohmann::ordered_json::parse(body.dump());
  DialectRequest d;
  if (auto e = kind == ApiKind::kMessages ? MessagesToChat(raw, limits, &d)
                                          : ResponsesToChat(raw, limits, &d)) {
    return e;
  }
  const std::string chat_text = d.chat.dump();
  ParseLimits chat_limits = limits;
  chat_limits.raw_body = chat_text;
  if (auto e = ParseApiRequest(ApiKind::kChat, json::parse(chat_text), codec, chat_limits, out)) {
    // The chat parser names chat fields: name the dialect's.
    static constexpr std::pair<std::string_view, std::string_view> kMessagesNames[] = {
        {"stop", "stop_sequences"}, {"max_tokens", "max_tokens"}};
    static constexpr std::pair<std::string_view, std::string_view> kResponsesNames[] = {
        {"max_tokens", "max_output_tokens"},
        {"response_format", "text.format"},
        {"messages", "input"},
        {"prompt", "input"}};
    if (kind == ApiKind::kMessages) {
      for (const auto& [chat, own] : kMessagesNames) {
        if (e->param == chat) e->param = own;
      }
    } else {
      for (const auto& [chat, own] : kResponsesNames) {
        if (e->param == chat) e->param = own;
      }
    }
    return e;
  }
  out->kind = kind;
  out->dialect = std::move(d.state);
  return std::nullopt;
}

std::string StringMember(const nlohmann::ordered_json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

bool HasValue(const nlohmann::ordered_json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && !it->is_null();
}

std::optional<ApiError> CheckFields(const nlohmann::ordered_json& obj, const std::string& where,
                                    std::initializer_list<std::string_view> accepted,
                                    std::initializer_list<std::string_view> refused) {
  if (!obj.is_object()) return std::nullopt;
  for (const auto& item : obj.items()) {
    // Named, not a structured binding: the lambda below captures it (clang refuses that).
    const std::string& key = item.key();
    const auto& value = item.value();
    const std::string path = where.empty() ? key : where + "." + key;
    auto in = [&](std::initializer_list<std::string_view> list) {
      for (std::string_view k : list) {
        if (k == key) return true;
      }
      return false;
    };
    if (in(accepted)) continue;
    if (in(refused)) {
      if (value.is_null()) continue;
      return Error(400, "'" + path + "' is not supported by this server", "invalid_request_error",
                   path);
    }
    return Error(400, "'" + path + "': unknown field", "invalid_request_error", path);
  }
  return std::nullopt;
}

std::pair<int, json> AnthropicError(int status, const json& openai_body) {
  std::string message = "error";
  std::string openai_type;
  if (openai_body.is_object() && openai_body.contains("error") &&
      openai_body["error"].is_object()) {
    const json& e = openai_body["error"];
    if (e.contains("message") && e["message"].is_string()) message = e["message"];
    if (e.contains("type") && e["type"].is_string()) openai_type = e["type"];
  }
  // https://docs.anthropic.com/en/api/errors
  std::string type = "invalid_request_error";
  switch (status) {
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    default:
      if (status >= 500) type = "api_error";
  }
  if (openai_type == "server_overloaded") {
    type = "overloaded_error";
    status = 529;
  }
  return {status, {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}}};
}

void ResponseStore::Put(const std::string& id, Entry entry) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    order_.erase(it->second.second);
    entries_.erase(it);
  }
  while (entries_.size() >= capacity_) {
    const std::string oldest = order_.front();
    order_.pop_front();
    entries_.erase(oldest);
    Forget(oldest, "dropped: the server keeps only its newest stored responses");
  }
  order_.push_back(id);
  entries_.emplace(id, std::make_pair(std::move(entry), std::prev(order_.end())));
}

std::optional<ResponseStore::Entry> ResponseStore::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.first;
}

bool ResponseStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  order_.erase(it->second.second);
  entries_.erase(it);
  Forget(id, "deleted");
  return true;
}

std::string ResponseStore::Missing(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = gone_.find(id);
  const std::string why = it != gone_.end()
                              ? it->second
                              : "never stored here (made with store: false, on another server, or "
                                "before a restart)";
  return "response '" + id + "' is not held by this server: " + why + " (it keeps the newest " +
         std::to_string(capacity_) + " stored responses in memory)";
}

void ResponseStore::Forget(const std::string& id, const char* why) {
  if (gone_.emplace(id, why).second) gone_order_.push_back(id);
  while (gone_order_.size() > capacity_) {
    gone_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
}

}  // namespace polychip::server
