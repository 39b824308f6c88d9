#include "engine/speculative.h"

#include <algorithm>
#include <limits>

namespace polychip::engine {

StatusOr<SpecAlgorithm> ParseSpecAlgorithm(const std::string& name) {
  if (name == "none" || name.empty()) return SpecAlgorithm::kNone;
  if (name == "draft") return SpecAlgorithm::kDraft;
  if (name == "ngram") return SpecAlgorithm::kNgram;
  return InvalidArgument("unknown speculative algorithm '" + name + "' (none, draft, ngram)");
}

const char* SpecAlgorithmName(SpecAlgorithm a) {
  switch (a) {
    case SpecAlgorithm::kDraft:
      return "draft";
    case SpecAlgorithm::kNgram:
      return "ngram";
    default:
      return "none";
  }
}

namespace {

class NgramProposer : public Proposer {
 public:
  NgramProposer(int32_t lo, int32_t hi) : lo_(std::max(1, lo)), hi_(std::max(lo_, hi)) {}

  Status Propose(std::span<DraftRequest* const> requests) override {
    for (DraftRequest* r : requests) {
      r->draft.clear();
      r->q.clear();
      const std::span<const int32_t> t = r->tokens;
      const int64_t len = static_cast<int64_t>(t.size());
      for (int64_t n = std::min<int64_t>(hi_, len - 1); n >= lo_ && r->draft.empty(); --n) {
        const std::span<const int32_t> tail = t.subspan(len - n);
        // The latest earlier occurrence whose continuation is in the sequence.
        for (int64_t i = len - n - 1; i >= 0; --i) {
          if (!std::equal(tail.begin(), tail.end(), t.begin() + i)) continue;
          const int64_t from = i + n;
          const int64_t to = std::min<int64_t>(len, from + r->k);
          r->draft.assign(t.begin() + from, t.begin() + to);
          break;
        }
      }
    }
    return Status::Ok();
  }

 private:
  int32_t lo_, hi_;
};

class DraftModelProposer : public Proposer {
 public:
  DraftModelProposer(ModelRunner* draft, int64_t target_vocab)
      : draft_(draft),
        target_vocab_(target_vocab),
        blocks_(static_cast<int32_t>(draft->num_kv_blocks()),
                static_cast<int32_t>(draft->block_size()), /*enable_prefix_cache=*/false,
                WindowPool{}, static_cast<int32_t>(draft->kv_blocks_per_pool())) {}

