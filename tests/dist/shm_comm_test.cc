// The shm comm plugin through runtime::Communicator: every collective against a plain reference
// (odd sizes, chunked through a deliberately small slot), sub-communicators, and the failure
// paths: a rank that never arrives, a rank that is killed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/comm.h"
#include "runtime/dtype.h"
#include "runtime/host_services.h"
#include "runtime/plugin_loader.h"

namespace polychip::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Loaded once per test program; a 4 KiB slot makes every size below span many chunks.
std::shared_ptr<CommPlugin> Shm() {
  static std::shared_ptr<CommPlugin> plugin = [] {
    auto p = LoadCommFromPath(std::string(POLYCHIP_BUILD_DIR) +
                                  "/lib/polychip/libpolychip_comm_shm.so",
                              {{"buffer_bytes", "4096"}, {"timeout_ms", "5000"}});
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : nullptr;
  }();
  return plugin;
}

std::string UniqueKey(const std::string& what) {
  static int counter = 0;
  return what + "-" + std::to_string(getpid()) + "-" + std::to_string(++counter);
}

// Runs body(rank, comm) on n threads, each with its own communicator.
void RunRanks(int n, const std::function<void(int, Communicator&)>& body) {
  ASSERT_NE(Shm(), nullptr);
  InProcessKvStore kv;
  const std::string key = UniqueKey("threads");
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::Create(Shm(), kv, key, n, r, 5000);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Small integers: exact in every dtype, so the reference comparison is exact.
float Value(int rank, uint64_t i) { return static_cast<float>((rank + 1) * 3 + int(i % 13) - 6); }

TEST(ShmComm, AllReduceF32OddSizesBothProtocolsShareTheSlots) {
  for (uint64_t count : {1ull, 7ull, 1023ull, 5003ull}) {
    RunRanks(3, [&](int rank, Communicator& c) {
      std::vector<float> send(count), recv(count, -1.f);
      for (uint64_t i = 0; i < count; ++i) send[i] = Value(rank, i);
      ASSERT_TRUE(c.AllReduce(send.data(), recv.data(), count, DType::kF32, ReduceOp::kSum).ok());
      for (uint64_t i = 0; i < count; ++i) {
        ASSERT_EQ(recv[i], Value(0, i) + Value(1, i) + Value(2, i)) << "count " << count << " i " << i;
      }
      // In place, max.
      ASSERT_TRUE(c.AllReduce(send.data(), send.data(), count, DType::kF32, ReduceOp::kMax).ok());
      for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(send[i], Value(2, i));
    });
  }
}

TEST(ShmComm, AllReduceHalfTypesAndIntegers) {
  RunRanks(2, [&](int rank, Communicator& c) {
    const uint64_t n = 3001;
    std::vector<uint16_t> h(n), b(n);
    std::vector<int32_t> iv(n);
    for (uint64_t i = 0; i < n; ++i) {
      h[i] = Fp32ToFp16(Value(rank, i));
      b[i] = Fp32ToBf16(Value(rank, i));
      iv[i] = static_cast<int32_t>(i) * (rank + 1) - 1000;
    }
    ASSERT_TRUE(c.AllReduce(h.data(), h.data(), n, DType::kF16, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.AllReduce(b.data(), b.data(), n, DType::kBF16, ReduceOp::kMin).ok());
    ASSERT_TRUE(c.AllReduce(iv.data(), iv.data(), n, DType::kI32, ReduceOp::kSum).ok());
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Fp16ToFp32(h[i]), Value(0, i) + Value(1, i));
      ASSERT_EQ(Bf16ToFp32(b[i]), Value(0, i));
      ASSERT_EQ(iv[i], static_cast<int32_t>(i) * 3 - 2000);
    }
    // Quantized blocks have no element-wise reduction.
    Status s = c.AllReduce(h.data(), h.data(), 32, DType::kQ8_0, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  });
}

TEST(ShmComm, GatherScatterBroadcastSendRecvBarrier) {
  const int n = 3;
  RunRanks(n, [&](int rank, Communicator& c) {
    const uint64_t count = 1501;  // odd, > one 4 KiB slot of F32
    std::vector<float> mine(count), all(n * count);
    for (uint64_t i = 0; i < count; ++i) mine[i] = Value(rank, i);
    ASSERT_TRUE(c.AllGather(mine.data(), all.data(), count, DType::kF32).ok());
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], Value(r, i));
    }
    // reduce_scatter: rank r gets sum over ranks of their r-th row.
    std::vector<float> rows(n * count), part(count);
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) rows[r * count + i] = Value(rank, i) * (r + 1);
    }
    ASSERT_TRUE(c.ReduceScatter(rows.data(), part.data(), count, DType::kF32, ReduceOp::kSum).ok());
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(part[i], (Value(0, i) + Value(1, i) + Value(2, i)) * (rank + 1));
    }
    // broadcast from rank 1, odd size in bytes.
    std::vector<int8_t> bytes(4099, static_cast<int8_t>(rank));
    if (rank == 1) {
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<int8_t>(i * 7);
    }
    ASSERT_TRUE(c.Broadcast(bytes.data(), bytes.data(), bytes.size(), DType::kI8, 1).ok());
    for (size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(bytes[i], static_cast<int8_t>(i * 7));
    // A pipeline: 0 -> 1 -> 2, each adds its rank.
    std::vector<float> act(2049);
    if (rank == 0) {
      for (size_t i = 0; i < act.size(); ++i) act[i] = float(i);
    } else {
      ASSERT_TRUE(c.Recv(act.data(), act.size(), DType::kF32, rank - 1).ok());
    }
    for (float& v : act) v += rank;
    if (rank + 1 < n) {
      ASSERT_TRUE(c.Send(act.data(), act.size(), DType::kF32, rank + 1).ok());
    } else {
      for (size_t i = 0; i < act.size(); ++i) ASSERT_EQ(act[i], float(i) + 3);
    }
    ASSERT_TRUE(c.Barrier().ok());
    EXPECT_GE(c.n_ops(), 5u);
    // Bad arguments are errors, not hangs.
    EXPECT_EQ(c.Send(act.data(), 1, DType::kF32, rank).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(c.Broadcast(act.data(), act.data(), 1, DType::kF32, 9).code(),
              StatusCode::kInvalidArgument);
  });
}

