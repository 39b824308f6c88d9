// The HTTP transport under the routes (internal to the server module): cpp-httplib's server
// with a worker pool large enough for hundreds of concurrent streams, bounded request sizes,
// read/write timeouts so that slow or idle clients cannot hold a worker forever, and a listen
// backlog that survives a burst of connections.
#pragma once

#include <httplib.h>

#include <string>

#include "util/status.h"

namespace polychip::server {

class HttpTransport {
 public:
  explicit HttpTransport(int http_threads);

  // Where the routes are registered.
  httplib::Server& server() { return svr_; }

  // Binds `host`:`port` (port 0: any free port); afterwards port() is the actual port.
  Status Bind(const std::string& host, int port);
  // Serves until Stop() (blocking).
  void Run() { svr_.listen_after_bind(); }
  void Stop() { svr_.stop(); }
  int port() const { return port_; }

 private:
  httplib::Server svr_;
  int port_ = 0;
};

}  // namespace polychip::server
