#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <climits>
#include <numeric>

namespace polychip::engine {
namespace {

std::vector<int32_t> Iota(int n, int start) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(BlockManager, AllocateReleaseAndRefcounts) {
  BlockManager bm(8, 4, true);
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(5, &a));
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(bm.NumHeld(), 5);
  EXPECT_EQ(bm.NumAvailable(), 3);
  std::vector<int32_t> b;
  EXPECT_FALSE(bm.Allocate(4, &b));  // all or nothing
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(bm.NumAvailable(), 3);
  bm.Release(a);
  EXPECT_EQ(bm.NumHeld(), 0);
  EXPECT_EQ(bm.NumFree(), 8);
}

TEST(BlockManager, PrefixSharingTakesReferences) {
  BlockManager bm(8, 4, true);
  auto tokens = Iota(10, 100);  // 2 full blocks + 2 tokens
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(3, &a));
  bm.InsertPrefix(tokens, &a);
  EXPECT_EQ(bm.NumCached(), 2);  // only the full blocks
  EXPECT_TRUE(bm.IsCached(a[0]) && bm.IsCached(a[1]) && !bm.IsCached(a[2]));

  std::vector<int32_t> b;
  EXPECT_EQ(bm.MatchPrefix(tokens, 9, &b), 8);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_EQ(bm.RefCount(a[0]), 2);
  // max_tokens caps the match to whole blocks below it.
  std::vector<int32_t> c;
  EXPECT_EQ(bm.MatchPrefix(tokens, 7, &c), 4);
  EXPECT_EQ(bm.RefCount(a[0]), 3);
  EXPECT_EQ(bm.PeekPrefix(tokens, 100), 8);
  // A different first block matches nothing.
  auto other = tokens;
  other[0] = 7;
  std::vector<int32_t> d;
  EXPECT_EQ(bm.MatchPrefix(other, 100, &d), 0);

  bm.Release(a);
  bm.Release(b);
  bm.Release(c);
  EXPECT_EQ(bm.NumHeld(), 0);
  // The cached blocks stay (evictable), the partial block went back to the free list.
  EXPECT_EQ(bm.NumCached(), 2);
  EXPECT_EQ(bm.NumFree(), 6);
  EXPECT_EQ(bm.NumAvailable(), 8);
}

TEST(BlockManager, LruEvictionKeepsRecentlyUsedPrefix) {
  BlockManager bm(4, 2, true);
  auto pa = Iota(4, 10), pb = Iota(4, 50);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(bm.Allocate(2, &a));
  ASSERT_TRUE(bm.Allocate(2, &b));
  bm.InsertPrefix(pa, &a);
  bm.InsertPrefix(pb, &b);
  bm.Release(a);
  bm.Release(b);
  ASSERT_EQ(bm.NumFree(), 0);
  ASSERT_EQ(bm.NumAvailable(), 4);
  // Use A again: B becomes the least recently used.
  std::vector<int32_t> again;
  ASSERT_EQ(bm.MatchPrefix(pa, 4, &again), 4);
  bm.Release(again);
  std::vector<int32_t> fresh;
  ASSERT_TRUE(bm.Allocate(2, &fresh));  // evicts B's two blocks (leaf first, then its parent)
  EXPECT_EQ(bm.stats().evicted_blocks, 2);
  std::vector<int32_t> m;
  EXPECT_EQ(bm.PeekPrefix(pa, 4), 4);
  EXPECT_EQ(bm.PeekPrefix(pb, 4), 0);
  // Held cached blocks are never evicted.
  ASSERT_EQ(bm.MatchPrefix(pa, 4, &m), 4);
  std::vector<int32_t> more;
  EXPECT_FALSE(bm.Allocate(1, &more));
  bm.Release(m);
  EXPECT_TRUE(bm.Allocate(1, &more));
  EXPECT_EQ(bm.PeekPrefix(pa, 4), 2);  // the leaf went first
}

