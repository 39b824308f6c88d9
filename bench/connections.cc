// A crowd of idle, trickling and half-sent connections against a server on loopback, and the
// latency of /health and of a small completion meanwhile (bench/connections.sh runs it).
// The crowd is kept at its size: a connection the server closes (its head deadline) is opened
// again. The crowd's connections come from 127.0.0.2..., spread so that each address stays under
// the server's per-client cap; the probes come from 127.0.0.1.
// usage: connections PORT [IDLE TRICKLING HALF SECONDS]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { kIdle, kTrickle, kHalf };

constexpr int kPerSource = 500;  // under the server's default cap of 1024 per client address

int ConnectFrom(int port, uint32_t source) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(source);
  if (source != INADDR_LOOPBACK && bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

struct Crowd {
  int port;
  int epoll_fd = epoll_create1(0);
  std::vector<int> fd;       // by slot
  std::vector<Kind> kind;    // by slot
  std::vector<size_t> sent;  // trickled bytes, by slot
  long reconnects = 0;
  long failed_connects = 0;

  static constexpr const char* kTrickleHead =
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  static constexpr const char* kHalfRequest =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 100\r\n\r\n{\"prompt\":";

  bool Open(size_t slot) {
    const uint32_t source = (127u << 24) + 2 + static_cast<uint32_t>(slot / kPerSource);
    const int s = ConnectFrom(port, source);
    if (s < 0) {
      ++failed_connects;
      fd[slot] = -1;
      return false;
    }
    if (kind[slot] == Kind::kHalf) send(s, kHalfRequest, strlen(kHalfRequest), MSG_NOSIGNAL);
    fd[slot] = s;
    sent[slot] = 0;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = slot;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, s, &ev);
    return true;
  }

  // One round: reopen what the server closed, send each trickler its next byte.
  void Tend(int wait_ms) {
    epoll_event events[512];
    const int n = epoll_wait(epoll_fd, events, 512, wait_ms);
    for (int i = 0; i < n; ++i) {
      const size_t slot = events[i].data.u64;
      char buf[4096];
      const ssize_t r = recv(fd[slot], buf, sizeof buf, MSG_DONTWAIT);
      if (r > 0) continue;  // an answer (a deadline's 4xx): the close follows
      epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd[slot], nullptr);
      close(fd[slot]);
      ++reconnects;
      Open(slot);
    }
  }
  void Trickle() {
    const size_t len = strlen(kTrickleHead);
    for (size_t slot = 0; slot < fd.size(); ++slot) {
      if (kind[slot] != Kind::kTrickle || fd[slot] < 0) continue;
      send(fd[slot], kTrickleHead + sent[slot] % len, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      ++sent[slot];
    }
  }
};

// One request on a fresh connection, read to the end; milliseconds, or -1 on failure.
double Probe(int port, const std::string& request) {
  const auto t0 = Clock::now();
  const int fd = ConnectFrom(port, INADDR_LOOPBACK);
  if (fd < 0) return -1;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const auto sent = send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  if (sent != static_cast<ssize_t>(request.size())) {
    close(fd);
    return -1;
  }
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0 || got.rfind("HTTP/1.1 200", 0) != 0) return -1;
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void Report(const char* name, std::vector<double> ms, int failed) {
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) {
    if (ms.empty()) return 0.0;
    return ms[std::min(ms.size() - 1, static_cast<size_t>(p * static_cast<double>(ms.size())))];
  };
  std::printf("| %-17s | %5zu | %8.1f | %8.1f | %8.1f | %6d |\n", name, ms.size(), pct(0.5),
              pct(0.99), ms.empty() ? 0.0 : ms.back(), failed);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PORT [IDLE TRICKLING HALF SECONDS]\n", argv[0]);
    return 2;
  }
  const int port = std::atoi(argv[1]);
  const int idle = argc > 2 ? std::atoi(argv[2]) : 3334;
  const int trickling = argc > 3 ? std::atoi(argv[3]) : 3333;
  const int half = argc > 4 ? std::atoi(argv[4]) : 3333;
  const double seconds = argc > 5 ? std::atof(argv[5]) : 20;
  const size_t total = static_cast<size_t>(idle + trickling + half);

  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < total + 100) {
    std::fprintf(stderr, "open file limit %lu < %zu: raise the hard limit (ulimit -Hn)\n",
                 static_cast<unsigned long>(lim.rlim_cur), total + 100);
    return 1;
  }

  Crowd crowd;
  crowd.port = port;
  crowd.fd.assign(total, -1);
  crowd.sent.assign(total, 0);
  for (size_t i = 0; i < total; ++i) {
    crowd.kind.push_back(i % 3 == 0 ? Kind::kIdle : i % 3 == 1 ? Kind::kTrickle : Kind::kHalf);
  }
  // Kinds interleaved, so that every source address carries all three.
  const auto t_open = Clock::now();
  size_t opened = 0;
  for (size_t i = 0; i < total; ++i) opened += crowd.Open(i) ? 1 : 0;
  const double open_s = std::chrono::duration<double>(Clock::now() - t_open).count();
  std::fprintf(stderr, "[connections] opened %zu of %zu in %.1f s\n", opened, total, open_s);

  std::atomic<bool> stop{false};
  std::vector<double> health_ms, completion_ms;
  int health_failed = 0, completion_failed = 0;
  std::thread probes([&] {
    const std::string health =
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    const std::string body = R"({"prompt":"hi","max_tokens":1})";
    const std::string completion =
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
        "\r\n\r\n" + body;
    while (!stop) {
      const double h = Probe(port, health);
      if (h < 0) ++health_failed; else health_ms.push_back(h);
      const double c = Probe(port, completion);
      if (c < 0) ++completion_failed; else completion_ms.push_back(c);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto end = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  auto next_trickle = Clock::now();
  size_t min_open = total;
  while (Clock::now() < end) {
    crowd.Tend(50);
    if (Clock::now() >= next_trickle) {
      crowd.Trickle();
      next_trickle += std::chrono::milliseconds(300);
      size_t now_open = 0;
      for (int fd : crowd.fd) now_open += fd >= 0 ? 1 : 0;
      min_open = std::min(min_open, now_open);
    }
  }
  stop = true;
  probes.join();
  std::printf("crowd: %d idle + %d trickling (a header byte per 300 ms) + %d half-sent = %zu "
              "connections, at least %zu open throughout; %ld reopened after the server closed "
              "them, %ld connects failed; %.0f s\n\n",
              idle, trickling, half, total, min_open, crowd.reconnects, crowd.failed_connects,
              seconds);
  std::printf("| request           |     n |  p50 ms  |  p99 ms  |  max ms  | failed |\n");
  std::printf("|-------------------|-------|----------|----------|----------|--------|\n");
  Report("GET /health", health_ms, health_failed);
  Report("completion, 1 token", completion_ms, completion_failed);
  for (int fd : crowd.fd) {
    if (fd >= 0) close(fd);
  }
  return 0;
}
