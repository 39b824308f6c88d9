// OpenAI's response shapes: /v1/completions ("text_completion") and /v1/chat/completions
// ("chat.completion", streamed as "chat.completion.chunk"), with logprobs and usage.
#include <string>
#include <utility>

#include "server/job.h"
#include "server/response_util.h"
#include "server/response_writer.h"
#include "server/tools.h"

namespace polychip::server {
namespace {

using nlohmann::json;

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
  return b;
}

class OpenAiWriter : public ResponseWriter {
 public:
  OpenAiWriter(ApiKind kind, const TextCodec* codec, std::string model_name)
      : chat_(kind == ApiKind::kChat), codec_(codec), model_name_(std::move(model_name)) {}

  json Final(const Job& job) const override {
    const ApiRequest& r = job.req;
    json choices = json::array();
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const Choice& c = job.choices[i];
      json ch = {{"index", i}, {"finish_reason", FinishName(c.final)}};
      if (!c.final.stop_matched.empty()) ch["matched_stop"] = c.final.stop_matched;
      if (chat_) {
        ch["message"] = {{"role", "assistant"}, {"content", c.text}};
        if (r.parse_answer()) AddParsedAnswer(r, c.text, &ch, &ch["message"]);
        ch["logprobs"] = r.chat_logprobs ? ChatLogprobs(c, 0, c.tokens.size()) : json(nullptr);
      } else {
        std::string text = c.text;
        if (r.echo) text = r.prompt_texts[i / r.n] + text;
        ch["text"] = text;
        ch["logprobs"] =
            r.logprobs >= 0 ? CompletionLogprobs(c, 0, c.tokens.size()) : json(nullptr);
      }
      choices.push_back(ch);
    }
    return {{"id", job.id},
            {"object", chat_ ? "chat.completion" : "text_completion"},
            {"created", job.created},
            {"model", model_name_},
            {"choices", choices},
            {"usage", Usage(job)}};
  }

  json Chunk(Job& job, size_t i, const engine::StreamEvent& ev, size_t first) const override {
    const ApiRequest& r = job.req;
    Choice& c = job.choices[i];
    const size_t to = c.tokens.size();
    json ch = {{"index", i}, {"finish_reason", ev.finished ? json(FinishName(ev)) : json(nullptr)}};
    if (chat_) {
      json delta = json::object();
      if (!c.sent_role) {
        delta["role"] = "assistant";
        c.sent_role = true;
      }
      if (r.parse_answer()) {
        // The answer is parsed as it grows: reasoning and content as soon as they cannot be
        // part of a marker or a call, a call's id and name once known, then its arguments.
        if (!c.answer_stream) {
          c.answer_stream = std::make_shared<AnswerStreamer>(r.output_format, r.starts_in_reasoning,
                                                             r.tools.get());
        }
        std::string reasoning, content;
        std::vector<ToolCallDelta> deltas;
        c.answer_stream->Feed(ev.text, ev.finished, &reasoning, &content, &deltas);
        if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
        if (!content.empty()) delta["content"] = content;
        if (!deltas.empty()) delta["tool_calls"] = DeltaJson(deltas);
        if (ev.finished && c.answer_stream->any_call_started() && ch["finish_reason"] == "stop") {
          ch["finish_reason"] = "tool_calls";
        }
      } else if (!ev.text.empty() || !ev.finished) {
        delta["content"] = ev.text;
      }
      ch["delta"] = delta;
      ch["logprobs"] = r.chat_logprobs ? ChatLogprobs(c, first, to) : json(nullptr);
    } else {
      ch["text"] = ev.text;
      ch["logprobs"] = r.logprobs >= 0 ? CompletionLogprobs(c, first, to) : json(nullptr);
    }
    if (ev.finished && !ev.stop_matched.empty()) ch["matched_stop"] = ev.stop_matched;
    return {{"id", job.id},
            {"object", ChunkObject()},
            {"created", job.created},
            {"model", model_name_},
            {"choices", json::array({ch})}};
  }

  // stream_options.include_usage: one more chunk, with no choices, that carries the usage.
  std::optional<json> Trailer(const Job& job) const override {
    if (!job.req.include_usage) return std::nullopt;
    return json{{"id", job.id},
                {"object", ChunkObject()},
                {"created", job.created},
                {"model", model_name_},
                {"choices", json::array()},
                {"usage", Usage(job)}};
  }

