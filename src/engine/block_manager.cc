#include "engine/block_manager.h"

#include <algorithm>
#include <climits>

#include "util/status.h"

namespace polychip::engine {

// One cached block: its tokens (the key under its parent), the block id and its children.
struct BlockManager::Node {
  Key key;
  int32_t block = -1;
  Node* parent = nullptr;
  std::map<Key, std::unique_ptr<Node>> children;
  uint64_t last_use = 0;
  bool in_evictable = false;
  uint64_t evictable_tick = 0;  // the tick under which it sits in evictable_
};

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_cache,
                           WindowPool window_pool, int32_t pool_blocks)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      enable_prefix_cache_(enable_prefix_cache),
      pool_blocks_(pool_blocks > 0 ? pool_blocks : num_blocks),
      ref_(num_blocks, 0),
      root_(std::make_unique<Node>()),
      window_(window_pool) {
  PC_CHECK(num_blocks > 0 && block_size > 0 && num_blocks % pool_blocks_ == 0);
  PC_CHECK(window_.num_blocks >= 0 && (window_.num_blocks == 0 || window_.window > 0));
  free_.resize(num_blocks / pool_blocks_);
  num_evictable_.assign(free_.size(), 0);
  // Reversed so that block 0 is handed out first (easier to read in logs and tests).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_[PoolOf(b)].push_back(b);
  if (has_window_pool()) {
    window_of_.assign(num_blocks, -1);
    for (int32_t w = window_.num_blocks - 1; w >= 0; --w) window_free_.push_back(w);
  }
}

int32_t BlockManager::NumFree() const {
  int32_t n = 0;
  for (const auto& f : free_) n += static_cast<int32_t>(f.size());
  return n;
}

int32_t BlockManager::PoolFor(std::span<const int32_t> held) const {
  if (!held.empty()) return PoolOf(held[0]);
  int32_t best = 0;
  for (int32_t p = 1; p < num_pools(); ++p) {
    if (PoolAvailable(p) > PoolAvailable(best)) best = p;
  }
  return best;
}

int32_t BlockManager::NumAvailable(std::span<const int32_t> held) const {
  const int32_t blocks = PoolAvailable(PoolFor(held));
  if (!has_window_pool()) return blocks;
  return std::min(blocks, static_cast<int32_t>(window_free_.size()) + num_evictable_window_);
}

int32_t BlockManager::MaxStepTokens() const {
  if (!has_window_pool()) return INT32_MAX;
  // A sequence keeps at most window/bs + 3 blocks' shares (the window, a partial block each
  // side, the margin of SlideWindow) and a step of n tokens adds at most n/bs + 1 blocks.
  const int32_t keep = window_.window / block_size_ + 3;
  return std::max(1, window_.num_blocks - keep - 1) * block_size_;
}

void BlockManager::DropWindowShare(int32_t block) {
  if (!HasWindowShare(block)) return;
  window_free_.push_back(window_of_[block]);
  window_of_[block] = -1;
}

void BlockManager::SlideWindow(std::span<const int32_t> blocks, int32_t next_pos) {
  if (!has_window_pool()) return;
  // Block j's positions end at (j+1)*bs - 1; a query at q >= next_pos sees keys > q - window.
  // One block more is kept, so that a later request matching this sequence up to its last
  // whole block (next_pos - bs or later) still finds that point's window.
  const int64_t last_hidden = int64_t(next_pos) - window_.window - block_size_;
  for (size_t j = 0; j < blocks.size() && int64_t(j + 1) * block_size_ - 1 <= last_hidden; ++j) {
    if (ref_[blocks[j]] == 1) DropWindowShare(blocks[j]);
  }
}

BlockManager::~BlockManager() = default;

void BlockManager::Touch(Node* node) {
  for (Node* n = node; n != nullptr && n != root_.get(); n = n->parent) {
    n->last_use = ++tick_;
    UpdateEvictable(n);
  }
}

// A node is evictable when it is a leaf nobody holds; keeps evictable_ in step with that.
void BlockManager::UpdateEvictable(Node* node) {
  if (node == root_.get()) return;
  if (node->in_evictable) {
    evictable_.erase({node->evictable_tick, node->block});
    node->in_evictable = false;
  }
  if (ref_[node->block] == 0 && node->children.empty()) {
    node->evictable_tick = node->last_use;
    evictable_.insert({node->evictable_tick, node->block});
    node->in_evictable = true;
  }
}

bool BlockManager::EvictOne(int32_t pool) {
  auto it = evictable_.begin();
  while (it != evictable_.end() && pool >= 0 && PoolOf(it->second) != pool) ++it;
  if (it == evictable_.end()) return false;
  const int32_t block = it->second;
  evictable_.erase(it);
  Node* node = block_node_.at(block);
  Node* parent = node->parent;
  block_node_.erase(block);
  parent->children.erase(node->key);  // destroys node
  --num_evictable_[PoolOf(block)];
  if (HasWindowShare(block)) --num_evictable_window_;
  DropWindowShare(block);
  free_[PoolOf(block)].push_back(block);
  ++stats_.evicted_blocks;
  UpdateEvictable(parent);
  return true;
}

BlockManager::Key BlockManager::KeyOf(std::span<const int32_t> tokens, int32_t i,
                                      uint64_t salt) const {
  auto chunk = Chunk(tokens, i);
  Key key(chunk.begin(), chunk.end());
  if (i == 0 && salt != 0) {
    key.push_back(-1 - static_cast<int32_t>(salt & 0x7fffffff));
    key.push_back(-1 - static_cast<int32_t>((salt >> 31) & 0x7fffffff));
  }
  return key;
}

