// Request parsing and validation for the HTTP API (internal to the server module): JSON bodies
// in, GenerateInputs out, or an ApiError carrying the HTTP status and OpenAI's error fields.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/text_codec.h"

namespace polychip::grammar {
class GrammarCache;
}

namespace polychip::server {

struct ToolRequest;  // server/tools.h

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, or ""
  nlohmann::json ToJson() const;
};

// A 400 invalid_request_error naming the offending field.
inline ApiError BadRequest(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

// Returns from a parser when `expr` (a std::optional<ApiError>) holds an error.
#define PC_API_TRY(expr)                   \
  do {                                     \
    if (auto pc_e_ = (expr)) return pc_e_; \
  } while (0)

// kMessages (Anthropic) and kResponses (OpenAI Responses) are translated into chat requests
// (server/dialects.h) and answered by their own writers.
enum class ApiKind { kCompletion, kChat, kGenerate, kMessages, kResponses };

// A parsed generation request: one GenerateInput per choice (prompts x n).
struct ApiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;
  int n = 1;
  int logprobs = -1;  // completions: number of top logprobs (-1: off); chat: top_logprobs
  bool chat_logprobs = false;
  std::string rid;
  // Chat with tools (tool_choice not none): the answer is parsed for calls. Null otherwise.
  std::shared_ptr<const ToolRequest> tools;
  std::string chat_format;  // the codec's, for rendering tool calls into the prompt
  // How the answer is written (chat): its calls, and its reasoning as --reasoning-parser says.
  OutputFormat output_format;
  bool starts_in_reasoning = false;  // the prompt opened the reasoning block
  // The answer is split into reasoning, content and calls (tools, or a reasoning format).
  bool parse_answer() const {
    return tools != nullptr || output_format.reasoning != ReasoningFormat::kNone;
  }
  std::vector<engine::GenerateInput> inputs;  // choice i = inputs[i]
  std::vector<std::string> prompt_texts;      // for echo (per prompt)
  // kMessages / kResponses: what the dialect's writer needs from the request (the fields a
  // response repeats, the conversation Responses stores).
  nlohmann::json dialect;
};

class ResponseStore;  // server/dialects.h

struct ParseLimits {
  int64_t context_length = 0;  // max_tokens above it is an error
  // The compiler of structured-output constraints (response_format, regex, ebnf, ...); unset:
  // such a request is a 400.
  std::function<grammar::GrammarCache*()> grammars;
  // The body as received: a JSON schema is read again from it with its properties in their
  // order (nlohmann::json sorts keys, and the order of the keys is the order of the output).
  std::string_view raw_body;
  // kResponses: the stored responses that previous_response_id refers to (null: none).
  const ResponseStore* responses = nullptr;
  // kMessages: /v1/messages/count_tokens (max_tokens is not required).
  bool count_only = false;
  // --reasoning-parser: "auto" (the template's), "none", or a ReasoningFormatName.
  std::string reasoning_parser = "auto";
};

// Parses a body of /v1/completions, /v1/chat/completions, /generate, /v1/messages or
// /v1/responses.
std::optional<ApiError> ParseApiRequest(ApiKind kind, const nlohmann::json& body,
                                        const TextCodec& codec, const ParseLimits& limits,
                                        ApiRequest* out);

// The conversation of a chat body (messages, tools, chat_template_kwargs,
// add_generation_prompt) as the codec's template takes it, and its `tools` / `tool_choice`;
// `raw_body` keeps the keys' order.
std::optional<ApiError> ParseChatInput(const nlohmann::json& body, std::string_view raw_body,
                                       const TextCodec& codec, ToolRequest* tools,
                                       model::ChatInput* out);

// True if `s` is valid UTF-8.
bool IsValidUtf8(std::string_view s);

}  // namespace polychip::server
