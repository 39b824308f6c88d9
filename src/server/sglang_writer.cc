// SGLang's /generate response: {"text", "output_ids", "meta_info"} per choice (an array when
// there are several), the same object for every streamed chunk, with an "index".
#include <chrono>

#include "server/job.h"
#include "server/response_writer.h"

namespace polychip::server {
namespace {

using nlohmann::json;

class SglangWriter : public ResponseWriter {
 public:
  json Final(const Job& job) const override {
    json all = json::array();
    for (const auto& c : job.choices) {
      all.push_back({{"text", c.text}, {"output_ids", c.tokens}, {"meta_info", MetaInfo(job, c)}});
    }
    return all.size() == 1 ? all[0] : all;
  }

  json Chunk(Job& job, size_t i, const engine::StreamEvent&, size_t) const override {
    const Choice& c = job.choices[i];
    return {{"text", c.text}, {"output_ids", c.tokens}, {"meta_info", MetaInfo(job, c)},
            {"index", i}};
  }

  std::optional<json> Trailer(const Job&) const override { return std::nullopt; }

 private:
  static json MetaInfo(const Job& job, const Choice& c) {
    // The token that matched a stop condition counts, though it is not in the output.
    const int64_t completion_tokens =
        static_cast<int64_t>(c.tokens.size()) + (c.final.stop_token >= 0 ? 1 : 0);
    const double e2e_latency =
        std::chrono::duration<double>(Job::Clock::now() - job.start).count();
    json meta = {{"id", c.stream->rid()},
                 {"prompt_tokens", c.final.prompt_tokens},
                 {"completion_tokens", completion_tokens},
                 {"cached_tokens", c.final.cached_tokens},
                 {"e2e_latency", e2e_latency}};
    if (c.finished) {
      json fr = {{"type", FinishName(c.final)}};
      if (!c.final.stop_matched.empty()) fr["matched"] = c.final.stop_matched;
      else if (c.final.stop_token >= 0) fr["matched"] = c.final.stop_token;
      meta["finish_reason"] = fr;
    } else {
      meta["finish_reason"] = nullptr;
    }
    if (job.req.logprobs >= 0) {
      json out = json::array();
      for (size_t k = 0; k < c.tokens.size(); ++k) {
        out.push_back({c.logprobs[k], c.tokens[k], nullptr});
      }
      meta["output_token_logprobs"] = out;
    }
    return meta;
  }
};

}  // namespace

std::unique_ptr<ResponseWriter> MakeSglangWriter() {
  return std::make_unique<SglangWriter>();
}

}  // namespace polychip::server
