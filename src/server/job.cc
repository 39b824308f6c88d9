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

void Collect(Job& job, std::chrono::milliseconds wait, std::vector<SseEvent>* out) {
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
      if (out == nullptr) continue;
      if (!ev.error.ok() && ev.error.code() != StatusCode::kCancelled) {
        // A failure mid-stream is one error event.
        out->push_back(
            job.writer->StreamError(job, Error(500, ev.error.message(), "server_error")));
      } else {
        job.writer->StreamEvents(job, i, ev, first, out);
      }
    }
  }
}

std::string NextSseText(Job& job, std::chrono::milliseconds wait) {
  std::vector<SseEvent> events;
  if (!job.start_sent) {
    job.writer->StreamStart(job, &events);
    job.start_sent = true;
  }
  Collect(job, wait, &events);
  const bool finished = AllFinished(job);
  if (finished) job.writer->StreamEnd(job, &events);
  std::string out;
  for (const auto& e : events) {
    if (!e.name.empty()) out += "event: " + e.name + "\n";
    out += "data: " + Dump(e.data) + "\n\n";
  }
  if (finished) {
    if (job.writer->EndsWithDone()) out += "data: [DONE]\n\n";
    job.done_sent = true;
  }
  return out;
}

}  // namespace polychip::server
