// The event-driven transport (see http_transport.h). One Asio thread (the one in Run()) owns
// every socket: it accepts, reads request heads and bodies with Beast's parser under deadlines,
// answers the transport's own errors, and carries out the writes that workers ask for. A worker
// runs one complete request's handler and writes its response through Session::Write, which
// hands the bytes to the event thread and waits (a write deadline there bounds the wait), so a
// streaming handler's provider is pulled on the worker and blocks it, not the event loop.
#include "server/http_transport.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace polychip::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// RLIMIT_NOFILE is raised to the hard limit, up to this: enough for tens of thousands of
// connections, without making code that walks every descriptor number slow.
constexpr rlim_t kMaxOpenFiles = 1 << 16;

std::chrono::milliseconds Millis(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(seconds, 0.0) * 1000));
}

void RaiseOpenFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  const rlim_t want = std::min(lim.rlim_max, kMaxOpenFiles);
  if (lim.rlim_cur >= want) return;
  const rlim_t was = lim.rlim_cur;
  lim.rlim_cur = want;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("could not raise the open file limit from {}", was);
  }
}

bool IEquals(beast::string_view a, beast::string_view b) { return beast::iequals(a, b); }
std::string Str(beast::string_view s) { return std::string(s.data(), s.size()); }

std::string ReasonPhrase(int status) {
  return std::string(http::obsolete_reason(static_cast<http::status>(status)));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A target's path with its %XX escapes decoded ('+' stays: it means a space only in a query);
// a '%' not followed by two hex digits is kept as it is.
std::string PercentDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

// The status line and headers of `res`; `framing` is its Content-Length or Transfer-Encoding
// line (empty: the body ends with the connection).
std::string ResponseHead(const HttpResponse& res, bool keep_alive, const std::string& framing) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", res.status, ReasonPhrase(res.status));
  for (const auto& [name, value] : res.headers) {
    if (IEquals(name, "Connection") || IEquals(name, "Content-Length") ||
        IEquals(name, "Transfer-Encoding")) {
      continue;
    }
    out += name + ": " + value + "\r\n";
  }
  out += framing;
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

bool WantsClose(const HttpResponse& res) { return IEquals(res.Header("Connection"), "close"); }

// A worker's write, completed on the event thread.
class WriteWait {
 public:
  void Set(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    ok_ = ok;
    cv_.notify_one();
  }
  // The event thread's write deadline ends every write; `limit` only guards against a bug there.
  bool Get(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, limit, [this] { return done_; });
    return done_ && ok_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool ok_ = false;
};

class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

class Session;
// The session whose request this worker thread is handling (HttpTransport::ClientGone).
thread_local Session* t_current_session = nullptr;

}  // namespace

class HttpTransport::Impl {
 public:
  Impl(int worker_threads, HttpLimits limits)
      : limits_(limits), work_(ioc_.get_executor()), workers_(std::max(worker_threads, 8)) {}
  ~Impl() { destroying_ = true; }

  Status Bind(const std::string& host, int port);
  void Run();
  void StopAccepting();
  void CloseConnections();
  int port() const { return port_; }

  const HttpLimits& limits() const { return limits_; }
  asio::io_context& ioc() { return ioc_; }
  char* drain_buffer() { return drain_buffer_; }
  size_t drain_buffer_size() const { return sizeof drain_buffer_; }

  struct Route {
    Handler handler;
    RunOn run_on = RunOn::kWorker;
  };
  // Routing, on the event thread: the route of a complete request, or null (404).
  const Route* FindRoute(const HttpRequest& req) const {
    const auto& table = req.method == "POST"     ? post_
                        : req.method == "DELETE" ? delete_
                                                 : get_;
    if (req.method != "GET" && req.method != "HEAD" && req.method != "POST" &&
        req.method != "DELETE") {
      return nullptr;
    }
    auto it = table.find(req.path);
    if (it == table.end()) {
      // "/a/b/*" serves "/a/b/<one segment>".
      const size_t slash = req.path.rfind('/');
      if (slash != std::string::npos && slash + 1 < req.path.size()) {
        it = table.find(req.path.substr(0, slash + 1) + "*");
      }
    }
    return it == table.end() ? nullptr : &it->second;
  }
  HookResult PreRouting(const HttpRequest& req, HttpResponse& res) const {
    return hook_ ? hook_(req, res) : HookResult::kUnhandled;
  }
  // Gives an error answer without a body its body.
  void FillError(const HttpRequest& req, HttpResponse& res) const {
    if (res.status >= 400 && error_handler_) error_handler_(req, res);
  }
  void RunOnWorker(std::function<void()> task) { workers_.Push(std::move(task)); }

