// A deterministic toy model behind the ModelRunner interface, for engine and server tests.
// Its "KV cache" stores, per block slot, the token and position written there; the next token
// is a hash of every token READ BACK through the block table, so wrong block tables, wrong
// prefix-cache reuse or a lost preemption show up as different outputs. With a window pool
// (set_window_pool), every token also goes to its window block, and every query checks that the
// last `window` positions up to its own read back from the window blocks (a window share
// released too early, or shared by two sequences, fails the step).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "engine/model_runner.h"

namespace polychip::engine::testing {

class FakeRunner : public ModelRunner {
 public:
  FakeRunner(int64_t vocab, int64_t context, int64_t block_size, int64_t num_blocks)
      : vocab_(vocab), context_(context), block_size_(block_size), num_blocks_(num_blocks),
        kv_(num_blocks * block_size, Slot{-1, -1}) {}

  // The model: the next token after `history` (never 0, which tests use as EOS).
  static int32_t NextToken(const std::vector<int32_t>& history, int64_t vocab) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
    return static_cast<int32_t>(h % static_cast<uint64_t>(vocab - 1)) + 1;
  }
  // Greedy reference: what a request generates alone.
  static std::vector<int32_t> Reference(std::vector<int32_t> prompt, int n, int64_t vocab) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(NextToken(prompt, vocab));
      prompt.push_back(out.back());
    }
    return out;
  }

  // The logits after `history`: 10 at NextToken and 0 elsewhere; `soft`: every token gets a
  // logit in [0, 3) from a hash of the history and itself (a real distribution, for sampling
  // tests). `disagree_every` > 0 makes another model: after every such position the row is
  // rotated by one token.
  static std::vector<float> Row(const std::vector<int32_t>& history, int64_t vocab, bool soft,
                                int32_t disagree_every) {
    std::vector<float> row(vocab, 0.f);
    if (soft) {
      std::vector<int32_t> h = history;
      for (int64_t j = 0; j < vocab; ++j) {
        h.push_back(static_cast<int32_t>(j));
        row[j] = 3.f * static_cast<float>(NextToken(h, 1001) - 1) / 1000.f;
        h.pop_back();
      }
    } else {
      row[NextToken(history, vocab)] = 10.f;
    }
    if (disagree_every > 0 && history.size() % static_cast<size_t>(disagree_every) == 0) {
      std::rotate(row.begin(), row.end() - 1, row.end());
    }
    return row;
  }

  int64_t vocab_size() const override { return vocab_; }
  int64_t context_length() const override { return context_; }
  int64_t block_size() const override { return block_size_; }
  int64_t num_kv_blocks() const override { return num_blocks_; }
  int64_t num_window_kv_blocks() const override { return num_window_blocks_; }
  int64_t kv_window() const override { return window_; }

  // `blocks` window blocks (plus the spare one, id `blocks`) for a window of `window` positions.
  void set_window_pool(int64_t blocks, int64_t window) {
    num_window_blocks_ = blocks;
    window_ = window;
    wkv_.assign((blocks + 1) * block_size_, Slot{-1, -1});
  }

  Status Forward(std::span<const SequenceStep> batch, std::vector<float>* logits) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (step_delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us_));
    logits->clear();
    int64_t n_tokens = 0;
    bool has_prefill = false, has_decode = false;
    for (const SequenceStep& s : batch) {
      n_tokens += static_cast<int64_t>(s.tokens.size());
      (s.tokens.size() == 1 ? has_decode : has_prefill) = true;
      const int64_t end = s.start_pos + static_cast<int64_t>(s.tokens.size());
      if (static_cast<int64_t>(s.block_table.size()) * block_size_ < end) {
        return Internal("block table too short");
      }
      if (end > context_) return Internal("past the context");
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const int64_t pos = s.start_pos + static_cast<int64_t>(i);
        const int32_t block = s.block_table[pos / block_size_];
        if (block < 0 || block >= num_blocks_) return Internal("bad block id");
        kv_[block * block_size_ + pos % block_size_] = Slot{s.tokens[i], static_cast<int32_t>(pos)};
      }
      if (num_window_blocks_ > 0) PC_RETURN_IF_ERROR(CheckWindow(s, end));
      if (s.logits == LogitsMode::kNone) continue;
      // Read the whole history back from the KV cache: one row for the last token (kLast), or
      // one per token of the step (kAll: a speculative verification).
      std::vector<int32_t> history;
      const int64_t first_row = s.logits == LogitsMode::kAll ? s.start_pos + 1 : end;
      for (int64_t pos = 0; pos < end; ++pos) {
        const Slot& slot = kv_[s.block_table[pos / block_size_] * block_size_ + pos % block_size_];
        if (slot.pos != pos) return Internal("KV slot holds another position");
        history.push_back(slot.token);
        if (pos + 1 < first_row) continue;
        const std::vector<float> row = Row(history, vocab_, soft_, disagree_every_);
        logits->insert(logits->end(), row.begin(), row.end());
      }
    }
    ++steps_;
    tokens_processed_ += n_tokens;
    max_step_tokens_ = std::max(max_step_tokens_, n_tokens);
    max_batch_ = std::max<int64_t>(max_batch_, static_cast<int64_t>(batch.size()));
    int64_t adapter_runs = 0;  // runs of consecutive sequences of one adapter and scale
    for (size_t i = 0; i < batch.size(); ++i) {
      if (i == 0 || batch[i].adapter != batch[i - 1].adapter ||
          batch[i].adapter_scale != batch[i - 1].adapter_scale)
        ++adapter_runs;
    }
    max_adapter_runs_ = std::max(max_adapter_runs_, adapter_runs);
    if (has_prefill && has_decode) ++mixed_steps_;
    return Status::Ok();
  }

  // Forgets every KV slot, as a plugin hot reload loses the device memory the cache was in: a
  // sequence whose KV is not recomputed afterwards reads a hole and fails its step.
  void WipeKv() {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(kv_.begin(), kv_.end(), Slot{-1, -1});
    std::fill(wkv_.begin(), wkv_.end(), Slot{-1, -1});
  }
  // Another model (a draft that is sometimes wrong): after every `every`-th position the next
  // token is the model's plus one. 0: the model itself.
  void set_disagree_every(int32_t every) { disagree_every_ = every; }
  void set_soft(bool soft) { soft_ = soft; }
  // Makes every step take at least this long (so that tests can act mid-request).
  void set_step_delay_us(int64_t us) { step_delay_us_ = us; }
  int64_t steps() const { return steps_; }
  int64_t tokens_processed() const { return tokens_processed_; }
  int64_t max_step_tokens() const { return max_step_tokens_; }
  int64_t max_batch() const { return max_batch_; }
  int64_t mixed_steps() const { return mixed_steps_; }
  // The most runs of one adapter (and scale) a step's batch was cut into.
  int64_t max_adapter_runs() const { return max_adapter_runs_; }

 private:
  struct Slot {
    int32_t token;
    int32_t pos;
  };
  // Writes the step's tokens to their window blocks, then reads back each query's window.
  Status CheckWindow(const SequenceStep& s, int64_t end) {
    const auto& w = s.window_block_table;
    if (static_cast<int64_t>(w.size()) * block_size_ < end) return Internal("window table too short");
    for (int32_t b : w) {
      if (b < 0 || b > num_window_blocks_) return Internal("bad window block id");
    }
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int64_t pos = s.start_pos + static_cast<int64_t>(i);
      const int32_t block = w[pos / block_size_];
      if (block == num_window_blocks_) return Internal("a token written to the spare window block");
      wkv_[block * block_size_ + pos % block_size_] = Slot{s.tokens[i], static_cast<int32_t>(pos)};
    }
    for (int64_t q = s.start_pos; q < end; ++q) {
      for (int64_t pos = std::max<int64_t>(0, q - window_ + 1); pos <= q; ++pos) {
        const Slot& got = wkv_[w[pos / block_size_] * block_size_ + pos % block_size_];
        const Slot& want = kv_[s.block_table[pos / block_size_] * block_size_ + pos % block_size_];
        if (got.pos != pos || got.token != want.token) {
          return Internal("window KV slot of position " + std::to_string(pos) +
                          " lost (query at " + std::to_string(q) + ")");
        }
      }
    }
    return Status::Ok();
  }
  int64_t vocab_, context_, block_size_, num_blocks_;
  std::mutex mu_;
  std::vector<Slot> kv_;  // [num_blocks * block_size]
  int64_t num_window_blocks_ = 0, window_ = 0;
  std::vector<Slot> wkv_;  // [(num_window_blocks + 1) * block_size]
  std::atomic<int64_t> step_delay_us_{0};
  int32_t disagree_every_ = 0;
  bool soft_ = false;
  int64_t steps_ = 0, tokens_processed_ = 0, max_step_tokens_ = 0, max_batch_ = 0,
          mixed_steps_ = 0, max_adapter_runs_ = 0;
};

}  // namespace polychip::engine::testing
