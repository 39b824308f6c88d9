#include "grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>

namespace polychip::grammar {
namespace {

constexpr int32_t kUnknown = -2;
// Masks kept per grammar (19 KB each at a 152k vocabulary): a schema's states are far fewer.
constexpr size_t kMaxCachedMasks = 4096;

// Row k: lane j is +inf when bit j of k is set, else -inf (min() with it keeps or drops).
struct LaneTable {
  float rows[256][8];
  LaneTable() {
    for (int k = 0; k < 256; ++k) {
      for (int j = 0; j < 8; ++j) {
        rows[k][j] = ((k >> j) & 1) ? std::numeric_limits<float>::infinity()
                                    : -std::numeric_limits<float>::infinity();
      }
    }
  }
};
const LaneTable kLaneTable;

uint64_t Key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

GrammarCounters& Counters() {
  static GrammarCounters counters;
  return counters;
}

// ---- TokenVocab --------------------------------------------------------------------------

TokenVocab::TokenVocab(std::vector<std::string> pieces, std::vector<int32_t> eog)
    : pieces_(std::move(pieces)), eog_(std::move(eog)) {
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id) {
    if (!pieces_[id].empty() && !IsEog(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return pieces_[a] != pieces_[b] ? pieces_[a] < pieces_[b] : a < b;
  });
  // Sorted pieces make the trie in preorder: each piece shares its longest common prefix with
  // the previous one, whose path is `path`.
  std::vector<int32_t> path;
  const std::string* prev = nullptr;
  auto close = [&](size_t keep) {
    while (path.size() > keep) {
      nodes_[path.back()].end = static_cast<int32_t>(nodes_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& p = pieces_[id];
    size_t lcp = 0;
    if (prev) {
      const size_t n = std::min(prev->size(), p.size());
      while (lcp < n && (*prev)[lcp] == p[lcp]) ++lcp;
    }
    close(lcp);
    for (size_t d = lcp; d < p.size(); ++d) {
      const auto t = static_cast<int32_t>(tokens_.size());
      nodes_.push_back({static_cast<uint8_t>(p[d]), static_cast<uint16_t>(d + 1), 0, t, t});
      path.push_back(static_cast<int32_t>(nodes_.size()) - 1);
    }
    Node& node = nodes_[path.back()];
    if (node.first_token == node.last_token)
      node.first_token = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(id);
    node.last_token = static_cast<int32_t>(tokens_.size());
    max_depth_ = std::max<int32_t>(max_depth_, static_cast<int32_t>(p.size()));
    prev = &p;
  }
  close(0);
}

bool TokenVocab::IsEog(int32_t id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

// ---- CompiledGrammar ---------------------------------------------------------------------

StatusOr<std::shared_ptr<CompiledGrammar>> CompiledGrammar::Create(
    Grammar grammar, std::shared_ptr<const TokenVocab> vocab) {
  std::shared_ptr<CompiledGrammar> g(new CompiledGrammar(std::move(grammar), std::move(vocab)));
  std::lock_guard<std::mutex> lock(g->mu_);
  State initial;
  g->visited_.clear();
  for (int32_t start : g->grammar_.rule_alts[g->grammar_.root]) g->Closure(start, -1, &initial);
  if (g->InternState(std::move(initial)) != 0) {
    return InvalidArgument("grammar: the root rule matches nothing");
  }
  return g;
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {}

size_t CompiledGrammar::num_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

int32_t CompiledGrammar::InternNode(int32_t pos, int32_t parent) {
  auto [it, inserted] = node_ids_.emplace(Key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent});
  return it->second;
}

void CompiledGrammar::Closure(int32_t pos, int32_t parent, State* out) {
  if (!visited_.insert(Key(pos, parent)).second) return;  // a nullable cycle, or done already
  const Element e = grammar_.elements[pos];
  switch (e.kind) {
    case Element::Kind::kBytes:
      out->stacks.push_back(InternNode(pos, parent));
      return;
    case Element::Kind::kEnd:
      if (parent < 0) {
        out->accepting = true;
      } else {
        const StackNode n = nodes_[parent];  // a copy: nodes_ may grow below
        Closure(n.pos, n.parent, out);
      }
      return;
    case Element::Kind::kRule: {
      // A call in tail position returns straight to our caller: no frame.
      const bool tail = grammar_.elements[pos + 1].kind == Element::Kind::kEnd;
      const int32_t ret = tail ? parent : InternNode(pos + 1, parent);
      for (int32_t start : grammar_.rule_alts[e.value]) Closure(start, ret, out);
      return;
    }
  }
}

int32_t CompiledGrammar::InternState(State state) {
  std::sort(state.stacks.begin(), state.stacks.end());
  state.stacks.erase(std::unique(state.stacks.begin(), state.stacks.end()), state.stacks.end());
  if (state.stacks.empty() && !state.accepting) return kDead;
  std::string key(state.stacks.size() * sizeof(int32_t) + 1, '\0');
  // An accepting state may have no stacks, and memcpy from an empty vector's null data() is
  // undefined even for 0 bytes (found by fuzz_api with "regex": "").
  if (!state.stacks.empty()) {
    std::memcpy(key.data(), state.stacks.data(), state.stacks.size() * sizeof(int32_t));
  }
  key.back() = state.accepting ? 1 : 0;
  auto [it, inserted] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (inserted) {
    states_.push_back(std::move(state));
    transitions_.resize(states_.size() * 256, kUnknown);
  }
  return it->second;
}

int32_t CompiledGrammar::Step(int32_t state, uint8_t byte) {
  const std::vector<int32_t> stacks = states_[state].stacks;  // a copy: states_ may grow
  State next;
  visited_.clear();
  for (int32_t s : stacks) {
    const StackNode n = nodes_[s];
    const Element e = grammar_.elements[n.pos];
    if (grammar_.byte_sets[e.value].test(byte)) Closure(n.pos + 1, n.parent, &next);
  }
  return InternState(std::move(next));
}

int32_t CompiledGrammar::Transition(int32_t state, uint8_t byte) {
  const size_t at = static_cast<size_t>(state) * 256 + byte;
  if (transitions_[at] != kUnknown) return transitions_[at];
  const int32_t next = Step(state, byte);
  transitions_[at] = next;  // after Step: it may have resized transitions_
  return next;
}

int32_t CompiledGrammar::Advance(int32_t state, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (unsigned char b : bytes) {
    if (state == kDead) return kDead;
    state = Transition(state, b);
  }
  return state;
}

bool CompiledGrammar::IsAccepting(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && states_[state].accepting;
}

bool CompiledGrammar::CanContinue(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && !states_[state].stacks.empty();
}

void CompiledGrammar::BuildMask(int32_t state, TokenMask* mask) {
  mask->assign(vocab_->mask_words(), 0);
  const auto& nodes = vocab_->nodes();
  const auto& tokens = vocab_->node_tokens();
  dfs_states_.resize(vocab_->max_depth() + 1);
  dfs_states_[0] = state;
  const size_t n = nodes.size();
  for (size_t i = 0; i < n;) {
    const TokenVocab::Node& node = nodes[i];
    const int32_t next = Transition(dfs_states_[node.depth - 1], node.byte);
    if (next == kDead) {
      i = node.end;  // no token under this prefix can be allowed
      continue;
    }
    dfs_states_[node.depth] = next;
    for (int32_t k = node.first_token; k < node.last_token; ++k) {
      const int32_t t = tokens[k];
      (*mask)[t >> 6] |= uint64_t{1} << (t & 63);
    }
    ++i;
  }
  if (states_[state].accepting) {
    for (int32_t t : vocab_->eog()) {
      if (t >= 0 && t < vocab_->size()) (*mask)[t >> 6] |= uint64_t{1} << (t & 63);
    }
  }
}

std::shared_ptr<const TokenMask> CompiledGrammar::Mask(int32_t state) {
  std::lock_guard<std::mutex> lock(mu_);
  Counters().masks.fetch_add(1, std::memory_order_relaxed);
  if (auto it = masks_.find(state); it != masks_.end()) return it->second;
  Counters().masks_built.fetch_add(1, std::memory_order_relaxed);
  auto mask = std::make_shared<TokenMask>();
  const auto start = std::chrono::steady_clock::now();
  BuildMask(state, mask.get());
  Counters().build_nanos.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      std::memory_order_relaxed);
  if (masks_.size() < kMaxCachedMasks) masks_.emplace(state, mask);
  return mask;
}

// ---- Matcher -----------------------------------------------------------------------------

void Matcher::ApplyMask(std::span<float> logits) {
  const auto start = std::chrono::steady_clock::now();
  const auto mask = grammar_->Mask(state_);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = std::min<size_t>(logits.size(), grammar_->vocab().size());
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = (*mask)[w];
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(n, w * 64 + 64);
    if (bits == 0) {
      std::fill(logits.begin() + w * 64, logits.begin() + end, kNegInf);
      continue;
    }
    // Mixed words are the common case inside strings, and a branch per token cost ~1 ms per
    // mask at a 152k vocabulary: each byte of the word selects 8 lanes of +inf (keep) or
    // -inf (drop) and a min applies them, which the compiler vectorizes.
    float* p = logits.data() + w * 64;
    const size_t len = end - w * 64;
    if (len == 64) {
      for (size_t b = 0; b < 8; ++b) {
        const float* lanes = kLaneTable.rows[(bits >> (8 * b)) & 0xFF];
        for (size_t j = 0; j < 8; ++j) p[8 * b + j] = std::min(p[8 * b + j], lanes[j]);
      }
    } else {
      for (size_t j = 0; j < len; ++j) {
        if (!((bits >> j) & 1)) p[j] = kNegInf;
      }
    }
  }
  Counters().mask_nanos.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      std::memory_order_relaxed);
}

int32_t Matcher::ArgMaxAllowed(std::span<const float> logits) {
  const auto start = std::chrono::steady_clock::now();
  const auto mask = grammar_->Mask(state_);
  const size_t n = std::min<size_t>(logits.size(), grammar_->vocab().size());
  int32_t best = -1;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t bits = (*mask)[w];
    if (bits == 0) continue;
    const size_t base = w * 64;
    if (bits == ~uint64_t{0} && base + 64 <= n) {
      // A word of allowed tokens: a plain scan (vectorized); the strict > keeps the lowest id.
      for (size_t j = 0; j < 64; ++j) {
        if (logits[base + j] > best_value || best < 0) {
          best_value = logits[base + j];
          best = static_cast<int32_t>(base + j);
        }
      }
      continue;
    }
    while (bits != 0) {
      const size_t j = base + static_cast<size_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (j >= n) break;
      if (logits[j] > best_value || best < 0) {
        best_value = logits[j];
        best = static_cast<int32_t>(j);
      }
    }
  }
  Counters().mask_nanos.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count(),
      std::memory_order_relaxed);
  return best;
}

bool Matcher::Accept(int32_t token) {
  if (finished_ || token < 0 || token >= grammar_->vocab().size()) return false;
  if (grammar_->vocab().IsEog(token)) {
    if (!grammar_->IsAccepting(state_)) return false;
    finished_ = true;
    return true;
  }
  const std::string& piece = grammar_->vocab().piece(token);
  if (piece.empty()) return false;
  const int32_t next = grammar_->Advance(state_, piece);
  if (next == CompiledGrammar::kDead) return false;
  state_ = next;
  return true;
}

}  // namespace polychip::grammar