  // Session bookkeeping (any thread).
  void Register(Session* s, const std::string& client);
  void Unregister(Session* s, const std::string& client);

  std::unordered_map<std::string, Route> get_, post_, delete_;
  PreRoutingHook hook_;
  Handler error_handler_;

 private:
  void Accept();
  void OnAccept(tcp::socket socket);
  void Refuse(tcp::socket socket, const std::string& why);

  const HttpLimits limits_;
  // Declared before the event loop and the workers, whose pending work may hold sessions:
  // destroyed after them.
  std::mutex sessions_mu_;
  std::unordered_set<Session*> sessions_;
  std::unordered_map<std::string, int> per_client_;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> destroying_{false};

  asio::io_context ioc_;
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer accept_retry_{ioc_};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  int port_ = 0;
  char drain_buffer_[4096];  // where lingering closes discard input (event thread only)
  WorkerPool workers_;  // last: joined first
};

namespace {

// One client connection. Everything but Write(), Finish() and PeerClosed() runs on the event
// thread; a worker holds the session (shared_ptr) while it handles the connection's request.
class Session : public std::enable_shared_from_this<Session> {
 public:
  using Impl = HttpTransport::Impl;

  Session(Impl* owner, tcp::socket socket, std::string client)
      : owner_(owner),
        socket_(std::move(socket)),
        fd_(socket_.native_handle()),
        timer_(owner->ioc()),
        client_(std::move(client)) {
    owner_->Register(this, client_);
  }
  ~Session() { owner_->Unregister(this, client_); }

  void Start() { ReadHead(); }

  // Ends the connection at once: pending reads and writes fail. The descriptor stays open
  // until the session is destroyed, so a worker's PeerClosed() never looks at another socket.
  void Shutdown() {
    if (shut_.exchange(true)) return;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.cancel(ec);
    timer_.cancel();
  }

  // Worker thread: writes `bytes`; false when the client is gone or did not read within the
  // write deadline (the connection is then shut down).
  bool Write(std::string bytes) {
    auto wait = std::make_shared<WriteWait>();
    auto data = std::make_shared<std::string>(std::move(bytes));
    asio::post(owner_->ioc(), [self = shared_from_this(), wait, data] {
      if (self->shut_) return wait->Set(false);
      self->Arm(self->owner_->limits().write_timeout_s);
      asio::async_write(self->socket_, asio::buffer(*data),
                        [self, wait, data](beast::error_code ec, size_t) {
                          self->timer_.cancel();
                          if (ec) self->Shutdown();
                          wait->Set(!ec);
                        });
    });
    return wait->Get(Millis(owner_->limits().write_timeout_s + 5));
  }

  // Worker thread: the response is written (or failed: the connection is already shut down);
  // read the next request or close.
  void Finish(bool keep_alive) {
    asio::post(owner_->ioc(), [self = shared_from_this(), keep_alive] {
      if (keep_alive) {
        self->WaitForRequest();
      } else {
        self->Close();
      }
    });
  }

