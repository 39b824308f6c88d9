// The paged KV cache's bookkeeping: which KV blocks are free, who holds each one (refcounts), and
// a radix tree over full blocks keyed by their token ids, so that a new sequence that starts with
// tokens some earlier sequence already computed reuses those blocks instead of recomputing them.
//
// The runner owns the memory (ModelRunner::num_kv_blocks() blocks); this class only hands out
// block ids. A block is in one of three states:
//   free       on the free list, content meaningless;
//   held       refcount > 0 (a running sequence uses it; cached blocks can be held by several);
//   cached     refcount == 0 but in the radix tree: reusable by a later prefix match, evicted
//              least-recently-used first when Allocate() runs out of free blocks.
//
// A model with sliding-window layers may keep those layers' KV in a window pool of its own
// (WindowPool): each held block then also owns a window block for the sliding layers, and once
// a sequence has moved `window` positions past a block, the block's window share is released
// (SlideWindow) while the full layers keep theirs. A cached block whose window share is gone
// still serves prefix matches, as long as the blocks in the window before the match's end
// kept theirs (MatchPrefix stops earlier otherwise).
//
// The blocks may come in pools (`pool_blocks` each: block b is in pool b / pool_blocks) when
// the runner could not allocate a layer's KV in one piece (a device's max single allocation):
// attention reads one sequence's blocks from one buffer, so all of a sequence's blocks are in
// one pool. A new sequence takes the pool with the most blocks available; one that matched a
// cached prefix stays in that prefix's pool, and the tree never mixes pools along a path.
// Not thread-safe: the engine thread is its only user.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <vector>

namespace polychip::engine {

struct PrefixCacheStats {
  int64_t queried_tokens = 0;  // tokens looked up by MatchPrefix
  int64_t hit_tokens = 0;      // of which were found in the cache
  int64_t evicted_blocks = 0;
  double hit_rate() const {
    return queried_tokens ? static_cast<double>(hit_tokens) / queried_tokens : 0.0;
  }
};

// The sliding layers' own pool: `num_blocks` window blocks (0: the sliding layers use the main
// blocks, nothing is released) for layers that see the last `window` positions.
struct WindowPool {
  int32_t num_blocks = 0;
  int32_t window = 0;
};

class BlockManager {
 public:
  // pool_blocks: blocks per pool, dividing num_blocks; 0: one pool of them all.
  BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache,
               WindowPool window_pool = {}, int32_t pool_blocks = 0);
  ~BlockManager();
  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_cache_enabled() const { return enable_prefix_cache_; }
  int32_t num_pools() const { return static_cast<int32_t>(free_.size()); }
  int32_t PoolOf(int32_t block) const { return block / pool_blocks_; }
  // Whether sequences holding `a` and `b` draw on the same pool (one of them holding nothing
  // may draw on any).
  bool SamePool(std::span<const int32_t> a, std::span<const int32_t> b) const {
    return num_pools() == 1 || a.empty() || b.empty() || PoolOf(a[0]) == PoolOf(b[0]);
  }

  // Blocks Allocate() can append now to a sequence holding `held` (from held's pool; nothing
  // held: the pool with the most): free plus cached-and-unreferenced (evictable); with a window
  // pool, no more than it can pair with window blocks.
  int32_t NumAvailable(std::span<const int32_t> held = {}) const;
  int32_t NumFree() const;
  // Blocks held by at least one sequence.
  int32_t NumHeld() const { return num_held_; }
  int32_t NumCached() const { return static_cast<int32_t>(block_node_.size()); }

  // Finds the longest prefix of `tokens` made of whole cached blocks, takes a reference on each
  // of those blocks, appends them to `blocks` and returns the number of tokens they cover.
  // At most `max_tokens` tokens are matched (the engine leaves at least one prompt token to
  // compute, since it needs its logits). Statistics are the caller's (RecordLookup), since a
  // lookup may be undone when the request cannot be admitted yet.
  // `salt` separates caches: KV computed under one (a LoRA adapter and its scale) is never
  // matched under another; 0 is the base model's.
  int32_t MatchPrefix(std::span<const int32_t> tokens, int32_t max_tokens,
                      std::vector<int32_t>* blocks, uint64_t salt = 0);
  void RecordLookup(int64_t queried_tokens, int64_t hit_tokens) {
    stats_.queried_tokens += queried_tokens;
    stats_.hit_tokens += hit_tokens;
  }
  // Like MatchPrefix without taking references (for the longest-prefix-match policy).
  int32_t PeekPrefix(std::span<const int32_t> tokens, int32_t max_tokens,
                     uint64_t salt = 0) const;

  // Appends `n` blocks with refcount 1 (from the pool of those *blocks holds already), evicting
  // least-recently-used cached blocks when the free list is short. Returns false (and allocates
  // nothing) when fewer than n are available.
  bool Allocate(int32_t n, std::vector<int32_t>* blocks);

