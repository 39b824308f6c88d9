// Grammars applied to a vocabulary: which tokens may come next.
//
// A CompiledGrammar runs its Grammar (grammar.h) as a pushdown automaton over bytes. A parser
// configuration is a set of stacks (a CFG is ambiguous in general), each stack a chain of
// return positions; stacks and sets of stacks are interned, so a configuration is one integer
// (a "state") and the byte transitions between states are built lazily and kept: the automaton
// becomes a DFA over the states actually visited. Calls in tail position push nothing, so a
// repetition (x* is R ::= x R | "") loops in one state instead of growing the stack.
//
// The mask of a state walks the vocabulary's token trie (TokenVocab, built once per
// tokenizer) in preorder, one cached transition per trie edge, skipping the whole subtree of
// a byte that leads nowhere; masks are cached per state, so the steady state of a request
// costs a lookup. Tokens spanning several grammar symbols or ending inside a UTF-8 character
// need nothing special: they are byte strings.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "grammar/grammar.h"
#include "util/status.h"

namespace polychip::grammar {

// One bit per token id.
using TokenMask = std::vector<uint64_t>;

// The bytes of every token, as a trie. Immutable; shared by every grammar of a tokenizer.
class TokenVocab {
 public:
  // pieces[id]: the bytes token `id` stands for, "" for tokens that are not text (control
  // tokens: never allowed by a grammar). `eog`: end-of-generation tokens, allowed exactly
  // where the grammar accepts.
  TokenVocab(std::vector<std::string> pieces, std::vector<int32_t> eog);

  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  bool IsEog(int32_t id) const;
  const std::vector<int32_t>& eog() const { return eog_; }
  size_t mask_words() const { return (pieces_.size() + 63) / 64; }

  // The trie in preorder: a node is the byte of its edge from the parent; its subtree is
  // [index, end); the tokens spelled by the path to it are tokens_[first_token, last_token).
  struct Node {
    uint8_t byte;
    uint16_t depth;  // 1 for children of the root
    int32_t end;
    int32_t first_token;
    int32_t last_token;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& node_tokens() const { return tokens_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  int32_t max_depth_ = 0;
};

// Process-wide counters (the server exports them in /metrics).
struct GrammarCounters {
  std::atomic<int64_t> masks{0};        // masks handed out
  std::atomic<int64_t> masks_built{0};  // of which computed (not from the cache)
  std::atomic<int64_t> mask_nanos{0};   // time spent building and applying masks
  std::atomic<int64_t> build_nanos{0};  // of which building (the trie walks)
};
GrammarCounters& Counters();

class CompiledGrammar {
 public:
  static constexpr int32_t kDead = -1;

  static StatusOr<std::shared_ptr<CompiledGrammar>> Create(Grammar grammar,
                                                           std::shared_ptr<const TokenVocab> vocab);

  int32_t initial_state() const { return 0; }
  // The state after `bytes` (kDead when the grammar rejects them). Thread-safe, like all below.
  int32_t Advance(int32_t state, std::string_view bytes);
  bool IsAccepting(int32_t state);
  // True when some byte may follow (false: the document is complete).
  bool CanContinue(int32_t state);
  // The tokens allowed in `state`: those whose bytes keep the grammar alive, and the
  // end-of-generation tokens when it accepts.
  std::shared_ptr<const TokenMask> Mask(int32_t state);

  const TokenVocab& vocab() const { return *vocab_; }
  const Grammar& grammar() const { return grammar_; }
  size_t num_states() const;

 private:
  struct State {
    std::vector<int32_t> stacks;  // stack-node ids; each top is a byte-set element
    bool accepting = false;
  };
  struct StackNode {
    int32_t pos;     // element index (the top) or the return position
    int32_t parent;  // stack-node id, -1 at the bottom
  };

  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab);
  int32_t InternNode(int32_t pos, int32_t parent);
  // Adds to `out` every stack reachable from position `pos` over `parent` without reading a
  // byte (rule calls expanded, finished rules popped).
  void Closure(int32_t pos, int32_t parent, State* out);
  int32_t InternState(State state);
  int32_t Step(int32_t state, uint8_t byte);
  int32_t Transition(int32_t state, uint8_t byte);
  void BuildMask(int32_t state, TokenMask* mask);

  Grammar grammar_;
  std::shared_ptr<const TokenVocab> vocab_;

  mutable std::mutex mu_;
  std::vector<StackNode> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> transitions_;      // [state * 256 + byte]; kUnknown until computed
  std::unordered_set<uint64_t> visited_;  // Closure's guard against nullable cycles
  std::unordered_map<int32_t, std::shared_ptr<const TokenMask>> masks_;
  std::vector<int32_t> dfs_states_;  // BuildMask's per-depth states
};

// One sequence's position in a grammar.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> grammar)
      : grammar_(std::move(grammar)), state_(grammar_->initial_state()) {}

  // Sets the logits of every token the grammar does not allow to -infinity. `logits` has the
  // vocabulary's size (a longer row's tail is left alone).
  void ApplyMask(std::span<float> logits);
  // The allowed token of the largest logit (the lowest id among equals), read through the mask
  // without copying or writing the row: greedy decoding's fast path. -1 when the grammar allows
  // no token of the row.
  int32_t ArgMaxAllowed(std::span<const float> logits);
  // Moves past `token`; false (and no change) when the grammar does not allow it.
  bool Accept(int32_t token);
  // True once an end-of-generation token was accepted.
  bool finished() const { return finished_; }
  bool CanEnd() { return grammar_->IsAccepting(state_); }
  // True when nothing can follow: an end token was accepted, or the document is complete (the
  // engine ends the sequence then, without spending a step on the end token).
  bool Done() { return finished_ || (CanEnd() && !grammar_->CanContinue(state_)); }
  int32_t state() const { return state_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  int32_t state_;
  bool finished_ = false;
};

}  // namespace polychip::grammar