  // Any thread: true once the client has closed its end (EOF or an error on a peek).
  bool PeerClosed() const {
    if (shut_) return true;
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

 private:
  // Deadline of the current phase; when it passes the connection is shut down.
  void Arm(double seconds) {
    timer_.expires_after(Millis(seconds));
    timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->timer_.expiry() > Clock::now()) return;  // cancelled or re-armed
      self->Shutdown();
    });
  }

  // Between keep-alive requests: wait for a byte without holding a buffer.
  void WaitForRequest() {
    if (shut_) return;
    if (buffer_.size() > 0) return ReadHead();  // a pipelined request is already here
    Arm(owner_->limits().keep_alive_timeout_s);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->shut_) return self->Shutdown();
      self->ReadHead();
    });
  }

  void ReadHead() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(
        std::min<size_t>(owner_->limits().max_header_bytes, std::numeric_limits<uint32_t>::max())));
    // The body limit is applied after the pre-routing hook, so that a client without the key
    // gets its 401, not a 413 (none would make Beast refuse every Content-Length).
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    Arm(owner_->limits().head_timeout_s);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->OnHead(ec);
                            });
  }

  void OnHead(beast::error_code ec) {
    timer_.cancel();
    if (ec == http::error::header_limit) return Fail(431, "the request head is too large");
    if (ec) return ReadFailed(ec);
    const auto& head = parser_->get();
    const auto fields = std::distance(head.begin(), head.end());
    if (fields > owner_->limits().max_header_count) {
      return Fail(431, fmt::format("the request has {} header fields, more than {}", fields,
                                   owner_->limits().max_header_count));
    }
    BuildRequest();
    HttpResponse res;
    if (owner_->PreRouting(*req_, res) == HttpTransport::HookResult::kHandled) {
      // The body is not read: the connection cannot carry another request.
      return Answer(std::move(res), /*keep_alive=*/false);
    }
    const uint64_t limit = owner_->limits().max_body_bytes;
    if (auto length = parser_->content_length(); length && *length > limit) {
      return Fail(413, fmt::format("the request body ({} bytes) is larger than {} bytes",
                                   *length, limit));
    }
    parser_->body_limit(limit);  // for chunked bodies, counted as they arrive
    if (parser_->is_done()) return Dispatch();
    if (IEquals(head[http::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      Arm(owner_->limits().write_timeout_s);
      return asio::async_write(socket_, asio::buffer(kContinue),
                               [self = shared_from_this()](beast::error_code ec, size_t) {
                                 if (ec) return self->Shutdown();
                                 self->ReadBody();
                               });
    }
    ReadBody();
  }

  void ReadBody() {
    Arm(owner_->limits().body_timeout_s);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->timer_.cancel();
                       if (ec == http::error::body_limit) {
                         return self->Fail(413, fmt::format(
                                                    "the request body is larger than {} bytes",
                                                    self->owner_->limits().max_body_bytes));
                       }
                       if (ec) return self->ReadFailed(ec);
                       self->Dispatch();
                     });
  }

  // A read that ended without a request: the client left, a deadline passed (both: close), or
  // the bytes are not HTTP (400).
  void ReadFailed(beast::error_code ec) {
    const bool not_http =
        ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message;
    if (shut_ || !not_http) return Shutdown();
    Fail(400, "malformed HTTP request: " + ec.message());
  }

  void BuildRequest() {
    const auto& head = parser_->get();
    req_ = std::make_shared<HttpRequest>();
    HttpRequest& req = *req_;
    req.method = Str(head.method_string());
    req.target = Str(head.target());
    req.version = head.version() == 10 ? "HTTP/1.0" : "HTTP/1.1";
    req.path = PercentDecode(std::string_view(req.target).substr(0, req.target.find('?')));
    for (const auto& f : head) {
      req.headers.emplace(Str(f.name_string()), Str(f.value()));
    }
  }

  // A transport error: answered here (the error handler gives it its body), then closed.
  void Fail(int status, const std::string& why) {
    if (!req_) req_ = std::make_shared<HttpRequest>();
    HttpResponse res;
    res.status = status;
    res.reason = why;
    owner_->FillError(*req_, res);
    Answer(std::move(res), /*keep_alive=*/false);
  }

  // Writes a small answer from the event thread, then reads on or closes.
  void Answer(HttpResponse res, bool keep_alive) {
    auto out = std::make_shared<std::string>(
        ResponseHead(res, keep_alive, fmt::format("Content-Length: {}\r\n", res.body.size())));
    if (!req_ || req_->method != "HEAD") *out += res.body;
    Arm(owner_->limits().write_timeout_s);
    asio::async_write(socket_, asio::buffer(*out),
                      [self = shared_from_this(), out, keep_alive](beast::error_code ec, size_t) {
                        self->timer_.cancel();
                        if (ec) return self->Shutdown();
                        if (keep_alive) return self->WaitForRequest();
                        self->Close();
                      });
  }

  void Dispatch();

  // Closes after the answer was sent: our side first, then what the client still sends is read
  // and dropped for a moment, so that the kernel does not reset the connection (losing the
  // answer) because of unread input such as a body that was refused.
  void Close() {
    if (shut_) return;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    Arm(2);
    Drain();
  }
  void Drain() {
    socket_.async_read_some(asio::buffer(owner_->drain_buffer(), owner_->drain_buffer_size()),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec || self->shut_) return self->Shutdown();
                              self->Drain();
                            });
  }

  Impl* owner_;
  tcp::socket socket_;
  const int fd_;
  asio::steady_timer timer_;
  const std::string client_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<HttpRequest> req_;
  std::atomic<bool> shut_{false};

};

// Runs a handler; an exception becomes a 500.
void RunHandler(const HttpTransport::Handler& handler, const HttpRequest& req, HttpResponse& res) {
  try {
    handler(req, res);
  } catch (const std::exception& e) {
    spdlog::error("handler {} failed: {}", req.path, e.what());
    res.status = 500;
    res.SetContent("", "text/plain");  // drops a stream the handler set before it threw
  } catch (...) {
    res.status = 500;
    res.SetContent("", "text/plain");
  }
}