TEST(BlockManager, DuplicatePrefixAdoptsTreeBlocks) {
  BlockManager bm(8, 2, true);
  auto t = Iota(4, 1);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(bm.Allocate(2, &a));
  ASSERT_TRUE(bm.Allocate(2, &b));  // the same tokens computed by a second sequence
  bm.InsertPrefix(t, &a);
  const auto b_before = b;
  bm.InsertPrefix(t, &b);
  EXPECT_EQ(b, a);  // switched to the tree's blocks
  EXPECT_EQ(bm.RefCount(a[0]), 2);
  EXPECT_EQ(bm.RefCount(b_before[0]), 0);  // its duplicates were freed
  EXPECT_EQ(bm.NumHeld(), 2);
  bm.Release(a);
  bm.Release(b);
  EXPECT_EQ(bm.NumAvailable(), 8);
  EXPECT_EQ(bm.Flush(), 2);
  EXPECT_EQ(bm.NumCached(), 0);
  EXPECT_EQ(bm.NumFree(), 8);
}

TEST(BlockManager, DisabledCacheNeverMatches) {
  BlockManager bm(4, 2, false);
  auto t = Iota(4, 1);
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(2, &a));
  bm.InsertPrefix(t, &a);
  bm.Release(a);
  std::vector<int32_t> b;
  EXPECT_EQ(bm.MatchPrefix(t, 4, &b), 0);
  EXPECT_EQ(bm.NumCached(), 0);
  EXPECT_EQ(bm.NumFree(), 4);
}

// ---- the window pool ----

// KV pools (a layer's cache over the device's max single allocation): a sequence's blocks all
// come from one pool, new sequences take the emptier pool, a prefix match keeps a sequence in
// the prefix's pool, eviction frees that pool's blocks, and the tree never links two pools.
TEST(BlockManagerPools, ASequenceStaysInOnePool) {
  BlockManager bm(8, 4, true, {}, 4);  // pools {0..3} and {4..7}
  EXPECT_EQ(bm.num_pools(), 2);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(bm.Allocate(3, &a));
  EXPECT_EQ(a, Iota(3, 0));
  EXPECT_EQ(bm.NumAvailable(a), 1);  // a's pool
  EXPECT_EQ(bm.NumAvailable(), 4);   // a new sequence's: the other pool
  ASSERT_TRUE(bm.Allocate(2, &b));
  EXPECT_EQ(b, Iota(2, 4));
  EXPECT_FALSE(bm.Allocate(2, &a));  // 3 blocks free, but 1 in a's pool
  ASSERT_TRUE(bm.Allocate(1, &a));
  EXPECT_EQ(a.back(), 3);
  EXPECT_FALSE(bm.SamePool(a, b));
  EXPECT_TRUE(bm.SamePool(a, {}));

  // a's prefix cached in pool 0: a sequence matching it continues there, evicting other
  // cached blocks of pool 0 but never pool 1's.
  const auto tokens = Iota(16, 100);
  bm.InsertPrefix(tokens, &a);
  bm.Release(a);
  std::vector<int32_t> c;
  EXPECT_EQ(bm.MatchPrefix(Iota(9, 100), 8, &c), 8);
  EXPECT_EQ(c, Iota(2, 0));
  EXPECT_EQ(bm.NumAvailable(c), 2);  // blocks 2 and 3, cached and unreferenced
  ASSERT_TRUE(bm.Allocate(2, &c));
  EXPECT_EQ(c, Iota(4, 0));
  EXPECT_EQ(bm.NumCached(), 2);
  EXPECT_FALSE(bm.Allocate(1, &c));

  // b computed the same first block in pool 1: it cannot adopt pool 0's block, and its own
  // blocks stay out of the tree (a path never crosses pools).
  bm.InsertPrefix(Iota(8, 100), &b);
  EXPECT_EQ(b, Iota(2, 4));
  EXPECT_FALSE(bm.IsCached(4));
  bm.Release(b);
  bm.Release(c);
  EXPECT_EQ(bm.NumHeld(), 0);
  EXPECT_EQ(bm.Flush(), 2);
  EXPECT_EQ(bm.NumFree(), 8);
}

TEST(BlockManagerWindowPool, AllocationPairsWindowBlocksAndSlidingReleasesThem) {
  BlockManager bm(16, 4, true, WindowPool{6, 8});
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(5, &a));
  EXPECT_EQ(bm.NumWindowFree(), 1);
  EXPECT_EQ(bm.NumAvailable(), 1);  // the window pool is the limit now
  std::vector<int32_t> b;
  EXPECT_FALSE(bm.Allocate(2, &b));
  for (int32_t blk : a) EXPECT_GE(bm.WindowBlockOf(blk), 0);
  // The next query is at 24: it sees (16, 24]; with one block of margin, blocks 0-2 (last
  // position 11 <= 24 - 8 - 4) go and block 3 (12-15) stays.
  bm.SlideWindow(a, 24);
  EXPECT_EQ(bm.WindowBlockOf(a[0]), -1);
  EXPECT_EQ(bm.WindowBlockOf(a[1]), -1);
  EXPECT_EQ(bm.WindowBlockOf(a[2]), -1);
  EXPECT_GE(bm.WindowBlockOf(a[3]), 0);
  EXPECT_EQ(bm.NumWindowFree(), 4);
  EXPECT_TRUE(bm.Allocate(2, &b));
  bm.Release(a);
  bm.Release(b);
  EXPECT_EQ(bm.NumWindowFree(), 6);
  EXPECT_EQ(bm.NumFree(), 16);
}

