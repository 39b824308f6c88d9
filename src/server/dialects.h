// The API dialects that are translations of the chat route (internal to the server module):
// Anthropic's Messages (/v1/messages, anthropic.cc) and OpenAI's Responses (/v1/responses,
// responses.cc). A dialect's body becomes an OpenAI chat-completions body, which ParseApiRequest
// reads as it reads /v1/chat/completions (chat template, tools, structured outputs, sampling);
// the answer is written back by the dialect's ResponseWriter from the same parts
// (server/answer.h). Fields a dialect cannot honour are a 400 naming them, never ignored.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "server/api.h"

namespace polychip::server {

// A dialect's request as a chat request.
struct DialectRequest {
  nlohmann::ordered_json chat;  // the /v1/chat/completions body (schemas keep their key order)
  nlohmann::json state;         // becomes ApiRequest::dialect
};

std::optional<ApiError> MessagesToChat(const nlohmann::ordered_json& body,
                                       const ParseLimits& limits, DialectRequest* out);
std::optional<ApiError> ResponsesToChat(const nlohmann::ordered_json& body,
                                        const ParseLimits& limits, DialectRequest* out);

// The string member `key` of `obj`, or "" when `obj` is not an object or the member is absent
// or not a string.
std::string StringMember(const nlohmann::ordered_json& obj, const char* key);
// Whether `obj` has member `key` and it is not null.
bool HasValue(const nlohmann::ordered_json& obj, const char* key);

// A 400 for a member of `obj` that is in `refused` (known, but this server cannot honour it) or
// in neither list (unknown, as both APIs refuse them). `where`: the object's path, "" at the top.
std::optional<ApiError> CheckFields(const nlohmann::ordered_json& obj, const std::string& where,
                                    std::initializer_list<std::string_view> accepted,
                                    std::initializer_list<std::string_view> refused);

// ParseApiRequest for kMessages and kResponses: the translation, then the chat parser.
std::optional<ApiError> ParseDialectRequest(ApiKind kind, const nlohmann::json& body,
                                            const TextCodec& codec, const ParseLimits& limits,
                                            ApiRequest* out);

// An error in Anthropic's shape, {"type": "error", "error": {"type", "message"}}, with the
// status Anthropic gives it (overloaded: 529), from an error body in OpenAI's shape.
std::pair<int, nlohmann::json> AnthropicError(int status, const nlohmann::json& openai_body);

// The responses kept for previous_response_id and GET /v1/responses/{id}: the newest
// `capacity`, the oldest dropped first. Thread-safe.
class ResponseStore {
 public:
  struct Entry {
    nlohmann::json response;      // as GET returns it
    nlohmann::json conversation;  // chat messages: its input (without instructions) and output
  };
  explicit ResponseStore(size_t capacity) : capacity_(capacity) {}

  void Put(const std::string& id, Entry entry);
  std::optional<Entry> Get(const std::string& id) const;
  bool Delete(const std::string& id);
  // Why `id` is not held, for the error message: dropped as the oldest, deleted, or unknown.
  std::string Missing(const std::string& id) const;
  size_t capacity() const { return capacity_; }

 private:
  void Forget(const std::string& id, const char* why);

  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, std::pair<Entry, std::list<std::string>::iterator>> entries_;
  // The ids no longer held and why, bounded like the entries (a few bytes each).
  std::list<std::string> gone_order_;
  std::unordered_map<std::string, const char*> gone_;
};

}  // namespace polychip::server