// Writes `res` (its body, or its stream pulled to the end); false when the client went away
// or stopped reading.
bool WriteResponse(Session& s, const HttpRequest& req, HttpResponse& res, bool* keep_alive) {
  const bool head_only = req.method == "HEAD";
  if (!res.streaming()) {
    std::string out =
        ResponseHead(res, *keep_alive, fmt::format("Content-Length: {}\r\n", res.body.size()));
    if (!head_only) out += res.body;
    return s.Write(std::move(out));
  }
  // A stream: chunked for HTTP/1.1; an HTTP/1.0 client reads to the end of the connection.
  const bool chunked = req.version == "HTTP/1.1";
  if (!chunked) *keep_alive = false;
  if (!s.Write(ResponseHead(res, *keep_alive, chunked ? "Transfer-Encoding: chunked\r\n" : ""))) {
    return false;
  }
  if (head_only) return true;
  bool ok = true;
  bool done = false;
  StreamSink sink;
  sink.write = [&](std::string_view data) {
    if (!ok) return false;
    // An empty chunk would end a chunked body.
    if (data.empty()) return true;
    std::string chunk = chunked ? fmt::format("{:x}\r\n", data.size()) : std::string();
    chunk.append(data);
    if (chunked) chunk += "\r\n";
    ok = s.Write(std::move(chunk));
    return ok;
  };
  sink.done = [&] {
    if (done) return;
    done = true;
    if (ok && chunked) ok = s.Write("0\r\n\r\n");
  };
  sink.is_writable = [&] { return ok && !s.PeerClosed(); };
  while (ok && !done) {
    if (!res.provider()(sink)) ok = false;
  }
  res.set_stream_completed(ok && done);
  return ok && done;
}

void ServeRequest(std::shared_ptr<Session> s, std::shared_ptr<HttpRequest> req,
                  const HttpTransport::Handler* handler, bool keep_alive,
                  HttpTransport::Impl* owner) {
  bool written = false;
  {
    HttpResponse res;  // destroyed before Finish(): a stream's end runs first
    t_current_session = s.get();
    RunHandler(*handler, *req, res);
    t_current_session = nullptr;
    owner->FillError(*req, res);
    if (WantsClose(res)) keep_alive = false;
    written = WriteResponse(*s, *req, res, &keep_alive);
  }
  s->Finish(written && keep_alive);
}

void Session::Dispatch() {
  req_->body = std::move(parser_->get().body());
  const bool keep_alive = parser_->keep_alive();
  parser_.reset();
  std::shared_ptr<HttpRequest> req = std::move(req_);
  const Impl::Route* route = owner_->FindRoute(*req);
  if (route == nullptr || route->run_on == HttpTransport::RunOn::kEventThread) {
    req_ = req;
    HttpResponse res;
    if (route == nullptr) {
      res.status = 404;
    } else {
      RunHandler(route->handler, *req, res);
    }
    owner_->FillError(*req, res);
    if (WantsClose(res)) return Answer(std::move(res), /*keep_alive=*/false);
    return Answer(std::move(res), keep_alive);
  }
  const HttpTransport::Handler* handler = &route->handler;
  // Nothing is read while the worker has the connection: a pipelined request waits in the
  // socket (or in buffer_) for Finish().
  owner_->RunOnWorker([self = shared_from_this(), req = std::move(req), handler, keep_alive,
                       owner = owner_] { ServeRequest(self, req, handler, keep_alive, owner); });
}

}  // namespace

void HttpTransport::Impl::Register(Session* s, const std::string& client) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.insert(s);
  ++per_client_[client];
}

void HttpTransport::Impl::Unregister(Session* s, const std::string& client) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(s);
  if (--per_client_[client] <= 0) per_client_.erase(client);
  // The last connection after StopAccepting(): Run() may return.
  if (!accepting_ && !destroying_ && sessions_.empty()) {
    asio::post(ioc_, [this] { work_.reset(); });
  }
}

