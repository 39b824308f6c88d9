// libFuzzer target: an HTTP body to engine requests, as the server's generation routes do it
// (UTF-8 check, JSON parse, ParseApiRequest with the structured-output compiler enabled) on a
// real vocabulary. Input: the route's kind ("chat", "completion" or "generate") up to the first
// newline, then the body. A bad body must become an ApiError: an exception that escapes is a
// finding (the server would answer 500), as is a request that breaks the limits it was
// validated against.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_vocab.h"
#include "grammar/cache.h"
#include "grammar/matcher.h"
#include "server/api.h"
#include "server/text_codec.h"

namespace {

using namespace polychip;

struct Fixture {
  Fixture() : tokenizer(fuzz::FuzzTokenizer()) {
    auto made = server::MakeTokenizerCodec(&tokenizer, model::ChatTemplateOptions{});
    if (!made.ok()) std::abort();
    codec = std::move(made).value();
    std::vector<std::string> pieces(codec->vocab_size());
    for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = codec->Piece(static_cast<int32_t>(i));
    grammars = std::make_unique<grammar::GrammarCache>(
        std::make_shared<grammar::TokenVocab>(std::move(pieces), codec->EogTokens()));
  }
  const model::Tokenizer& tokenizer;
  std::unique_ptr<server::TextCodec> codec;
  std::unique_ptr<grammar::GrammarCache> grammars;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fx;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  const std::string_view kind_name = input.substr(0, nl == std::string_view::npos ? 0 : nl);
  const std::string_view body = nl == std::string_view::npos ? input : input.substr(nl + 1);
  const server::ApiKind kind = kind_name == "completion" ? server::ApiKind::kCompletion
                               : kind_name == "generate" ? server::ApiKind::kGenerate
                                                         : server::ApiKind::kChat;
  if (!server::IsValidUtf8(body)) return 0;
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  server::ParseLimits limits;
  limits.context_length = 512;
  limits.grammars = [] { return fx.grammars.get(); };
  limits.raw_body = body;
  server::ApiRequest req;
  if (server::ParseApiRequest(kind, json, *fx.codec, limits, &req)) return 0;
  for (const auto& in : req.inputs) {
    for (int32_t t : in.prompt) {
      if (t < 0 || t >= fx.codec->vocab_size()) __builtin_trap();
    }
  }
  return 0;
}
