#include "dist/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "runtime/log.h"

namespace polychip::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[4] = {'P', 'C', 'K', 'V'};
constexpr int64_t kServerWaitSliceMs = 200;  // longest a get holds its connection
constexpr uint32_t kMaxFrameString = 64u << 20;

// ---- framing --------------------------------------------------------------------------------

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= size_t(r);
  }
  return true;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(char((v >> (8 * i)) & 0xff));
}
void PutI64(std::string* out, int64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(char((uint64_t(v) >> (8 * i)) & 0xff));
}
void PutString(std::string* out, const std::string& s) {
  PutU32(out, uint32_t(s.size()));
  out->append(s);
}

bool ReadU32(int fd, uint32_t* v) {
  unsigned char b[4];
  if (!ReadAll(fd, b, 4)) return false;
  *v = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  return true;
}
bool ReadI64(int fd, int64_t* v) {
  unsigned char b[8];
  if (!ReadAll(fd, b, 8)) return false;
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = u << 8 | b[i];
  *v = int64_t(u);
  return true;
}
bool ReadString(int fd, std::string* s) {
  uint32_t n = 0;
  if (!ReadU32(fd, &n) || n > kMaxFrameString) return false;
  s->resize(n);
  return n == 0 || ReadAll(fd, s->data(), n);
}

// Compares without an early exit, so the time taken says nothing about a wrong token.
bool SameToken(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0);
  return diff == 0;
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---- addresses ------------------------------------------------------------------------------

std::string StoreAddress::ToString() const {
  std::string s;
  for (const std::string& h : hosts) s += (s.empty() ? "" : ",") + h;
  return s + ":" + std::to_string(port);
}

StatusOr<StoreAddress> ParseStoreAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("'" + text + "' is not HOST:PORT");
  }
  StoreAddress a;
  const std::string port = text.substr(colon + 1);
  char* end = nullptr;
  const long p = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) {
    return InvalidArgument("'" + text + "': port '" + port + "' is not in 1..65535");
  }
  a.port = int(p);
  std::string hosts = text.substr(0, colon);
  for (size_t at = 0; at <= hosts.size();) {
    const size_t comma = std::min(hosts.find(',', at), hosts.size());
    if (comma > at) a.hosts.push_back(hosts.substr(at, comma - at));
    at = comma + 1;
  }
  if (a.hosts.empty()) return InvalidArgument("'" + text + "': no host");
  return a;
}