Status HttpTransport::Impl::Bind(const std::string& host, int port) {
  // A client that vanished mid-stream must produce a write error, not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  RaiseOpenFileLimit();
  beast::error_code ec;
  tcp::resolver resolver(ioc_);
  const auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) {
    return Unavailable(fmt::format("cannot bind {}: {}", host, ec ? ec.message() : "no address"));
  }
  std::string why;
  for (const auto& entry : endpoints) {
    const tcp::endpoint ep = entry.endpoint();
    acceptor_.close(ec);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    // A burst of a few hundred clients connecting at once must not overflow the accept queue.
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) {
      port_ = acceptor_.local_endpoint().port();
      return Status::Ok();
    }
    why = ec.message();
  }
  acceptor_.close(ec);
  return Unavailable(fmt::format("cannot bind {}:{} ({})", host, port, why));
}

void HttpTransport::Impl::Run() {
  if (accepting_) Accept();
  ioc_.run();
}

void HttpTransport::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (!accepting_ || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) or a transient error: try again shortly rather than spin.
      spdlog::warn("accept failed: {}", ec.message());
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](beast::error_code) {
        if (accepting_) Accept();
      });
      return;
    }
    OnAccept(std::move(socket));
    Accept();
  });
}

void HttpTransport::Impl::OnAccept(tcp::socket socket) {
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // already gone
  socket.set_option(tcp::no_delay(true), ec);  // stream chunks go out at once
  const std::string client = remote.address().to_string();
  const int cap = limits_.max_connections_per_client;
  if (cap > 0) {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    auto it = per_client_.find(client);
    if (it != per_client_.end() && it->second >= cap) {
      return Refuse(std::move(socket),
                    fmt::format("too many connections from {} (at most {})", client, cap));
    }
  }
  std::make_shared<Session>(this, std::move(socket), client)->Start();
}

// Best effort and without waiting: a client over its cap gets a 503 if its socket takes it.
void HttpTransport::Impl::Refuse(tcp::socket socket, const std::string& why) {
  HttpRequest req;
  HttpResponse res;
  res.status = 503;
  res.reason = why;
  FillError(req, res);
  const std::string out =
      ResponseHead(res, false, fmt::format("Content-Length: {}\r\n", res.body.size())) + res.body;
  beast::error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(asio::buffer(out), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void HttpTransport::Impl::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  asio::post(ioc_, [this] {
    beast::error_code ec;
    acceptor_.close(ec);
    accept_retry_.cancel();
    std::lock_guard<std::mutex> lock(sessions_mu_);
    if (sessions_.empty()) work_.reset();
  });
}

void HttpTransport::Impl::CloseConnections() {
  auto done = std::make_shared<WriteWait>();
  asio::post(ioc_, [this, done] {
    std::vector<std::shared_ptr<Session>> open;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (Session* s : sessions_) {
        // A session being destroyed is still listed until its destructor takes the lock.
        if (auto p = s->weak_from_this().lock()) open.push_back(std::move(p));
      }
    }
    for (auto& s : open) s->Shutdown();
    if (!open.empty()) spdlog::info("shutdown: closed {} client connection(s)", open.size());
    done->Set(true);
  });
  // Once the event loop has ended (no connection was left) the task will not run: nothing is
  // open then.
  const auto give_up = Clock::now() + std::chrono::seconds(2);
  while (!done->Get(std::chrono::milliseconds(10))) {
    if (ioc_.stopped() || Clock::now() > give_up) break;
  }
}

HttpTransport::HttpTransport(int worker_threads, HttpLimits limits)
    : impl_(std::make_unique<Impl>(worker_threads, limits)) {}
HttpTransport::~HttpTransport() = default;

void HttpTransport::Get(const std::string& path, Handler handler, RunOn run_on) {
  impl_->get_[path] = {std::move(handler), run_on};
}
void HttpTransport::Post(const std::string& path, Handler handler) {
  impl_->post_[path] = {std::move(handler), RunOn::kWorker};
}
void HttpTransport::Delete(const std::string& path, Handler handler) {
  impl_->delete_[path] = {std::move(handler), RunOn::kWorker};
}
void HttpTransport::SetPreRoutingHook(PreRoutingHook hook) { impl_->hook_ = std::move(hook); }
void HttpTransport::SetErrorHandler(Handler handler) {
  impl_->error_handler_ = std::move(handler);
}
Status HttpTransport::Bind(const std::string& host, int port) { return impl_->Bind(host, port); }
void HttpTransport::Run() { impl_->Run(); }
void HttpTransport::StopAccepting() { impl_->StopAccepting(); }
void HttpTransport::CloseConnections() { impl_->CloseConnections(); }
int HttpTransport::port() const { return impl_->port(); }

bool HttpTransport::ClientGone() {
  return t_current_session != nullptr && t_current_session->PeerClosed();
}

}  // namespace polychip::server
