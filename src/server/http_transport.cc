#include "server/http_transport.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace polychip::server {
namespace {

// cpp-httplib 0.11 listens with a backlog of 5 and does not expose its socket, so a burst of a
// few hundred clients connecting at once overflows the accept queue and their SYNs are retried
// after 1 s, 3 s, ... (seen as TTFT spikes). listen() again on the bound socket (found by its
// port) raises the backlog; Linux allows this on a listening socket. Returns that socket, or -1.
int WidenListenBacklog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof addr;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (p == port && ::listen(fd, SOMAXCONN) == 0) return fd;
  }
  spdlog::warn("could not raise the listen backlog of port {}", port);
  return -1;
}

int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

}  // namespace

HttpTransport::HttpTransport(int http_threads) {
  const int threads = std::max(http_threads, 8);
  svr_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_.set_keep_alive_max_count(1000);
  svr_.set_read_timeout(30, 0);
  svr_.set_write_timeout(30, 0);
  svr_.set_payload_max_length(64ull << 20);
}

Status HttpTransport::Bind(const std::string& host, int port) {
  // A client that vanished mid-stream must produce a write error, not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  if (port == 0) {
    port_ = svr_.bind_to_any_port(host.c_str());
    if (port_ <= 0) return Unavailable("cannot bind " + host);
  } else {
    if (!svr_.bind_to_port(host.c_str(), port)) {
      return Unavailable(fmt::format("cannot bind {}:{} (in use?)", host, port));
    }
    port_ = port;
  }
  listen_fd_ = WidenListenBacklog(port_);
  return Status::Ok();
}

void HttpTransport::StopAccepting() {
  // accept() then fails, and cpp-httplib closes the socket and stops its accept loop; Run()
  // returns once the workers have finished their connections.
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  listen_fd_ = -1;
}

void HttpTransport::CloseConnections() {
  // cpp-httplib 0.11 keeps its sockets to itself: find them as the connected sockets on our
  // port. shutdown() (not close()) leaves each descriptor to the worker that owns it.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  const int max_fd = static_cast<int>(std::min<rlim_t>(lim.rlim_cur, 1 << 16));
  int closed = 0;
  for (int fd = 3; fd < max_fd; ++fd) {
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof local, plen = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) continue;
    if (PortOf(local) != port_) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) continue;
    if (::shutdown(fd, SHUT_RDWR) == 0) ++closed;
  }
  if (closed > 0) spdlog::info("shutdown: closed {} client connection(s)", closed);
}

}  // namespace polychip::server
