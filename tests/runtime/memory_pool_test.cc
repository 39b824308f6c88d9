// The two-level memory pool over the in-test fake device (alignment 4096, max single allocation
// 64 MiB, no async free).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "common/fake_backend.h"
#include "runtime/abi_internal.h"
#include "runtime/memory_pool.h"
#include "test_util.h"

namespace polychip::runtime {
namespace {

using ::testing::HasSubstr;

class MemoryPoolTest : public testing::RuntimeTest {
 protected:
  void SetUp() override {
    RuntimeTest::SetUp();
    FakeSetMemory(256ull << 20);
    FakeSetPaused(0);
    auto b = PluginRegistry::Global().RegisterBackendTable(FakeBackendTable());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    auto d = (*b)->OpenDevice(0);
    ASSERT_TRUE(d.ok());
    device_ = *d;
    baseline_allocs_ = FakeGetStats()->live_allocs;
  }
  void TearDown() override {
    FakeSetPaused(0);
    FakeSetMemory(256ull << 20);
    device_.reset();
    RuntimeTest::TearDown();
  }
  std::shared_ptr<Device> device_;
  int64_t baseline_allocs_ = 0;
};

TEST_F(MemoryPoolTest, ArenaRespectsMaxAllocAndBlocksAreAligned) {
  MemoryPool pool(device_, {.arena_bytes = 256ull << 20});
  EXPECT_EQ(pool.arena_bytes(), 64ull << 20);  // clamped to max_alloc_size
  EXPECT_EQ(pool.alignment(), 4096u);
  std::vector<PoolBlock> blocks;
  std::set<DevPtr> ptrs;
  uint64_t expect_in_use = 0;
  for (int i = 1; i <= 50; ++i) {
    auto b = pool.Allocate(i * 1000);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->ptr % 4096, 0u);
    EXPECT_EQ(b->size % 4096, 0u);
    EXPECT_GE(b->size, uint64_t(i * 1000));
    EXPECT_TRUE(ptrs.insert(b->ptr).second);
    expect_in_use += b->size;
    blocks.push_back(*b);
  }
  // Blocks never overlap.
  std::sort(blocks.begin(), blocks.end(), [](auto& a, auto& b) { return a.ptr < b.ptr; });
  for (size_t i = 1; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i - 1].ptr + blocks[i - 1].size, blocks[i].ptr);
  }
  EXPECT_EQ(pool.in_use_bytes(), expect_in_use);
  EXPECT_EQ(pool.peak_bytes(), expect_in_use);
  EXPECT_EQ(FakeGetStats()->live_allocs, baseline_allocs_ + 1);  // one arena served them all
  for (const auto& b : blocks) ASSERT_TRUE(pool.Free(b).ok());
  EXPECT_EQ(pool.in_use_bytes(), 0u);
  EXPECT_EQ(pool.peak_bytes(), expect_in_use);
}

TEST_F(MemoryPoolTest, FreedNeighboursCoalesce) {
  MemoryPool pool(device_, {.arena_bytes = 1 << 20});
  std::vector<PoolBlock> blocks;
  for (int i = 0; i < 16; ++i) blocks.push_back(*pool.Allocate(64 << 10));  // fills the arena
  const int64_t calls = FakeGetStats()->alloc_calls;
  // Free in an interleaved order so merging must happen on both sides.
  for (int i = 0; i < 16; i += 2) ASSERT_TRUE(pool.Free(blocks[i]).ok());
  for (int i = 1; i < 16; i += 2) ASSERT_TRUE(pool.Free(blocks[i]).ok());
  auto whole = pool.Allocate(1 << 20);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->ptr, blocks[0].ptr);
  EXPECT_EQ(FakeGetStats()->alloc_calls, calls);  // no new arena was needed
}

TEST_F(MemoryPoolTest, OversizeAndOutOfMemoryAreResourceExhausted) {
  FakeSetMemory(8 << 20);
  MemoryPool pool(device_, {.arena_bytes = 2 << 20});
  auto too_big = pool.Allocate(65ull << 20);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("max single allocation"));
  std::vector<PoolBlock> blocks;
  Status last;
  for (int i = 0; i < 100; ++i) {
    auto b = pool.Allocate(1 << 20);
    if (!b.ok()) {
      last = b.status();
      break;
    }
    blocks.push_back(*b);
  }
  EXPECT_EQ(blocks.size(), 8u);
  EXPECT_EQ(last.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(last.message(), HasSubstr("out of device memory"));
  // A request larger than an arena gets its own arena once memory is back.
  for (const auto& b : blocks) ASSERT_TRUE(pool.Free(b).ok());
  ASSERT_TRUE(pool.Trim().ok());
  EXPECT_EQ(pool.reserved_bytes(), 0u);
  EXPECT_EQ(FakeGetStats()->live_allocs, baseline_allocs_);
  auto big = pool.Allocate(5 << 20);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(pool.reserved_bytes(), 5u << 20);
}

TEST_F(MemoryPoolTest, CapOnTotalBytes) {
  MemoryPool pool(device_, {.arena_bytes = 1 << 20, .max_total_bytes = 2 << 20});
  ASSERT_TRUE(pool.Allocate(1 << 20).ok());
  ASSERT_TRUE(pool.Allocate(1 << 20).ok());
  auto third = pool.Allocate(4096);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(MemoryPoolTest, StreamOrderedFree) {
  MemoryPool pool(device_, {.arena_bytes = 1 << 20});
  auto s1 = device_->CreateStream();
  auto s2 = device_->CreateStream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto a = pool.Allocate(1 << 20, s1->get());
  ASSERT_TRUE(a.ok());
  FakeSetPaused(1);  // work on the streams does not complete
  ASSERT_TRUE(pool.Free(*a, s1->get()).ok());
  EXPECT_EQ(pool.in_use_bytes(), 0u);
  // Another stream must not get memory s1 may still be using.
  auto b = pool.Allocate(1 << 20, s2->get());
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->ptr, a->ptr);
  // The freeing stream itself may reuse it at once (its later work is ordered after the free).
  auto c = pool.Allocate(1 << 20, s1->get());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->ptr, a->ptr);
  ASSERT_TRUE(pool.Free(*c, s1->get()).ok());
  FakeSetPaused(0);  // the recorded event completes: the block is free for everyone
  auto d = pool.Allocate(1 << 20, s2->get());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ptr, a->ptr);
  ASSERT_TRUE(pool.Free(*b).ok());
  ASSERT_TRUE(pool.Free(*d, s2->get()).ok());
}

TEST_F(MemoryPoolTest, BadFreesAreErrorsAndArenasAreReturned) {
  {
    MemoryPool pool(device_, {.arena_bytes = 1 << 20});
    auto a = pool.Allocate(4096);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(pool.Free(*a).ok());
    EXPECT_EQ(pool.Free(*a).code(), StatusCode::kInvalidArgument);  // double free
    PoolBlock bogus{a->ptr + 4096, 4096, a->arena};
    EXPECT_EQ(pool.Free(bogus).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(pool.Allocate(8192).ok());  // left allocated: the destructor still frees arenas
    EXPECT_EQ(FakeGetStats()->live_allocs, baseline_allocs_ + 1);
  }
  EXPECT_EQ(FakeGetStats()->live_allocs, baseline_allocs_);
}

}  // namespace
}  // namespace polychip::runtime
