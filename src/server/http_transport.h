// The HTTP transport under the routes (internal to the server module): an event-driven HTTP/1.1
// server (Boost.Beast on one Asio thread) that reads every connection's requests without
// holding a thread, and a pool of workers that run the complete ones (handlers block: a
// generation waits on the engine) and write their responses. Idle, trickling and half-sent
// connections cost a socket and a few hundred bytes, never a worker; the caps of HttpLimits
// bound what any one request or client can take. The routes see only server/http_message.h;
// Beast stays inside http_transport.cc.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/http_limits.h"
#include "server/http_message.h"
#include "util/status.h"

namespace polychip::server {

class HttpTransport {
 public:
  using Handler = std::function<void(const HttpRequest&, HttpResponse&)>;
  enum class HookResult { kUnhandled, kHandled };
  // Runs on the event thread after the request head and before the body is read, so it must
  // not block; kHandled: `res` is the answer, the body is not read and the connection closes.
  using PreRoutingHook = std::function<HookResult(const HttpRequest&, HttpResponse&)>;

  HttpTransport(int worker_threads, HttpLimits limits);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Where a route's handler runs: a worker (the default; handlers may block), or the event
  // thread itself, for a handler that answers at once and never streams (/health), so that it
  // answers even when every worker is busy.
  enum class RunOn { kWorker, kEventThread };

  // Routes by exact path (the query string stays in req.target), or by a path ending in "/*" for
  // any last segment ("/v1/responses/*"); HEAD is served by the GET route without its body.
  void Get(const std::string& path, Handler handler, RunOn run_on = RunOn::kWorker);
  void Post(const std::string& path, Handler handler);
  void Delete(const std::string& path, Handler handler);
  void SetPreRoutingHook(PreRoutingHook hook);
  // Called for every answer with status >= 400 (the transport's own 400/404/413/431 included),
  // to give an empty body its JSON.
  void SetErrorHandler(Handler handler);

  // Raises RLIMIT_NOFILE and binds `host`:`port` (port 0: any free port); afterwards port() is
  // the actual port.
  Status Bind(const std::string& host, int port);
  // Serves until StopAccepting() and the end of every open connection (blocking).
  void Run();
  // Closes the listening socket: new connections are refused, the open ones are still served.
  void StopAccepting();
  // Shuts down every open client connection: reads and writes that wait on a client fail at
  // once, so that no client holds Run() (a running handler still finishes).
  void CloseConnections();
  int port() const;

  // Inside a handler, on its thread: true once the client of the request being handled has
  // closed its connection (a non-streaming request then has nobody to answer).
  static bool ClientGone();

  class Impl;  // named by the connection objects in http_transport.cc

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace polychip::server