  Status Propose(std::span<DraftRequest* const> requests) override {
    // Round 0 re-feeds each sequence's tokens the draft's KV lacks and yields its first draft;
    // round j > 0 feeds draft j and yields draft j + 1.
    std::vector<Active> active;
    for (DraftRequest* r : requests) {
      r->draft.clear();
      r->q.clear();
      if (r->k <= 0) continue;
      State& st = states_[r->seq_id];
      // The draft's KV holds st.fed[0, st.computed): keep what still agrees with the tokens.
      const size_t agree = std::mismatch(st.fed.begin(), st.fed.begin() + st.computed,
                                         r->tokens.begin(), r->tokens.end())
                               .first -
                           st.fed.begin();
      st.computed = static_cast<int32_t>(agree);
      // KV for positions [0, len - 1 + k - 1]: the tokens and every draft but the last.
      const int64_t positions = static_cast<int64_t>(r->tokens.size()) + r->k - 1;
      if (positions > draft_->context_length() || !Grow(&st, positions)) {
        Release(r->seq_id);
        continue;
      }
      st.fed.assign(r->tokens.begin(), r->tokens.end());
      if (r->params->temperature > 0.f && !st.sampler) {
        // The draft's own draws: the request's shape of distribution, none of its state
        // (penalties and grammar shape only the target's p; any q keeps p exact).
        SamplingParams dp;
        dp.temperature = r->params->temperature;
        dp.top_k = r->params->top_k;
        dp.top_p = r->params->top_p;
        dp.min_p = r->params->min_p;
        dp.seed = r->seed ^ 0x9E3779B97F4A7C15ull;
        dp.want_logprob = false;
        st.sampler = std::make_unique<Sampler>(dp, target_vocab_, std::vector<int32_t>{});
      }
      active.push_back({r, &st});
    }
    std::vector<SequenceStep> steps;
    std::vector<int32_t> last(active.size());
    for (int32_t round = 0; !active.empty(); ++round) {
      steps.clear();
      for (size_t i = 0; i < active.size(); ++i) {
        const Active& a = active[i];
        SequenceStep s;
        s.seq_id = a.req->seq_id;
        s.start_pos = a.st->computed;
        s.block_table = a.st->blocks;
        s.logits = LogitsMode::kLast;
        s.tokens = std::span<const int32_t>(a.st->fed).subspan(a.st->computed);
        s.adapter = a.req->adapter;
        s.adapter_scale = a.req->adapter_scale;
        steps.push_back(s);
      }
      logits_.clear();
      Status status = draft_->Forward(steps, &logits_);
      if (!status.ok()) {
        for (const Active& a : active) Release(a.req->seq_id);
        for (DraftRequest* r : requests) {
          r->draft.clear();
          r->q.clear();
        }
        return status;
      }
      const size_t dv = static_cast<size_t>(draft_->vocab_size());
      std::vector<Active> next;
      for (size_t i = 0; i < active.size(); ++i) {
        Active& a = active[i];
        a.st->computed = static_cast<int32_t>(a.st->fed.size());
        const int32_t token = Pick(a, std::span<const float>(logits_).subspan(i * dv, dv));
        a.req->draft.push_back(token);
        if (static_cast<int32_t>(a.req->draft.size()) < a.req->k) {
          a.st->fed.push_back(token);
          next.push_back(a);
        }
      }
      active.swap(next);
    }
    return Status::Ok();
  }

  void Release(int64_t seq_id) override {
    auto it = states_.find(seq_id);
    if (it == states_.end()) return;
    blocks_.Release(it->second.blocks);
    states_.erase(it);
  }

  void ReleaseAll() override {
    while (!states_.empty()) Release(states_.begin()->first);
  }

 private:
  struct State {
    std::vector<int32_t> fed;  // the tokens the draft was given, position by position
    int32_t computed = 0;      // fed[0, computed) are in the draft's KV
    std::vector<int32_t> blocks;
    std::unique_ptr<Sampler> sampler;  // sampled requests: the draft's draws
  };
  struct Active {
    DraftRequest* req;
    State* st;
  };

  bool Grow(State* st, int64_t positions) {
    const int64_t bs = blocks_.block_size();
    const int64_t missing = (positions + bs - 1) / bs - static_cast<int64_t>(st->blocks.size());
    return missing <= 0 || blocks_.Allocate(static_cast<int32_t>(missing), &st->blocks);
  }

  // The draft token from the draft's row: greedy, or a draw from q (kept for verification).
  int32_t Pick(const Active& a, std::span<const float> row) {
    row_.assign(static_cast<size_t>(target_vocab_), -std::numeric_limits<float>::infinity());
    const size_t n = std::min(row.size(), row_.size());
    std::copy(row.begin(), row.begin() + n, row_.begin());
    if (!a.st->sampler) return ArgMax(row_);
    a.st->sampler->Distribution(row_, &q_);
    const int32_t token = a.st->sampler->Draw(q_);
    a.req->q.insert(a.req->q.end(), q_.begin(), q_.end());
    return token;
  }

  ModelRunner* draft_;
  int64_t target_vocab_;
  BlockManager blocks_;
  std::map<int64_t, State> states_;
  std::vector<float> logits_, row_, q_;
};

}  // namespace

std::unique_ptr<Proposer> MakeNgramProposer(int32_t ngram_min, int32_t ngram_max) {
  return std::make_unique<NgramProposer>(ngram_min, ngram_max);
}

std::unique_ptr<Proposer> MakeDraftModelProposer(ModelRunner* draft, int64_t target_vocab) {
  return std::make_unique<DraftModelProposer>(draft, target_vocab);
}

}  // namespace polychip::engine
