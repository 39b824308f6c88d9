// Reading a server-sent-events body (OpenAI and SGLang streaming) in tests.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace polychip::testing {

// The `data:` payloads of an SSE body (discarded JSON where one does not parse); `done` tells
// whether `data: [DONE]` came. Lines that are not data (HTTP headers, chunk sizes of a raw
// socket read) are skipped.
inline std::vector<nlohmann::json> SseEvents(const std::string& raw, bool* done) {
  std::vector<nlohmann::json> events;
  std::istringstream in(raw);
  std::string line;
  *done = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string payload = line.substr(6);
    if (payload == "[DONE]") {
      *done = true;
      continue;
    }
    events.push_back(nlohmann::json::parse(payload, nullptr, false));
  }
  return events;
}

}  // namespace polychip::testing
