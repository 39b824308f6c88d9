// The job's TCP key-value store (dist/tcp_store.h): values across connections, gets that wait
// and time out, the handshake refusing a wrong token or protocol version with a message that
// says which, connect retries until node 0 is up, and a registered rank that vanishes without
// leaving reported under kDeadKey.
#include "dist/tcp_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace polychip::dist {
namespace {

StoreAddress Loopback(int port) { return StoreAddress{{"127.0.0.1"}, port}; }

TEST(TcpStore, SetGetAcrossConnectionsAndTimeouts) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "secret");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto a = TcpKvStore::Connect(Loopback((*server)->port()), "secret", 2000, "a");
  auto b = TcpKvStore::Connect(Loopback((*server)->port()), "secret", 2000, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  std::string binary("id\0with\0zeros", 13);
  ASSERT_TRUE((*a)->Set("world", binary).ok());
  auto got = (*b)->Get("world", 1000);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, binary);
  // A get waits for a later set (longer than one server-side wait slice).
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    (void)(*a)->Set("late", "v");
  });
  auto late = (*b)->Get("late", 5000);
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(*late, "v");
  const auto start = std::chrono::steady_clock::now();
  auto missing = (*b)->Get("never", 300);
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(missing.status().message().find("'never' not set within 300 ms"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(TcpStore, StrangersAndOtherVersionsAreRefusedWithTheReason) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "secret");
  ASSERT_TRUE(server.ok());
  auto wrong = TcpKvStore::Connect(Loopback((*server)->port()), "guess", 2000, "node 1");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("node 1: the store at 127.0.0.1:"), std::string::npos)
      << wrong.status().message();
  EXPECT_NE(wrong.status().message().find("wrong token"), std::string::npos);

  // A client of protocol version 99, by hand.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons((*server)->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char hello[] = {'P', 'C', 'K', 'V', 99, 0, 0, 0};
  ASSERT_EQ(write(fd, hello, sizeof(hello)), ssize_t(sizeof(hello)));
  char reply[512] = {};
  size_t n = 0;
  for (ssize_t r; (r = read(fd, reply + n, sizeof(reply) - 1 - n)) > 0;) n += size_t(r);
  close(fd);
  ASSERT_GT(n, 5u);
  EXPECT_EQ(reply[0], 'E');
  EXPECT_NE(std::string(reply + 5, n - 5).find("version 99 refused"), std::string::npos);
}

TEST(TcpStore, ConnectRetriesUntilNodeZeroIsUpAndNamesTheAddressWhenItNeverIs) {
  // A free port: take one, close it, serve on it a little later.
  int port = 0;
  {
    auto probe = TcpStoreServer::Start("127.0.0.1", 0, "t");
    ASSERT_TRUE(probe.ok());
    port = (*probe)->port();
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    auto started = TcpStoreServer::Start("127.0.0.1", port, "t");
    if (started.ok()) server = std::move(*started);
  });
  auto client = TcpKvStore::Connect(Loopback(port), "t", 5000, "rank 3");
  later.join();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  (*client)->Leave();
  server.reset();

  auto never = TcpKvStore::Connect(Loopback(port), "t", 300, "node 1");
  ASSERT_FALSE(never.ok());
  EXPECT_NE(never.status().message().find("node 1: cannot reach the store of node 0 at 127.0.0.1:" +
                                          std::to_string(port) + " within 300 ms"),
            std::string::npos)
      << never.status().message();
}

TEST(TcpStore, ARankThatVanishesWithoutLeavingIsReported) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, "t");
  ASSERT_TRUE(server.ok());
  auto watcher = TcpKvStore::Connect(Loopback((*server)->port()), "t", 2000, "w");
  ASSERT_TRUE(watcher.ok());
  {
    auto polite = TcpKvStore::Connect(Loopback((*server)->port()), "t", 2000, "p");
    ASSERT_TRUE((*polite)->Register("rank 1 (pid 11) on host a").ok());
    (*polite)->Leave();  // not a death
  }
  EXPECT_FALSE((*watcher)->Get(kDeadKey, 200).ok());
  {
    auto doomed = TcpKvStore::Connect(Loopback((*server)->port()), "t", 2000, "d");
    ASSERT_TRUE((*doomed)->Register("rank 2 (pid 22) on host b").ok());
  }  // closed without goodbye, as a killed process's socket is
  auto dead = (*watcher)->Get(kDeadKey, 2000);
  ASSERT_TRUE(dead.ok()) << dead.status().ToString();
  EXPECT_EQ(*dead, "rank 2 (pid 22) on host b");
  EXPECT_TRUE((*server)->WaitRanksGone(1000));
}

TEST(TcpStore, ParsesAddresses) {
  auto a = ParseStoreAddress("10.0.0.1,127.0.0.1:5000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->hosts.size(), 2u);
  EXPECT_EQ(a->port, 5000);
  EXPECT_EQ(a->ToString(), "10.0.0.1,127.0.0.1:5000");
  EXPECT_FALSE(ParseStoreAddress("nohost").ok());
  EXPECT_FALSE(ParseStoreAddress("h:70000").ok());
}

}  // namespace
}  // namespace polychip::dist
