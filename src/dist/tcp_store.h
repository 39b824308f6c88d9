// The job's key-value store over TCP: node 0 serves it, every rank of every node connects. It
// backs the host KV services of the plugin ABI (runtime::SetHostKvStore), so communicator ids
// and a plugin's own rendezvous (gloo's) travel through it, and no shared filesystem is needed.
//
// Wire format: every frame is a 1-byte verb followed by length-prefixed strings (u32 little
// endian) and fixed-size integers. The connection opens with a handshake that carries the
// protocol version and the job's token, so a client of another version, or of another job
// (a stranger on the port), is refused with a message that says which. Verbs after it:
//   'S' key value          -> 'K'                  set (overwrites)
//   'G' key wait_ms(i64)   -> 'V' value | 'T'      get, waiting at most wait_ms on the server
//   'R' who                -> 'K'                  this connection is a rank: "rank R (pid P) on
//                                                  host H"; if it closes without 'B', the server
//                                                  sets kDeadKey to who (a killed rank)
//   'B'                    -> 'K'                  leaving cleanly
// A get that waits longer is cut into short server-side waits, so one connection never blocks
// for long and the client keeps its own deadline.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/host_services.h"
#include "util/status.h"

namespace polychip::dist {

inline constexpr uint32_t kStoreProtocolVersion = 1;
// Set by the server to the `who` of the first registered connection that closed without
// saying goodbye; every rank's watchdog waits on it.
inline constexpr char kDeadKey[] = "dist/dead";

// host:port, or "h1,h2:port" (several addresses of one node, tried in order).
struct StoreAddress {
  std::vector<std::string> hosts;
  int port = 0;
  std::string ToString() const;
};
StatusOr<StoreAddress> ParseStoreAddress(const std::string& text);

class TcpStoreServer {
 public:
  // Listens on `bind_host`:port (port 0: any free port; bind_host "" or "0.0.0.0": every
  // interface).
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& bind_host, int port,
                                                         std::string token);
  ~TcpStoreServer();  // stops accepting and closes every connection
  int port() const { return port_; }
  // Registered connections (ranks) that have not said goodbye.
  int live_ranks() const;
  // Waits until no registered rank is connected, at most timeout_ms; false on timeout.
  bool WaitRanksGone(int64_t timeout_ms) const;

  struct State;  // shared with the connection threads

 private:
  TcpStoreServer() = default;
  int port_ = 0;
  int listen_fd_ = -1;
  std::shared_ptr<State> state_;
};

// One client connection. Thread-safe (operations are serialized on the connection).
class TcpKvStore : public runtime::KvStore {
 public:
  // Connects, retrying refused or unreachable addresses until timeout_ms (the server may not
  // be up yet), and runs the handshake. `self` names the caller in the error messages.
  static StatusOr<std::unique_ptr<TcpKvStore>> Connect(const StoreAddress& address,
                                                       const std::string& token, int64_t timeout_ms,
                                                       const std::string& self);
  ~TcpKvStore() override;

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, int64_t timeout_ms) override;
  // Registers this connection as a rank (see 'R' above).
  Status Register(const std::string& who);
  // Says goodbye (the server will not report this connection as dead) and closes.
  void Leave();
  const std::string& address() const { return address_; }
  // This end's IPv4 address: one that node 0 (and so, normally, every host) can reach.
  std::string local_address() const;
  // True once the connection to the server broke (not merely a get that timed out).
  bool lost() const { return lost_.load(); }

 private:
  TcpKvStore() = default;
  Status Roundtrip(const std::string& request, char* verb, std::string* value);
  std::mutex mu_;
  int fd_ = -1;
  std::string address_;  // the one that answered, for messages
  std::atomic<bool> lost_{false};
};

// 32 random bytes as hex, for a job whose launcher made its own token.
std::string RandomToken();

}  // namespace polychip::dist
