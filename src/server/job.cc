#include "server/job.h"

#include "server/response_util.h"

namespace polychip::server {

using nlohmann::json;

bool AllFinished(const Job& job) {
  for (const auto& c : job.choices) {
    if (!c.finished) return false;
  }
  return true;
}

void AbortJob(engine::Engine& engine, Job& job) {
  for (auto& c : job.choices) {
    if (!c.finished) engine.Abort(c.stream);
  }
}

void Collect(Job& job, std::chrono::milliseconds wait, std::vector<json>* chunks) {
  bool any = false;
  for (size_t i = 0; i < job.choices.size(); ++i) {
    Choice& c = job.choices[i];
    if (c.finished) continue;
    // Wait only on the first unfinished choice, poll the others.
    auto events = c.stream->Pop(any ? std::chrono::milliseconds(0) : wait);
    any = true;
    for (auto& ev : events) {
      const size_t first = c.tokens.size();
      c.text += ev.text;
      for (size_t k = 0; k < ev.tokens.size(); ++k) {
        // The token that matched a stop condition is not part of the output.
        if (ev.finished && ev.stop_token >= 0 && k + 1 == ev.tokens.size()) break;
        c.tokens.push_back(ev.tokens[k]);
        c.logprobs.push_back(ev.logprobs[k]);
        c.top.push_back(ev.top_logprobs[k]);
      }
      if (ev.finished) {
        c.finished = true;
        c.final = ev;
      }
      if (chunks == nullptr) continue;
      if (!ev.error.ok() && ev.error.code() != StatusCode::kCancelled) {
        // A failure mid-stream is one error payload, whatever the dialect.
        chunks->push_back(Error(500, ev.error.message(), "server_error").ToJson());
      } else {
        chunks->push_back(job.writer->Chunk(job, i, ev, first));
      }
    }
  }
}

std::string NextSseText(Job& job, std::chrono::milliseconds wait) {
  std::vector<json> chunks;
  Collect(job, wait, &chunks);
  std::string out;
  for (const auto& c : chunks) out += "data: " + Dump(c) + "\n\n";
  if (AllFinished(job)) {
    if (auto trailer = job.writer->Trailer(job)) out += "data: " + Dump(*trailer) + "\n\n";
    out += "data: [DONE]\n\n";
    job.done_sent = true;
  }
  return out;
}

}  // namespace polychip::server