// 4 ranks as a 2 x 2 grid: TP groups {0,1} {2,3}, PP groups {0,2} {1,3}; each rank sits in
// one of each, and uses both, interleaved.
TEST(ShmComm, OverlappingSubCommunicators) {
  RunRanks(4, [&](int rank, Communicator& world) {
    auto tp = world.Split(rank / 2, rank);
    ASSERT_TRUE(tp.ok()) << tp.status().ToString();
    auto pp = world.Split(rank % 2, -rank);  // key reverses the order
    ASSERT_TRUE(pp.ok()) << pp.status().ToString();
    auto none = world.Split(rank == 3 ? 0 : -1, 0);  // only rank 3 in a group of one
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none == nullptr, rank != 3);
    ASSERT_EQ((*tp)->size(), 2);
    ASSERT_EQ((*tp)->rank(), rank % 2);
    ASSERT_EQ((*pp)->size(), 2);
    ASSERT_EQ((*pp)->rank(), rank / 2 == 1 ? 0 : 1);
    for (int round = 0; round < 3; ++round) {
      int32_t v = rank + 10 * round, sum_tp = 0, sum_pp = 0;
      ASSERT_TRUE((*tp)->AllReduce(&v, &sum_tp, 1, DType::kI32, ReduceOp::kSum).ok());
      ASSERT_TRUE((*pp)->AllReduce(&v, &sum_pp, 1, DType::kI32, ReduceOp::kSum).ok());
      const int tp_base = (rank / 2) * 2, pp_base = rank % 2;
      EXPECT_EQ(sum_tp, tp_base + tp_base + 1 + 20 * round);
      EXPECT_EQ(sum_pp, pp_base + pp_base + 2 + 20 * round);
    }
    // Nested: split a sub-communicator again.
    auto solo = (*tp)->Split((*tp)->rank(), 0);
    ASSERT_TRUE(solo.ok());
    ASSERT_EQ((*solo)->size(), 1);
    ASSERT_TRUE(world.Barrier().ok());
  });
}

TEST(ShmComm, MissingRankTimesOutNamingIt) {
  ASSERT_NE(Shm(), nullptr);
  InProcessKvStore kv;
  const std::string key = UniqueKey("missing");
  std::vector<Status> results(2);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // rank 2 of 3 never comes
    threads.emplace_back([&, r] {
      auto c = Communicator::Create(Shm(), kv, key, 3, r, 400);
      results[r] = c.ok() ? Status::Ok() : c.status();
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(seconds, 3.0);
  for (const Status& s : results) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("missing rank(s): 2"), std::string::npos) << s.ToString();
  }
  // Nothing is left behind in /dev/shm.
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_EQ(e.path().filename().string().find("pcshm-" + std::to_string(getpid()) + "-"),
              std::string::npos)
        << e.path();
  }
}

TEST(ShmComm, AbortFailsThePeers) {
  RunRanks(2, [&](int rank, Communicator& c) {
    if (rank == 1) {
      c.Abort();
      EXPECT_EQ(c.Barrier().code(), StatusCode::kCancelled);
      return;
    }
    Status s = c.Barrier();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 1 aborted"), std::string::npos) << s.ToString();
  });
}

// Three processes: rank 2 is SIGKILLed after a first all-reduce; ranks 0 and 1 must fail their
// next collective naming rank 2 within 10 s (rank 2 stays a zombie meanwhile: nobody reaps it).
TEST(ShmComm, KilledRankIsReportedByNumber) {
  ASSERT_NE(Shm(), nullptr);
  const std::string dir = "/tmp/polychip-dist-test-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string key = UniqueKey("killed");
  auto rank_main = [&](int rank) -> int {  // exit status: 0 = as expected
    FileKvStore kv(dir);
    auto c = Communicator::Create(Shm(), kv, key, 3, rank, 5000);
    if (!c.ok()) return 10;
    float v = 1.f, sum = 0.f;
    if (!(*c)->AllReduce(&v, &sum, 1, DType::kF32, ReduceOp::kSum).ok() || sum != 3.f) return 11;
    if (rank == 2) raise(SIGKILL);
    const auto start = Clock::now();
    std::vector<float> big(100000, 1.f);
    Status s = (*c)->AllReduce(big.data(), big.data(), big.size(), DType::kF32, ReduceOp::kSum);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (s.ok()) return 12;
    if (s.code() != StatusCode::kUnavailable) return 13;
    if (s.message().find("rank 2") == std::string::npos) return 14;
    if (seconds > 10) return 15;
    return 0;
  };
  std::vector<pid_t> kids;
  for (int r = 1; r < 3; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(30);  // never outlive a broken test
      _exit(rank_main(r));
    }
    kids.push_back(pid);
  }
  EXPECT_EQ(rank_main(0), 0);
  int status = 0;
  ASSERT_EQ(waitpid(kids[0], &status, 0), kids[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank 1 status " << status;
  ASSERT_EQ(waitpid(kids[1], &status, 0), kids[1]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace polychip::runtime