std::vector<BlockManager::Node*> BlockManager::UsablePath(std::span<const int32_t> tokens,
                                                         int32_t max_tokens, uint64_t salt) const {
  std::vector<Node*> path;
  if (!enable_prefix_cache_) return path;
  const int32_t n = std::min<int64_t>(tokens.size(), std::max(max_tokens, 0)) / block_size_;
  const Node* node = root_.get();
  for (int32_t i = 0; i < n; ++i) {
    auto it = node->children.find(KeyOf(tokens, i, salt));
    if (it == node->children.end()) break;
    node = it->second.get();
    path.push_back(it->second.get());
  }
  if (!has_window_pool()) return path;
  // The sliding layers of the first token computed after m matched blocks (position m*bs) read
  // positions (m*bs - window, m*bs): those blocks must still have their window shares.
  for (int64_t m = static_cast<int64_t>(path.size()); m > 0; --m) {
    const int64_t first = std::max<int64_t>(0, (m * block_size_ - window_.window + 1) / block_size_);
    bool usable = true;
    for (int64_t j = first; j < m && usable; ++j) usable = HasWindowShare(path[j]->block);
    if (usable) {
      path.resize(m);
      return path;
    }
  }
  path.clear();
  return path;
}

int32_t BlockManager::PeekPrefix(std::span<const int32_t> tokens, int32_t max_tokens,
                                 uint64_t salt) const {
  return static_cast<int32_t>(UsablePath(tokens, max_tokens, salt).size()) * block_size_;
}

int32_t BlockManager::MatchPrefix(std::span<const int32_t> tokens, int32_t max_tokens,
                                  std::vector<int32_t>* blocks, uint64_t salt) {
  const std::vector<Node*> path = UsablePath(tokens, max_tokens, salt);
  for (Node* node : path) {
    if (ref_[node->block]++ == 0) {
      --num_evictable_[PoolOf(node->block)];
      ++num_held_;
      if (HasWindowShare(node->block)) --num_evictable_window_;
    }
    blocks->push_back(node->block);
  }
  if (!path.empty()) Touch(path.back());  // also drops the now-held path from evictable_
  return static_cast<int32_t>(path.size()) * block_size_;
}

bool BlockManager::Allocate(int32_t n, std::vector<int32_t>* blocks) {
  if (n <= 0) return true;
  if (NumAvailable(*blocks) < n) return false;
  const int32_t pool = PoolFor(*blocks);
  std::vector<int32_t>& free = free_[pool];
  while (static_cast<int32_t>(free.size()) < n) PC_CHECK(EvictOne(pool));
  // The window pool is one for all pools: its shares come back from any pool's evictions.
  while (has_window_pool() && static_cast<int32_t>(window_free_.size()) < n) {
    PC_CHECK(EvictOne());
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = free.back();
    free.pop_back();
    PC_CHECK(ref_[b] == 0);
    ref_[b] = 1;
    if (has_window_pool()) {
      window_of_[b] = window_free_.back();
      window_free_.pop_back();
    }
    blocks->push_back(b);
  }
  num_held_ += n;
  return true;
}

void BlockManager::Release(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    PC_CHECK(b >= 0 && b < num_blocks_ && ref_[b] > 0);
    if (--ref_[b] != 0) continue;
    --num_held_;
    auto it = block_node_.find(b);
    if (it == block_node_.end()) {
      DropWindowShare(b);
      free_[PoolOf(b)].push_back(b);
    } else {
      ++num_evictable_[PoolOf(b)];
      if (HasWindowShare(b)) ++num_evictable_window_;
      UpdateEvictable(it->second);
    }
  }
}

void BlockManager::InsertPrefix(std::span<const int32_t> tokens, std::vector<int32_t>* blocks,
                                uint64_t salt) {
  if (!enable_prefix_cache_) return;
  const int32_t n =
      std::min<int64_t>(tokens.size() / block_size_, static_cast<int64_t>(blocks->size()));
  Node* node = root_.get();
  for (int32_t i = 0; i < n; ++i) {
    Key key = KeyOf(tokens, i, salt);
    auto it = node->children.find(key);
    int32_t& mine = (*blocks)[i];
    if (it != node->children.end()) {
      Node* child = it->second.get();
      // The tree's block is in another pool: this sequence cannot read it, and a path of the
      // tree stays in one pool, so its further blocks are not indexed.
      if (PoolOf(child->block) != PoolOf(mine)) break;
      if (child->block != mine) {
        // Same tokens computed twice: adopt the tree's block, drop our duplicate.
        if (ref_[child->block]++ == 0) {
          --num_evictable_[PoolOf(child->block)];
          ++num_held_;
          if (HasWindowShare(child->block)) --num_evictable_window_;
        }
        // Same content: the tree's block takes over our window share if it has none.
        if (has_window_pool() && window_of_[child->block] < 0) {
          std::swap(window_of_[child->block], window_of_[mine]);
        }
        const int32_t duplicate = mine;
        mine = child->block;
        Release({&duplicate, 1});
      }
      node = child;
      continue;
    }
    PC_CHECK(block_node_.count(mine) == 0);
    auto child = std::make_unique<Node>();
    child->key = std::move(key);
    child->block = mine;
    child->parent = node;
    Node* raw = child.get();
    node->children.emplace(raw->key, std::move(child));
    block_node_[mine] = raw;
    UpdateEvictable(node);  // no longer a leaf
    node = raw;
  }
  if (node != root_.get()) Touch(node);
}

int32_t BlockManager::Flush() {
  int32_t n = 0;
  while (EvictOne()) ++n;
  return n;
}

}  // namespace polychip::engine
