#include "server/api.h"

#include <cstdlib>
#include <limits>
#include <span>

#include "grammar/cache.h"
#include "server/dialects.h"
#include "server/tools.h"

namespace polychip::server {
namespace {

using nlohmann::json;

// Field readers: an absent or null field leaves *out unchanged; a wrong type or an out-of-range
// value is a 400 naming the field.
std::optional<ApiError> GetNumber(const json& j, const char* key, double lo, double hi,
                                  double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return BadRequest(key, std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return BadRequest(key, std::string("'") + key + "' must be between " + std::to_string(lo) +
                        " and " + std::to_string(hi) + ", got " + it->dump());
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> GetFloat(const json& j, const char* key, double lo, double hi,
                                 float* out) {
  double v = *out;
  if (auto e = GetNumber(j, key, lo, hi, &v)) return e;
  *out = static_cast<float>(v);
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& j, const char* key, int64_t lo, int64_t hi,
                               int64_t* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return BadRequest(key, std::string("'") + key + "' must be an integer");
  const int64_t v = it->is_number_unsigned()
                        ? static_cast<int64_t>(std::min<uint64_t>(
                              it->get<uint64_t>(), std::numeric_limits<int64_t>::max()))
                        : it->get<int64_t>();
  if (v < lo || v > hi) {
    return BadRequest(key, std::string("'") + key + "' must be between " + std::to_string(lo) + " and " +
                        std::to_string(hi) + ", got " + std::to_string(v));
  }
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> GetBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return BadRequest(key, std::string("'") + key + "' must be a boolean");
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetString(const json& j, const char* key, std::string* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return BadRequest(key, std::string("'") + key + "' must be a string");
  *out = it->get<std::string>();
  return std::nullopt;
}

std::optional<ApiError> GetTokenIds(const json& v, const char* key, int64_t vocab,
                                    std::vector<int32_t>* out, int64_t max_len = 0) {
  if (!v.is_array()) return BadRequest(key, std::string("'") + key + "' must be an array of token ids");
  // Before a copy: a prompt longer than the context can never run.
  if (max_len > 0 && static_cast<int64_t>(v.size()) > max_len) {
    return BadRequest(key, std::string("'") + key + "' has " + std::to_string(v.size()) +
                        " tokens, more than the context length " + std::to_string(max_len));
  }
  for (const auto& t : v) {
    if (!t.is_number_integer()) return BadRequest(key, std::string("'") + key + "' must hold integers");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= vocab) {
      return BadRequest(key, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                          std::to_string(vocab) + ")");
    }
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// prompts x n: each is one engine request (OpenAI allows n <= 128; a batch of prompts counts).
constexpr size_t kMaxInputsPerRequest = 256;

ApiError TooManyInputs(size_t prompts, int n) {
  return BadRequest("n", std::to_string(prompts) + " prompts x n = " + std::to_string(n) + " is more " +
                       "than " + std::to_string(kMaxInputsPerRequest) + " generations in one request");
}

// The sampling fields shared by the OpenAI bodies and SGLang's sampling_params.
std::optional<ApiError> ParseSampling(const json& j, bool sglang, const ParseLimits& limits,
                                      int64_t default_max_tokens, engine::SamplingParams* p) {
  p->temperature = 1.f;  // OpenAI's and SGLang's default
  PC_API_TRY(GetFloat(j, "temperature", 0, 100, &p->temperature));
  PC_API_TRY(GetFloat(j, "top_p", 0, 1, &p->top_p));
  if (p->top_p <= 0) return BadRequest("top_p", "'top_p' must be in (0, 1]");
  int64_t top_k = 0;
  PC_API_TRY(GetInt(j, "top_k", -1, 1 << 30, &top_k));
  p->top_k = static_cast<int32_t>(top_k);
  PC_API_TRY(GetFloat(j, "min_p", 0, 1, &p->min_p));
  PC_API_TRY(GetFloat(j, "repetition_penalty", 0.01, 100, &p->repetition_penalty));
  PC_API_TRY(GetFloat(j, "frequency_penalty", -2, 2, &p->frequency_penalty));
  PC_API_TRY(GetFloat(j, "presence_penalty", -2, 2, &p->presence_penalty));
  int64_t seed = -1;
  PC_API_TRY(GetInt(j, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
  if (seed >= 0) p->seed = static_cast<uint64_t>(seed);

  const int64_t max_allowed = limits.context_length > 0 ? limits.context_length : (1 << 30);
  int64_t max_tokens = default_max_tokens;
  for (const char* key : {"max_tokens", "max_completion_tokens", "max_new_tokens"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number_integer()) return BadRequest(key, std::string("'") + key + "' must be an integer");
    const int64_t v = it->get<int64_t>();
    if (v < 1) {
      return BadRequest(key, std::string("'") + key + "' must be at least 1, got " + it->dump());
    }
    if (v > max_allowed) {
      return BadRequest(key, std::string("'") + key + "' is " + std::to_string(v) +
                          ", more than this server's context length (" +
                          std::to_string(max_allowed) + " tokens)");
    }
    max_tokens = v;
  }
  p->max_tokens = static_cast<int32_t>(max_tokens);
  int64_t min_tokens = 0;
  PC_API_TRY(GetInt(j, "min_tokens", 0, max_allowed, &min_tokens));
  PC_API_TRY(GetInt(j, "min_new_tokens", 0, max_allowed, &min_tokens));
  p->min_tokens = static_cast<int32_t>(min_tokens);
  PC_API_TRY(GetBool(j, "ignore_eos", &p->ignore_eos));

  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return BadRequest("stop", "'stop' must be a string or an array of strings");
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return BadRequest("stop", "'stop' must be a string or an array of strings");
    }
    if (p->stop.size() > 16) return BadRequest("stop", "at most 16 stop strings");
  }
  if (auto it = j.find("logit_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return BadRequest("logit_bias", "'logit_bias' must map token ids to numbers");
    for (const auto& [key, bias] : it->items()) {
      char* end = nullptr;
      const long id = std::strtol(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return BadRequest("logit_bias", "'logit_bias' keys must be token ids, got '" + key + "'");
      }
      if (!bias.is_number() || bias.get<double>() < -100 || bias.get<double>() > 100) {
        return BadRequest("logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
      }
      p->logit_bias.push_back({static_cast<int32_t>(id), bias.get<float>()});
    }
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    PC_API_TRY(GetTokenIds(*it, "stop_token_ids", std::numeric_limits<int32_t>::max(),
                           &p->stop_token_ids));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, std::vector<model::ChatMessage>* out) {
  auto it = body.find("messages");
  if (it == body.end()) return BadRequest("messages", "'messages' is required");
  if (!it->is_array() || it->empty()) {
    return BadRequest("messages", "'messages' must be a non-empty array");
  }
  for (const auto& m : *it) {
    if (!m.is_object()) return BadRequest("messages", "each message must be an object");
    model::ChatMessage msg;
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return BadRequest("messages", "each message needs a string 'role'");
    }
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" &&
        msg.role != "tool" && msg.role != "ipython") {
      return BadRequest("messages", "unknown role '" + msg.role + "'");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      msg.content = "";
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const auto& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          return BadRequest("messages", "only text content parts are supported");
        }
        msg.content += part["text"].get<std::string>();
      }
    } else {
      return BadRequest("messages", "'content' must be a string or an array of text parts");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseChatInput(const json& body, std::string_view raw_body,
                                       const TextCodec& codec, ToolRequest* tools,
                                       model::ChatInput* out) {
  // The body with its keys in the client's order, read once: tool schemas keep their order
  // for the forcing grammar, and templates print them with tojson in the order Python keeps.
  auto ordered = nlohmann::ordered_json::parse(raw_body, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded() || !ordered.is_object()) {
    ordered = nlohmann::ordered_json::parse(body.dump());
  }
  PC_API_TRY(ParseTools(body, ordered, tools));
  std::vector<model::ChatMessage> plain;
  PC_API_TRY(ParseMessages(body, &plain));  // validates roles and content
  if (!codec.template_renders_tools()) {
    // A built-in family (or a template that never mentions tools): the tool list, assistant
    // tool_calls and tool results become the family's text in plain messages.
    out->messages = nlohmann::ordered_json::parse(
        RenderToolMessages(codec.chat_format(), *tools, body["messages"]).dump());
  } else {
    out->messages = ordered["messages"];
    if (tools->active()) {
      if (auto t = ordered.find("tools"); t != ordered.end() && t->is_array()) out->tools = *t;
    }
  }
  if (auto it = ordered.find("chat_template_kwargs"); it != ordered.end() && !it->is_null()) {
    if (!it->is_object()) {
      return BadRequest("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    out->kwargs = *it;
  }
  PC_API_TRY(GetBool(body, "add_generation_prompt", &out->add_generation_prompt));
  return std::nullopt;
}

namespace {

// Parameters that would change the output and that this server does not implement: a 400
// naming the parameter, never a silently different answer. Parameters that change nothing
// (user, metadata, store, service_tier, ...) are accepted.
std::optional<ApiError> RejectUnimplemented(ApiKind kind, const json& body) {
  auto present = [&](const char* key) {
    auto it = body.find(key);
    return it != body.end() && !it->is_null();
  };
  for (const char* key : {"functions", "function_call", "audio",
                          "prediction", "web_search_options", "reasoning_effort"}) {
    if (present(key)) {
      return BadRequest(key, std::string("'") + key + "' is not supported by this server");
    }
  }
  if (present("modalities")) {
    const json& m = body["modalities"];
    if (!(m.is_array() && m.size() == 1 && m[0] == "text")) {
      return BadRequest("modalities", "only the 'text' modality is supported");
    }
  }
  if (kind == ApiKind::kCompletion) {
    if (present("suffix") && !(body["suffix"].is_string() && body["suffix"].get<std::string>().empty())) {
      return BadRequest("suffix", "'suffix' (insertion) is not supported by this server");
    }
    if (present("best_of") && !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == 1)) {
      return BadRequest("best_of", "'best_of' other than 1 is not supported by this server");
    }
  }
  return std::nullopt;
}

// The schema at `path` in the raw body, as text with its keys in their original order.
std::string OrderedSchemaText(const ParseLimits& limits, const std::vector<std::string>& path,
                              const json& fallback) {
  auto raw = nlohmann::ordered_json::parse(limits.raw_body, nullptr, /*allow_exceptions=*/false);
  const nlohmann::ordered_json* node = &raw;
  for (const auto& key : path) {
    if (!node->is_object() || !node->contains(key)) return fallback.dump();
    node = &(*node)[key];
  }
  return node->dump();
}

// Structured outputs: at most one constraint per request, compiled (or found in the cache) here
// so that a bad schema is a 400 before anything runs. OpenAI bodies carry response_format
// (and, as SGLang and llama-server accept, regex / ebnf / grammar / json_schema); /generate
// carries them in sampling_params (`json_schema` as a string, SGLang's shape).
std::optional<ApiError> ParseConstraint(ApiKind kind, const json& body, const json& sp,
                                        const ParseLimits& limits, engine::SamplingParams* p) {
  struct Found {
    grammar::ConstraintKind kind;
    std::string text;
    std::string param;
  };
  std::vector<Found> found;
  const json& src = kind == ApiKind::kGenerate ? sp : body;
  const std::string prefix = kind == ApiKind::kGenerate ? "sampling_params." : "";
  if (kind != ApiKind::kGenerate) {
    if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
      if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string()) {
        return BadRequest("response_format", "'response_format' must be an object with a 'type'");
      }
      const std::string type = (*it)["type"].get<std::string>();
      if (type == "json_object") {
        found.push_back({grammar::ConstraintKind::kJsonObject, "", "response_format"});
      } else if (type == "json_schema") {
        auto js = it->find("json_schema");
        if (js == it->end() || !js->is_object()) {
          return BadRequest("response_format", "'response_format.json_schema' must be an object");
        }
        auto schema = js->find("schema");
        if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
          return BadRequest("response_format",
                     "'response_format.json_schema.schema' must be a JSON Schema object");
        }
        found.push_back({grammar::ConstraintKind::kJsonSchema,
                         OrderedSchemaText(limits, {"response_format", "json_schema", "schema"},
                                           *schema),
                         "response_format"});
      } else if (type != "text") {
        return BadRequest("response_format", "unknown response_format type '" + type +
                                          "' (text, json_object or json_schema)");
      }
    }
    if (auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
      if (!it->is_object()) return BadRequest("json_schema", "'json_schema' must be an object");
      found.push_back({grammar::ConstraintKind::kJsonSchema,
                       OrderedSchemaText(limits, {"json_schema"}, *it), "json_schema"});
    }
  } else if (auto it = sp.find("json_schema"); it != sp.end() && !it->is_null()) {
    if (!it->is_string()) {
      return BadRequest("sampling_params.json_schema", "'json_schema' must be a string (a JSON schema)");
    }
    found.push_back({grammar::ConstraintKind::kJsonSchema, it->get<std::string>(),
                     "sampling_params.json_schema"});
  }
  for (const auto& [key, ck] : {std::pair{"regex", grammar::ConstraintKind::kRegex},
                               std::pair{"ebnf", grammar::ConstraintKind::kEbnf},
                               std::pair{"grammar", grammar::ConstraintKind::kEbnf}}) {
    auto it = src.find(key);
    if (it == src.end() || it->is_null()) continue;
    if (!it->is_string()) return BadRequest(prefix + key, "'" + std::string(key) + "' must be a string");
    found.push_back({ck, it->get<std::string>(), prefix + key});
  }
  if (found.empty()) return std::nullopt;
  if (found.size() > 1) {
    return BadRequest(found[1].param, "only one of response_format, json_schema, regex, ebnf and "
                               "grammar may be given");
  }
  grammar::GrammarCache* cache = limits.grammars ? limits.grammars() : nullptr;
  if (!cache) return BadRequest(found[0].param, "structured outputs are not available on this server");
  auto g = cache->Get(found[0].kind, found[0].text);
  if (!g.ok()) return BadRequest(found[0].param, g.status().message());
  p->grammar = *g;
  return std::nullopt;
}

// Whether the prompt ends inside the reasoning block (a template that writes "<think>\n" into
// the generation prompt): its last tokens tell, else what the template source says.
bool StartsInReasoning(const TextCodec& codec, const OutputFormat& format,
                       const std::vector<int32_t>& prompt) {
  auto [open, close] = ReasoningTags(format.reasoning);
  if (open.empty()) return false;
  const size_t n = std::min<size_t>(prompt.size(), 8);
  std::string tail = codec.Decode(std::span(prompt).subspan(prompt.size() - n));
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  if (tail.ends_with(open)) return true;
  if (tail.ends_with(close)) return false;
  return format.reasoning_opens_in_prompt;
}

}  // namespace

nlohmann::json ApiError::ToJson() const {
  json err = {{"message", message}, {"type", type}, {"code", status}};
  err["param"] = param.empty() ? json(nullptr) : json(param);
  return {{"error", err}};
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c >> 4) == 0xe) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c >> 3) == 0x1e) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

std::optional<ApiError> ParseApiRequest(ApiKind kind, const json& body, const TextCodec& codec,
                                        const ParseLimits& limits, ApiRequest* out) {
  if (!body.is_object()) return BadRequest("", "the request body must be a JSON object");
  if (kind == ApiKind::kMessages || kind == ApiKind::kResponses) {
    return ParseDialectRequest(kind, body, codec, limits, out);
  }
  out->kind = kind;
  const bool sglang = kind == ApiKind::kGenerate;
  if (!sglang) PC_API_TRY(RejectUnimplemented(kind, body));
  PC_API_TRY(GetString(body, "model", &out->model));
  PC_API_TRY(GetBool(body, "stream", &out->stream));
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return BadRequest("stream_options", "'stream_options' must be an object");
    PC_API_TRY(GetBool(*it, "include_usage", &out->include_usage));
  }
  int64_t n = 1;
  PC_API_TRY(GetInt(body, "n", 1, 64, &n));
  out->n = static_cast<int>(n);

  // Prompts.
  std::vector<std::vector<int32_t>> prompts;
  engine::SamplingParams params;
  const int64_t vocab = codec.vocab_size();
  if (kind == ApiKind::kChat) {
    auto tools = std::make_shared<ToolRequest>();
    out->chat_format = codec.chat_format();
    model::ChatInput chat;
    PC_API_TRY(ParseChatInput(body, limits.raw_body, codec, tools.get(), &chat));
    auto encoded = codec.EncodeChat(chat);
    if (!encoded.ok()) return BadRequest("messages", encoded.status().message());
    prompts.push_back(std::move(*encoded));
    out->output_format = codec.output_format();
    if (limits.reasoning_parser == "none") {
      out->output_format.reasoning = ReasoningFormat::kNone;
    } else if (limits.reasoning_parser != "auto" && !limits.reasoning_parser.empty()) {
      if (auto r = ReasoningFormatFromName(limits.reasoning_parser))
        out->output_format.reasoning = *r;
    }
    out->starts_in_reasoning = StartsInReasoning(codec, out->output_format, prompts.back());
    PC_API_TRY(ParseSampling(body, false, limits, /*default_max_tokens=*/0, &params));
    PC_API_TRY(ParseConstraint(kind, body, json::object(), limits, &params));
    if (tools->active()) {
      auto forced = ToolCallGrammar(out->output_format, *tools, out->starts_in_reasoning);
      if (!forced.ok()) return BadRequest("tools", forced.status().message());
      if (forced->has_value()) {
        if (params.grammar) {
          return BadRequest("tool_choice", "a forced tool call cannot be combined with response_format");
        }
        grammar::GrammarCache* cache = limits.grammars ? limits.grammars() : nullptr;
        if (!cache) return BadRequest("tool_choice", "constrained tool calls are not available here");
        auto g = cache->Get(grammar::ConstraintKind::kEbnf, **forced);
        if (!g.ok()) return BadRequest("tools", g.status().message());
        params.grammar = *g;
      }
      out->tools = tools;
    }
    PC_API_TRY(GetBool(body, "logprobs", &out->chat_logprobs));
    int64_t top = 0;
    PC_API_TRY(GetInt(body, "top_logprobs", 0, 20, &top));
    if (out->chat_logprobs) out->logprobs = static_cast<int>(top);
  } else if (kind == ApiKind::kCompletion) {
    auto it = body.find("prompt");
    if (it == body.end() || it->is_null()) return BadRequest("prompt", "'prompt' is required");
    if (it->is_string()) {
      out->prompt_texts.push_back(it->get<std::string>());
      prompts.push_back(codec.Encode(out->prompt_texts.back(), true));
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      prompts.emplace_back();
      PC_API_TRY(GetTokenIds(*it, "prompt", vocab, &prompts.back(), limits.context_length));
      out->prompt_texts.push_back(codec.Decode(prompts.back()));
    } else if (it->is_array() && !it->empty()) {
      if (it->size() * out->n > kMaxInputsPerRequest) return TooManyInputs(it->size(), out->n);
      for (const auto& p : *it) {
        if (p.is_string()) {
          out->prompt_texts.push_back(p.get<std::string>());
          prompts.push_back(codec.Encode(out->prompt_texts.back(), true));
        } else {
          prompts.emplace_back();
          PC_API_TRY(GetTokenIds(p, "prompt", vocab, &prompts.back(), limits.context_length));
          out->prompt_texts.push_back(codec.Decode(prompts.back()));
        }
      }
    } else {
      return BadRequest("prompt", "'prompt' must be a string, an array of strings or of token ids");
    }
    PC_API_TRY(ParseSampling(body, false, limits, /*default_max_tokens=*/16, &params));
    PC_API_TRY(ParseConstraint(kind, body, json::object(), limits, &params));
    int64_t lp = -1;
    PC_API_TRY(GetInt(body, "logprobs", 0, 20, &lp));
    out->logprobs = static_cast<int>(lp);
    PC_API_TRY(GetBool(body, "echo", &out->echo));
  } else {  // SGLang /generate
    PC_API_TRY(GetString(body, "rid", &out->rid));
    auto text = body.find("text");
    auto ids = body.find("input_ids");
    if (text != body.end() && !text->is_null() && ids != body.end() && !ids->is_null()) {
      return BadRequest("input_ids", "give one of 'text' or 'input_ids', not both");
    }
    if (text != body.end() && !text->is_null()) {
      if (!text->is_string()) return BadRequest("text", "'text' must be a string");
      out->prompt_texts.push_back(text->get<std::string>());
      prompts.push_back(codec.Encode(out->prompt_texts.back(), true));
    } else if (ids != body.end() && !ids->is_null()) {
      prompts.emplace_back();
      PC_API_TRY(GetTokenIds(*ids, "input_ids", vocab, &prompts.back(), limits.context_length));
    } else {
      return BadRequest("text", "one of 'text' or 'input_ids' is required");
    }
    json sp = json::object();
    if (auto it = body.find("sampling_params"); it != body.end() && !it->is_null()) {
      if (!it->is_object()) return BadRequest("sampling_params", "'sampling_params' must be an object");
      sp = *it;
    }
    PC_API_TRY(ParseSampling(sp, sglang, limits, /*default_max_tokens=*/128, &params));
    PC_API_TRY(ParseConstraint(kind, body, sp, limits, &params));
    bool return_logprob = false;
    PC_API_TRY(GetBool(body, "return_logprob", &return_logprob));
    int64_t top = 0;
    PC_API_TRY(GetInt(body, "top_logprobs_num", 0, 20, &top));
    if (return_logprob) out->logprobs = static_cast<int>(top);
  }
  if (out->logprobs > 0) params.top_logprobs = out->logprobs;
  params.want_logprob = out->logprobs >= 0;  // otherwise nobody reads it

  // Every prompt is copied n times below: bound the product first ({"prompt": [5] * 4000000,
  // "n": 64} used to take 1.1 GB before the engine refused it).
  if (prompts.size() * out->n > kMaxInputsPerRequest) return TooManyInputs(prompts.size(), out->n);
  for (const auto& prompt : prompts) {
    if (limits.context_length > 0 && static_cast<int64_t>(prompt.size()) > limits.context_length) {
      return BadRequest("prompt", "the prompt has " + std::to_string(prompt.size()) +
                               " tokens, more than the context length " +
                               std::to_string(limits.context_length));
    }
  }
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty()) return BadRequest("prompt", "the prompt is empty");
    for (int i = 0; i < out->n; ++i) {
      engine::GenerateInput in;
      in.prompt = prompts[p];
      in.params = params;
      // n choices with one seed must still differ: each gets its own stream of the seed.
      if (params.seed && i > 0) in.params.seed = *params.seed + static_cast<uint64_t>(i);
      int64_t priority = 0;
      PC_API_TRY(GetInt(body, "priority", -1000000, 1000000, &priority));
      in.priority = static_cast<int32_t>(priority);
      // false: this request decodes without speculation (docs/speculative-decoding.md).
      PC_API_TRY(GetBool(body, "speculative", &in.speculative));
      out->inputs.push_back(std::move(in));
    }
  }
  return std::nullopt;
}

}  // namespace polychip::server