std::string RandomToken() {
  unsigned char bytes[32] = {};
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

// ---- server ---------------------------------------------------------------------------------

struct TcpStoreServer::State {
  std::string token;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::map<std::string, std::string> values;
  std::set<int> fds;   // open connections, closed at shutdown
  int live_ranks = 0;  // registered, not yet gone
  bool stopping = false;
  std::vector<std::thread> threads;

  void Set(const std::string& key, const std::string& value) {
    {
      std::lock_guard<std::mutex> lock(mu);
      values[key] = value;
    }
    cv.notify_all();
  }

  void Serve(int fd) {
    SetNoDelay(fd);
    std::string who;  // set by 'R'
    bool left = false;
    auto reply = [&](char verb, const std::string* value) {
      std::string out(1, verb);
      if (value != nullptr) PutString(&out, *value);
      return WriteAll(fd, out.data(), out.size());
    };
    // Handshake: magic, version, token. The reply says why a client is refused.
    char magic[4];
    uint32_t version = 0;
    std::string client_token, status;
    bool ok = ReadAll(fd, magic, 4) && std::memcmp(magic, kMagic, 4) == 0 && ReadU32(fd, &version);
    if (ok && version != kStoreProtocolVersion) {
      status = "store protocol version " + std::to_string(version) + " refused: this node 0 " +
               "speaks version " + std::to_string(kStoreProtocolVersion);
      reply('E', &status);
      ok = false;
    } else if (ok && !(ReadString(fd, &client_token) && SameToken(client_token, token))) {
      status = "wrong token: this store belongs to another job (see --dist-token)";
      reply('E', &status);
      ok = false;
    } else if (ok) {
      ok = reply('K', nullptr);
    }
    while (ok) {
      char verb = 0;
      if (!ReadAll(fd, &verb, 1)) break;
      std::string key, value;
      int64_t wait_ms = 0;
      if (verb == 'S') {
        ok = ReadString(fd, &key) && ReadString(fd, &value);
        if (ok) Set(key, value);
        ok = ok && reply('K', nullptr);
      } else if (verb == 'G') {
        ok = ReadString(fd, &key) && ReadI64(fd, &wait_ms);
        if (!ok) break;
        std::unique_lock<std::mutex> lock(mu);
        const bool found = cv.wait_for(
            lock, std::chrono::milliseconds(std::clamp<int64_t>(wait_ms, 0, kServerWaitSliceMs)),
            [&] { return stopping || values.count(key) != 0; });
        const bool have = found && values.count(key) != 0;
        if (have) value = values[key];
        lock.unlock();
        ok = have ? reply('V', &value) : reply('T', nullptr);
      } else if (verb == 'R') {
        ok = ReadString(fd, &who);
        if (ok) {
          std::lock_guard<std::mutex> lock(mu);
          ++live_ranks;
        }
        ok = ok && reply('K', nullptr);
      } else if (verb == 'B') {
        left = true;
        reply('K', nullptr);
        break;
      } else {
        break;  // a client that speaks something else: drop it
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    if (!who.empty()) {
      --live_ranks;
      // A rank whose connection closed without goodbye was killed (or crashed): the first one
      // is what every other rank reports.
      if (!left && !stopping && values.count(kDeadKey) == 0) values[kDeadKey] = who;
    }
    fds.erase(fd);
    ::close(fd);
    lock.unlock();
    cv.notify_all();
  }
};

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& bind_host,
                                                                int port, std::string token) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->state_ = std::make_shared<State>();
  server->state_->token = std::move(token);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const std::string host = bind_host == "0.0.0.0" ? "" : bind_host;
  const std::string port_text = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &res);
      rc != 0) {
    return InvalidArgument("store: cannot resolve '" + bind_host + "': " + gai_strerror(rc));
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 256) == 0;
  freeaddrinfo(res);
  if (!bound) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return Unavailable("store: cannot listen on " + (host.empty() ? "*" : host) + ":" + port_text +
                       ": " + why);
  }
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = ntohs(addr.sin_port);
  server->listen_fd_ = fd;
  std::shared_ptr<State> state = server->state_;
  state->threads.emplace_back([state, fd] {
    for (;;) {
      const int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // the listening socket was shut down
      }
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->stopping) {
        ::close(c);
        return;
      }
      state->fds.insert(c);
      state->threads.emplace_back([state, c] { state->Serve(c); });
    }
  });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    for (int fd : state_->fds) ::shutdown(fd, SHUT_RDWR);
  }
  state_->cv.notify_all();
  // The accept thread is first and adds no thread once it returned; join it before taking the
  // list, which it may still be appending to.
  state_->threads.front().join();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    threads.swap(state_->threads);
  }
  for (size_t i = 1; i < threads.size(); ++i) threads[i].join();
  ::close(listen_fd_);
}

int TcpStoreServer::live_ranks() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->live_ranks;
}

bool TcpStoreServer::WaitRanksGone(int64_t timeout_ms) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                             [&] { return state_->live_ranks == 0; });
}

// ---- client ---------------------------------------------------------------------------------

