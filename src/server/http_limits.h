// What one HTTP client may take from the server (server/http_transport.h enforces these): every
// limit is per request or per connection, so that slow, idle or greedy clients cannot use up the
// capacity that the others need.
#pragma once

#include <cstddef>

namespace polychip::server {

struct HttpLimits {
  // A request head larger than this, or with more header fields, is answered 431.
  size_t max_header_bytes = 64 << 10;
  int max_header_count = 100;
  // A body larger than this (Content-Length or chunked, counted as it arrives) is answered 413.
  size_t max_body_bytes = 64ull << 20;
  // From the connection's first byte wanted (accept, or the first byte of a keep-alive request)
  // to the end of the request head; a client that trickles or stalls is closed after it.
  double head_timeout_s = 10;
  // From the end of the head to the end of the body.
  double body_timeout_s = 60;
  // How long an idle keep-alive connection waits for its next request.
  double keep_alive_timeout_s = 30;
  // How long one write of a response may wait on a client that does not read.
  double write_timeout_s = 30;
  // Open connections from one client address; more are answered 503 and closed. 0: no cap.
  int max_connections_per_client = 1024;
};

}  // namespace polychip::server