  // Drops one reference on each block. A block nobody holds goes back to the free list, or stays
  // in the cache (evictable) when the radix tree indexes it.
  void Release(std::span<const int32_t> blocks);

  // Indexes the full blocks of a sequence: (*blocks)[i] holds the KV of
  // tokens[i*block_size, (i+1)*block_size). Only whole blocks of `tokens` are inserted. Where
  // the tree already has another block for the same tokens (two sequences computed the same
  // prefix at once), the sequence switches to the tree's block (same KV content) and its
  // duplicate is released. This keeps the invariant that a sequence holding a cached block also
  // holds all its ancestors, so every unreferenced cached block is evictable.
  void InsertPrefix(std::span<const int32_t> tokens, std::vector<int32_t>* blocks,
                    uint64_t salt = 0);

  // Evicts every cached block nobody holds (POST /flush_cache). Returns how many were freed.
  int32_t Flush();

  // ---- window pool (all no-ops without one) ----
  bool has_window_pool() const { return window_.num_blocks > 0; }
  int32_t num_window_blocks() const { return window_.num_blocks; }
  int32_t NumWindowFree() const { return static_cast<int32_t>(window_free_.size()); }
  // The window block paired with `block`, or -1 once it has been released (or without a pool).
  int32_t WindowBlockOf(int32_t block) const { return has_window_pool() ? window_of_[block] : -1; }
  // Releases the window share of the sequence's blocks that no query at position >= `next_pos`
  // can see any more, less one block of margin (all their positions <= next_pos - window - bs).
  // Blocks another sequence also holds keep theirs (that sequence may be behind).
  void SlideWindow(std::span<const int32_t> blocks, int32_t next_pos);
  // Most tokens one sequence may add in a step: its blocks' window shares (the window and the
  // new tokens) must fit in the pool with room to spare. INT32_MAX without a pool.
  int32_t MaxStepTokens() const;

  int32_t RefCount(int32_t block) const { return ref_[block]; }
  bool IsCached(int32_t block) const { return block_node_.count(block) != 0; }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Node;
  using Key = std::vector<int32_t>;

  // The cached path of `tokens`' whole blocks, at most max_tokens tokens, cut (with a window
  // pool) to the longest prefix whose last window of blocks still has its window shares.
  std::vector<Node*> UsablePath(std::span<const int32_t> tokens, int32_t max_tokens,
                                uint64_t salt) const;
  bool HasWindowShare(int32_t block) const { return WindowBlockOf(block) >= 0; }
  void DropWindowShare(int32_t block);  // back to window_free_ (if it has one)
  void Touch(Node* node);
  void UpdateEvictable(Node* node);
  // The least recently used evictable block of `pool` (-1: of any pool).
  bool EvictOne(int32_t pool = -1);
  // Blocks Allocate can take from `pool` without a window pool's limit.
  int32_t PoolAvailable(int32_t pool) const {
    return static_cast<int32_t>(free_[pool].size()) + num_evictable_[pool];
  }
  // The pool a sequence holding `held` allocates from.
  int32_t PoolFor(std::span<const int32_t> held) const;
  std::span<const int32_t> Chunk(std::span<const int32_t> tokens, int32_t i) const {
    return tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
  }
  // The tree key of block i: its tokens, the first block's followed by the salt (as two
  // negative ids, which no token is) when not 0.
  Key KeyOf(std::span<const int32_t> tokens, int32_t i, uint64_t salt) const;

  int32_t num_blocks_;
  int32_t block_size_;
  bool enable_prefix_cache_;
  int32_t pool_blocks_;
  // Per pool, a stack: recently freed blocks are reused first.
  std::vector<std::vector<int32_t>> free_;
  std::vector<int32_t> ref_;   // refcount by block id
  int32_t num_held_ = 0;

  std::unique_ptr<Node> root_;
  std::map<int32_t, Node*> block_node_;  // cached block id -> its tree node
  // Evictable leaves ordered by last use: (tick, block id).
  std::set<std::pair<uint64_t, int32_t>> evictable_;
  // Per pool, cached blocks with refcount 0 (leaves or not: see InsertPrefix).
  std::vector<int32_t> num_evictable_;
  uint64_t tick_ = 0;
  PrefixCacheStats stats_;

  WindowPool window_;
  std::vector<int32_t> window_of_;    // block id -> its window block, -1: none
  std::vector<int32_t> window_free_;  // a stack of free window blocks
  // Evictable (cached, refcount 0) blocks that still have a window share: evicting them gives
  // the share back, so Allocate can count on them.
  int32_t num_evictable_window_ = 0;
};

}  // namespace polychip::engine