namespace {

// One attempt at host:port within `budget`: a connected socket, or -1 and why.
int TryConnect(const std::string& host, int port, int64_t budget_ms, std::string* why) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *why = std::string("cannot resolve: ") + gai_strerror(rc);
    return -1;
  }
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int rc = fd < 0 ? -1 : ::connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, int(std::max<int64_t>(budget_ms, 1)));
    int err = 0;
    socklen_t len = sizeof(err);
    if (rc == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (rc == 0) err = ETIMEDOUT;
    rc = err == 0 && rc == 1 ? 0 : -1;
    errno = err;
  }
  if (rc != 0) {
    *why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  SetNoDelay(fd);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<TcpKvStore>> TcpKvStore::Connect(const StoreAddress& address,
                                                          const std::string& token,
                                                          int64_t timeout_ms,
                                                          const std::string& self) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string last_error;
  for (int attempt = 0;; ++attempt) {
    for (const std::string& host : address.hosts) {
      const int64_t left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      std::string why;
      const int fd =
          TryConnect(host, address.port, std::min<int64_t>(std::max<int64_t>(left, 1), 2000), &why);
      if (fd < 0) {
        last_error = host + ":" + std::to_string(address.port) + ": " + why;
        continue;
      }
      std::string hello(kMagic, 4);
      PutU32(&hello, kStoreProtocolVersion);
      PutString(&hello, token);
      char verb = 0;
      std::string message;
      // A server that accepts but never answers (not a polychip store) must not hang us.
      timeval tv{10, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      const bool answered = WriteAll(fd, hello.data(), hello.size()) && ReadAll(fd, &verb, 1);
      if (answered && verb == 'E') ReadString(fd, &message);
      if (!answered || verb != 'K') {
        ::close(fd);
        const std::string where = host + ":" + std::to_string(address.port);
        // Refused by a store: retrying cannot help.
        if (verb == 'E')
          return FailedPrecondition(self + ": the store at " + where + " refused us: " + message);
        last_error = where + ": no store answered the handshake";
        continue;
      }
      timeval none{0, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
      std::unique_ptr<TcpKvStore> store(new TcpKvStore());
      store->fd_ = fd;
      store->address_ = host + ":" + std::to_string(address.port);
      return store;
    }
    if (Clock::now() >= deadline) {
      return Unavailable(self + ": cannot reach the store of node 0 at " + address.ToString() +
                         " within " + std::to_string(timeout_ms) + " ms (" + last_error + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (attempt + 1), 500)));
  }
}

TcpKvStore::~TcpKvStore() {
  if (fd_ >= 0) ::close(fd_);
}

Status TcpKvStore::Roundtrip(const std::string& request, char* verb, std::string* value) {
  if (fd_ < 0) return Unavailable("store: connection closed");
  if (!WriteAll(fd_, request.data(), request.size()) || !ReadAll(fd_, verb, 1)) {
    lost_.store(true);
    return Unavailable("store: lost the connection to node 0's store at " + address_);
  }
  if (*verb == 'V' && !ReadString(fd_, value)) {
    lost_.store(true);
    return Unavailable("store: lost the connection to node 0's store at " + address_);
  }
  return Status::Ok();
}

std::string TcpKvStore::local_address() const {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  char text[INET_ADDRSTRLEN] = {};
  if (fd_ < 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) == nullptr) {
    return "";
  }
  return text;
}

Status TcpKvStore::Set(const std::string& key, const std::string& value) {
  std::string req(1, 'S');
  PutString(&req, key);
  PutString(&req, value);
  std::lock_guard<std::mutex> lock(mu_);
  char verb = 0;
  return Roundtrip(req, &verb, nullptr);
}

StatusOr<std::string> TcpKvStore::Get(const std::string& key, int64_t timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  for (;;) {
    const int64_t left =
        timeout_ms < 0
            ? kServerWaitSliceMs
            : std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())
                  .count();
    std::string req(1, 'G');
    PutString(&req, key);
    PutI64(&req, std::max<int64_t>(left, 0));
    char verb = 0;
    std::string value;
    {
      std::lock_guard<std::mutex> lock(mu_);
      PC_RETURN_IF_ERROR(Roundtrip(req, &verb, &value));
    }
    if (verb == 'V') return value;
    if (timeout_ms >= 0 && Clock::now() >= deadline) {
      return Unavailable("key '" + key + "' not set within " + std::to_string(timeout_ms) +
                         " ms (store at " + address_ + ")");
    }
  }
}

Status TcpKvStore::Register(const std::string& who) {
  std::string req(1, 'R');
  PutString(&req, who);
  std::lock_guard<std::mutex> lock(mu_);
  char verb = 0;
  return Roundtrip(req, &verb, nullptr);
}

void TcpKvStore::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return;
  char verb = 0;
  const char bye = 'B';
  if (WriteAll(fd_, &bye, 1)) ReadAll(fd_, &verb, 1);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace polychip::dist
