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
  // Serves until StopAccepting() and the end of every open connection (blocking).
  void Run() { svr_.listen_after_bind(); }
  // Closes the listening socket: new connections are refused, the open ones are still served
  // (cpp-httplib's own stop() would also cut every chunked response mid-way).
  void StopAccepting();
  // Shuts down every open client connection, so that workers blocked reading a half-sent
  // request, waiting on an idle keep-alive connection or writing to a client that does not read
  // return at once (each would otherwise hold Run() for up to its 30 s timeout).
  void CloseConnections();
  int port() const { return port_; }

 private:
  httplib::Server svr_;
  int port_ = 0;
  int listen_fd_ = -1;
};

}  // namespace polychip::server
