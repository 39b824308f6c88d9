#include "server/embeddings.h"

#include <algorithm>
#include <bit>

#include "server/response_util.h"

namespace polychip::server {

using nlohmann::json;

namespace {

// Token ids from a JSON array of integers; an error names what is wrong.
std::optional<ApiError> TokenArray(const json& a, int64_t vocab, std::vector<int32_t>* out) {
  for (const json& t : a) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
      return Error(400, "'input' token ids must be integers in [0, " + std::to_string(vocab) + ")",
                   "invalid_request_error", "input");
    }
    out->push_back(t.get<int32_t>());
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseEmbeddingRequest(const json& body, const TextCodec& codec,
                                              int64_t hidden_size, EmbeddingRequest* out) {
  if (!body.is_object()) return Error(400, "the body must be a JSON object");
  for (const auto& [key, value] : body.items()) {
    // `user` changes nothing; everything else that is not understood would change the output.
    if (key != "input" && key != "model" && key != "encoding_format" && key != "dimensions" &&
        key != "user") {
      return Error(400, "unsupported parameter '" + key + "' for /v1/embeddings",
                   "invalid_request_error", key);
    }
  }
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return Error(400, "'model' must be a string", "invalid_request_error", "model");
    out->model = it->get<std::string>();
  }
  if (auto it = body.find("encoding_format"); it != body.end() && !it->is_null()) {
    const std::string f = it->is_string() ? it->get<std::string>() : "";
    if (f != "float" && f != "base64") {
      return Error(400, "'encoding_format' must be \"float\" or \"base64\"",
                   "invalid_request_error", "encoding_format");
    }
    out->base64 = f == "base64";
  }
  if (auto it = body.find("dimensions"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != hidden_size) {
      return Error(400,
                   "'dimensions' is not supported: this model's embeddings have " +
                       std::to_string(hidden_size) +
                       " dimensions and are not trained to be truncated",
                   "invalid_request_error", "dimensions");
    }
  }
  auto it = body.find("input");
  if (it == body.end() || it->is_null()) {
    return Error(400, "'input' is required", "invalid_request_error", "input");
  }
  const json& input = *it;
  auto text = [&](const json& s) -> std::optional<ApiError> {
    std::vector<int32_t> ids = codec.Encode(s.get<std::string>(), /*add_special=*/true);
    if (ids.empty())
      return Error(400, "'input' must not be empty", "invalid_request_error", "input");
    out->inputs.push_back(std::move(ids));
    return std::nullopt;
  };
  const int64_t vocab = codec.vocab_size();
  if (input.is_string()) return text(input);
  if (!input.is_array() || input.empty()) {
    return Error(400,
                 "'input' must be a string, an array of strings, an array of token ids or "
                 "an array of token id arrays, and not empty",
                 "invalid_request_error", "input");
  }
  if (input[0].is_number_integer()) {  // one sequence of token ids
    out->inputs.emplace_back();
    return TokenArray(input, vocab, &out->inputs.back());
  }
  for (const json& item : input) {
    if (item.is_string()) {
      if (auto e = text(item)) return e;
    } else if (item.is_array() && !item.empty()) {
      out->inputs.emplace_back();
      if (auto e = TokenArray(item, vocab, &out->inputs.back())) return e;
    } else {
      return Error(400, "each 'input' item must be a string or a non-empty array of token ids",
                   "invalid_request_error", "input");
    }
  }
  return std::nullopt;
}

std::string Base64(std::span<const uint8_t> bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = uint32_t{bytes[i]} << 16;
    if (n > 1) v |= uint32_t{bytes[i + 1]} << 8;
    if (n > 2) v |= bytes[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += n > 1 ? kAlphabet[(v >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[v & 63] : '=';
  }
  return out;
}

json EmbeddingResponse(const std::vector<std::vector<float>>& embeddings, bool base64,
                       const std::string& model, int64_t prompt_tokens) {
  json data = json::array();
  for (size_t i = 0; i < embeddings.size(); ++i) {
    json item = {{"object", "embedding"}, {"index", i}};
    if (base64) {
      // The float32 values' bytes, little-endian (what the openai client decodes with a
      // Float32Array).
      static_assert(std::endian::native == std::endian::little);
      const auto* p = reinterpret_cast<const uint8_t*>(embeddings[i].data());
      item["embedding"] = Base64({p, embeddings[i].size() * sizeof(float)});
    } else {
      item["embedding"] = embeddings[i];
    }
    data.push_back(std::move(item));
  }
  return {{"object", "list"},
          {"data", std::move(data)},
          {"model", model},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
}

}  // namespace polychip::server