TEST(BlockManagerWindowPool, SharedBlocksKeepTheirShares) {
  BlockManager bm(16, 4, true, WindowPool{8, 4});
  auto tokens = Iota(16, 10);
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(4, &a));
  bm.InsertPrefix(tokens, &a);
  std::vector<int32_t> b;
  EXPECT_EQ(bm.MatchPrefix(tokens, 15, &b), 12);  // another sequence, still at position 12
  bm.SlideWindow(a, 20);
  for (int i = 0; i < 3; ++i) EXPECT_GE(bm.WindowBlockOf(a[i]), 0) << i;  // shared with b
  bm.Release(b);
  bm.SlideWindow(a, 20);  // a alone now: blocks 0-2 (last position 11 <= 20 - 4 - 4) go
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bm.WindowBlockOf(a[i]), -1) << i;
  EXPECT_GE(bm.WindowBlockOf(a[3]), 0);
  bm.Release(a);
}

TEST(BlockManagerWindowPool, PrefixMatchesStopWhereTheWindowWasReleased) {
  BlockManager bm(32, 4, true, WindowPool{16, 8});
  auto tokens = Iota(40, 1);
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(10, &a));
  bm.SlideWindow(a, 24);  // blocks 0-2 (positions 0-11, 11 <= 24 - 8 - 4) lose their shares
  bm.InsertPrefix(tokens, &a);
  bm.Release(a);
  // A match ending at m blocks needs blocks (4m - 7) / 4 .. m - 1: any m >= 5 works (its window
  // starts at block 3 or later), so the whole 10-block match stands.
  std::vector<int32_t> b;
  EXPECT_EQ(bm.MatchPrefix(tokens, 40, &b), 40);
  bm.Release(b);
  b.clear();
  // Ending at 4 blocks (16 tokens) needs blocks 2 and 3, released: the match gives up there
  // and, further back, everything below lost its shares too.
  EXPECT_EQ(bm.PeekPrefix(tokens, 19), 0);
  EXPECT_EQ(bm.MatchPrefix(tokens, 19, &b), 0);
  EXPECT_TRUE(b.empty());
  // Eviction gives the remaining shares back: everything is free after a flush.
  EXPECT_EQ(bm.Flush(), 10);
  EXPECT_EQ(bm.NumWindowFree(), 16);
  EXPECT_EQ(bm.NumFree(), 32);
}

TEST(BlockManagerWindowPool, AllocateEvictsCachedBlocksForWindowShares) {
  BlockManager bm(32, 4, true, WindowPool{6, 4});
  auto tokens = Iota(24, 1);
  std::vector<int32_t> a;
  ASSERT_TRUE(bm.Allocate(6, &a));
  bm.InsertPrefix(tokens, &a);
  bm.Release(a);  // cached, unreferenced, every share kept
  EXPECT_EQ(bm.NumWindowFree(), 0);
  EXPECT_EQ(bm.NumAvailable(), 6);  // evicting them gives the shares back
  std::vector<int32_t> b;
  ASSERT_TRUE(bm.Allocate(6, &b));
  EXPECT_EQ(bm.NumCached(), 0);
  EXPECT_EQ(bm.NumAvailable(), 0);
  bm.Release(b);
}

TEST(BlockManagerWindowPool, MaxStepTokensLeavesRoomForTheWindow) {
  EXPECT_EQ(BlockManager(64, 4, true).MaxStepTokens(), INT32_MAX);
  // 20 window blocks, window 16: a sequence keeps 16/4 + 3 = 7, one more for a partial block.
  EXPECT_EQ(BlockManager(64, 4, true, WindowPool{20, 16}).MaxStepTokens(), 12 * 4);
}

}  // namespace
}  // namespace polychip::engine
