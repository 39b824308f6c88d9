#include "server/http_transport.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace polychip::server {
namespace {

// cpp-httplib 0.11 listens with a backlog of 5 and does not expose its socket, so a burst of a
// few hundred clients connecting at once overflows the accept queue and their SYNs are retried
// after 1 s, 3 s, ... (seen as TTFT spikes). listen() again on the bound socket (found by its
// port) raises the backlog; Linux allows this on a listening socket.
void WidenListenBacklog(int port) {
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
    if (p == port && ::listen(fd, SOMAXCONN) == 0) return;
  }
  spdlog::warn("could not raise the listen backlog of port {}", port);
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
  WidenListenBacklog(port_);
  return Status::Ok();
}

}  // namespace polychip::server
