// /v1/embeddings (OpenAI's shape) for the HTTP server (internal to the module): the body parsed
// into one token sequence per input, and the pooled vectors written back as floats or base64.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "server/api.h"
#include "server/text_codec.h"

namespace polychip::server {

struct EmbeddingRequest {
  std::string model;
  bool base64 = false;                       // encoding_format "base64"
  std::vector<std::vector<int32_t>> inputs;  // token ids, in the request's order
};

// `input`: a string, an array of strings, an array of token ids or an array of such arrays.
// `dimensions` other than the model's width is refused: the vectors of a model not trained for
// truncation (Matryoshka) lose their meaning when cut.
std::optional<ApiError> ParseEmbeddingRequest(const nlohmann::json& body, const TextCodec& codec,
                                              int64_t hidden_size, EmbeddingRequest* out);

// {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}.
nlohmann::json EmbeddingResponse(const std::vector<std::vector<float>>& embeddings, bool base64,
                                 const std::string& model, int64_t prompt_tokens);

// Standard base64 (RFC 4648, with padding).
std::string Base64(std::span<const uint8_t> bytes);

}  // namespace polychip::server
