// A small synchronous HTTP/1.1 client for the CLI's load generator (`bench-serving`), on
// Boost.Beast like the server's transport: one request per connection, and the body of the
// answer handed over piece by piece as it arrives, so that each event of a stream is timed when
// it comes rather than when the answer ends.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polychip::cli {

struct HttpCall {
  std::string host;
  int port = 80;
  std::string method = "POST";
  std::string target = "/";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  double connect_timeout_s = 30;
  // The longest wait for the next bytes of the answer (a stream may run far longer in all).
  double read_timeout_s = 600;
};

struct HttpReply {
  // Non-empty when no complete answer came: resolving, connecting, writing or reading failed or
  // timed out, or the receiver stopped the read.
  std::string error;
  int status = 0;    // 0 when no answer head came
  std::string body;  // a non-2xx answer's body (a 2xx one went to the receiver)
};

// Sends `call` and waits for the whole answer. Each piece of a 2xx answer's body (chunked,
// Content-Length or up to the connection's end alike) goes to `on_body` as it is read; false
// from it stops reading.
HttpReply SendHttp(const HttpCall& call, const std::function<bool(std::string_view)>& on_body);

}  // namespace polychip::cli