 private:
  // A chunk's delta.tool_calls: the deltas of one call that follow each other are one entry.
  static json DeltaJson(const std::vector<ToolCallDelta>& deltas) {
    json list = json::array();
    for (const ToolCallDelta& d : deltas) {
      if (!list.empty() && list.back()["index"] == d.index) {
        list.back()["function"]["arguments"] =
            list.back()["function"]["arguments"].get<std::string>() + d.arguments;
        continue;
      }
      json e = {{"index", d.index}};
      if (d.first) {
        e["id"] = d.id;
        e["type"] = "function";
        e["function"] = {{"name", d.name}, {"arguments", d.arguments}};
      } else {
        e["function"] = {{"arguments", d.arguments}};
      }
      list.push_back(std::move(e));
    }
    return list;
  }

  // A chat answer split: reasoning_content (vLLM's and SGLang's field), the content without
  // the reasoning and the calls, tool_calls with ids and finish_reason "tool_calls".
  static void AddParsedAnswer(const ApiRequest& r, const std::string& text, json* choice,
                              json* message) {
    ParsedAnswer a = ParseAnswer(r.output_format, r.starts_in_reasoning, r.tools.get(), text,
                                 /*partial=*/false);
    if (!a.reasoning.empty()) (*message)["reasoning_content"] = a.reasoning;
    (*message)["content"] = a.content;
    if (a.calls.empty()) return;
    json list = json::array();
    for (const ToolCall& c : a.calls) {
      list.push_back({{"id", RandomId("call_")},
                      {"type", "function"},
                      {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    (*message)["content"] = a.content.empty() ? json(nullptr) : json(a.content);
    (*message)["tool_calls"] = list;
    if ((*choice)["finish_reason"] == "stop") (*choice)["finish_reason"] = "tool_calls";
  }

  const char* ChunkObject() const { return chat_ ? "chat.completion.chunk" : "text_completion"; }

  json CompletionLogprobs(const Choice& c, size_t from, size_t to) const {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
    size_t offset = 0;
    for (size_t k = from; k < to; ++k) {
      const std::string piece = codec_->Piece(c.tokens[k]);
      tokens.push_back(piece);
      lps.push_back(c.logprobs[k]);
      json top = json::object();
      for (const auto& t : c.top[k]) top[codec_->Piece(t.token)] = t.logprob;
      tops.push_back(top);
      offs.push_back(offset);
      offset += piece.size();
    }
    return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops},
            {"text_offset", offs}};
  }

  json ChatLogprobs(const Choice& c, size_t from, size_t to) const {
    json content = json::array();
    for (size_t k = from; k < to; ++k) {
      const std::string piece = codec_->Piece(c.tokens[k]);
      json top = json::array();
      for (const auto& t : c.top[k]) {
        const std::string p = codec_->Piece(t.token);
        top.push_back({{"token", p}, {"logprob", t.logprob}, {"bytes", Bytes(p)}});
      }
      content.push_back({{"token", piece}, {"logprob", c.logprobs[k]}, {"bytes", Bytes(piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }

  static json Usage(const Job& job) {
    int64_t prompt = 0, completion = 0, cached = 0;
    // n choices of one prompt count the prompt once, as OpenAI does.
    for (size_t i = 0; i < job.choices.size(); ++i) {
      const auto& f = job.choices[i].final;
      if (i % job.req.n == 0) {
        prompt += f.prompt_tokens;
        cached += f.cached_tokens;
      }
      completion += static_cast<int64_t>(job.choices[i].tokens.size()) +
                    (f.stop_token >= 0 ? 1 : 0);
    }
    return {{"prompt_tokens", prompt}, {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  }

  bool chat_;
  const TextCodec* codec_;
  std::string model_name_;
};

}  // namespace

std::unique_ptr<ResponseWriter> MakeOpenAiWriter(ApiKind kind, const TextCodec* codec,
                                                 std::string model_name) {
  return std::make_unique<OpenAiWriter>(kind, codec, std::move(model_name));
}

}  // namespace polychip::server
