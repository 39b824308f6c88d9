// Tensor parallelism inside the runner, ranks as threads on cpu devices with in-process
// collectives: the embedding and the output layer split by vocabulary rows (tensor_parallel.h)
// give the single rank's logits and greedy tokens, and each rank holds about 1/tp of the
// vocabulary tables. Models: tied embeddings (one table for both ops) with 12 heads, so tp 3
// splits the qwen2 vocabulary (151,936 = 3 x 50,645 + 1) unevenly; and the untied "tiny" shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/runner.h"
#include "model/tensor_parallel.h"
#include "test_models.h"

namespace polychip::model {
namespace {

using engine::LogitsMode;
using engine::SequenceStep;

std::string TiedModel() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("tiny");
    o.config.arch = Arch::kQwen2;
    o.config.has_qkv_bias = true;
    o.config.tied_output = true;
    o.config.n_embd = 192;
    o.config.n_head = 12;
    o.config.n_head_kv = 6;
    o.config.n_ff = 384;
    o.config.head_dim = o.config.head_dim_v = o.config.n_rot = 16;
    o.type = DType::kF16;
    o.weight_std = 0.15f;
    o.seed = 5;
    return testing::SynthesizeTestModel("vocab_parallel_tied_h12_f16", o);
  }();
  return path;
}

std::string UntiedModel() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("tiny");
    o.type = DType::kF16;
    o.weight_std = 0.15f;
    o.seed = 6;
    return testing::SynthesizeTestModel("vocab_parallel_untied_f16", o);
  }();
  return path;
}

// Collectives over n threads: each rank posts its buffer, all wait, each reads every post (in
// rank order, so every rank computes the same sum), all wait again.
class ThreadGroup {
 public:
  explicit ThreadGroup(int n) : posts_(n), sync_(n) {}

  TensorParallel Rank(int rank, int64_t n_embd) {
    TensorParallel tp;
    tp.rank = rank;
    tp.size = int32_t(posts_.size());
    tp.all_reduce = [this, rank, n_embd](const runtime::Stream& stream, runtime::DevPtr x,
                                         int64_t n_rows) -> Status {
      auto& s = const_cast<runtime::Stream&>(stream);  // as the dist staging does
      std::vector<float>& mine = posts_[rank];
      mine.resize(size_t(n_rows * n_embd));
      PC_RETURN_IF_ERROR(s.CopyD2H(mine.data(), x, mine.size() * 4));
      PC_RETURN_IF_ERROR(s.Synchronize());
      sync_.arrive_and_wait();
      std::vector<float> sum(mine.size(), 0.f);
      for (const auto& p : posts_) {
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += p[i];
      }
      sync_.arrive_and_wait();
      PC_RETURN_IF_ERROR(s.CopyH2D(x, sum.data(), sum.size() * 4));
      return s.Synchronize();  // `sum` dies here
    };
    tp.all_gather = [this, rank](const float* send, float* out, int64_t count) -> Status {
      posts_[rank].assign(send, send + count);
      sync_.arrive_and_wait();
      for (size_t r = 0; r < posts_.size(); ++r) {
        std::copy(posts_[r].begin(), posts_[r].end(), out + r * count);
      }
      sync_.arrive_and_wait();
      return Status::Ok();
    };
    return tp;
  }

 private:
  std::vector<std::vector<float>> posts_;
  std::barrier<> sync_;
};

class VocabParallelTest : public testing::ModelFileTest<::testing::Test> {
 protected:
  RunnerOptions Options() const {
    RunnerOptions o;
    o.context_length = 64;
    o.kv_tokens = 128;
    o.block_size = 4;
    o.max_logit_rows = 3;  // several output launches per step
    return o;
  }

  // Prefill of a prompt with every row's logits (the first and last tokens of the vocabulary
  // included, so the last rank's short range is looked up), then `n_decode` greedy steps.
  struct Run {
    std::vector<float> prefill_logits;
    std::vector<int32_t> greedy;
    uint64_t weight_bytes = 0;
  };
  Run Drive(TransformerRunner& r, int n_decode) {
    Run out;
    out.weight_bytes = r.weight_bytes();
    std::vector<int32_t> tokens = {0, 151935, 17, 75968, 75967, 50645, 101290, 101291, 3000};
    std::vector<int32_t> blocks = {0, 1, 2, 3, 4, 5, 6, 7};
    SequenceStep s{1, tokens, 0, blocks, LogitsMode::kAll};
    Status st = r.Forward({&s, 1}, &out.prefill_logits);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::vector<float> logits = out.prefill_logits;
    int32_t pos = int32_t(tokens.size());
    for (int i = 0; i < n_decode && st.ok(); ++i) {
      const int64_t v = r.vocab_size();
      const float* last = logits.data() + logits.size() - v;
      const int32_t next = int32_t(std::max_element(last, last + v) - last);
      out.greedy.push_back(next);
      std::vector<int32_t> one = {next};
      SequenceStep d{1, one, pos++, blocks, LogitsMode::kLast};
      st = r.Forward({&d, 1}, &logits);
      EXPECT_TRUE(st.ok()) << st.ToString();
    }
    return out;
  }

  Run Single() {
    auto dev = testing::OpenTestDevice("cpu");
    auto r = TransformerRunner::Create(*file_, config_, dev, Options());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? Drive(**r, kDecode) : Run{};
  }

  // Every rank's run; rank 0's logits are the job's.
  std::vector<Run> Parallel(int tp) {
    ThreadGroup group(tp);
    std::vector<Run> runs(tp);
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < tp; ++rank) {
      ranks.emplace_back([&, rank] {
        RunnerOptions o = Options();
        o.tensor_parallel = group.Rank(rank, config_.n_embd);
        auto dev = testing::OpenTestDevice("cpu");
        auto r = TransformerRunner::Create(*file_, config_, dev, o);
        ASSERT_TRUE(r.ok()) << r.status().ToString();  // every rank fails alike, or none
        runs[rank] = Drive(**r, kDecode);
      });
    }
    for (auto& t : ranks) t.join();
    return runs;
  }

  // Same greedy tokens, the same logits up to the reordered partial sums of the layers, and
  // the vocabulary tables' bytes divided among the ranks.
  void ExpectSameAsOneRank(int tp, uint64_t table_bytes) {
    const Run one = Single();
    const std::vector<Run> many = Parallel(tp);
    ASSERT_EQ(one.greedy.size(), size_t(kDecode));
    for (int rank = 0; rank < tp; ++rank) {
      const Run& r = many[rank];
      EXPECT_EQ(r.greedy, one.greedy) << "rank " << rank;
      ASSERT_EQ(r.prefill_logits.size(), one.prefill_logits.size());
      float max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < one.prefill_logits.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(r.prefill_logits[i] - one.prefill_logits[i]));
        max_abs = std::max(max_abs, std::abs(one.prefill_logits[i]));
      }
      EXPECT_LT(max_diff, 1e-4f * max_abs + 1e-5f) << "rank " << rank;
      // A rank holds its 1/tp share of the tables (and of the layers), plus one zero row and
      // the replicated norms; replicated tables would put table_bytes * (tp - 1) / tp more here.
      EXPECT_LT(r.weight_bytes, one.weight_bytes / tp + table_bytes / 20) << "rank " << rank;
    }
    uint64_t sum = 0;
    for (const Run& r : many) sum += r.weight_bytes;
    EXPECT_LT(sum, one.weight_bytes + table_bytes / 20);
  }

  static constexpr int kDecode = 6;
};

TEST_F(VocabParallelTest, TiedTableSplitEvenlyOverTwoRanks) {
  ASSERT_NO_FATAL_FAILURE(OpenModel(TiedModel()));
  ASSERT_TRUE(config_.tied_output);
  ExpectSameAsOneRank(2, uint64_t(config_.n_vocab) * config_.n_embd * 2);
}

TEST_F(VocabParallelTest, TiedTableSplitUnevenlyOverThreeRanks) {
  ASSERT_NO_FATAL_FAILURE(OpenModel(TiedModel()));
  ASSERT_NE(config_.n_vocab % 3, 0);
  ExpectSameAsOneRank(3, uint64_t(config_.n_vocab) * config_.n_embd * 2);
}

TEST_F(VocabParallelTest, UntiedEmbeddingAndOutputSplitOverTwoRanks) {
  ASSERT_NO_FATAL_FAILURE(OpenModel(UntiedModel()));
  ASSERT_FALSE(config_.tied_output);
  ExpectSameAsOneRank(2, 2 * uint64_t(config_.n_vocab) * config_.n_embd * 2);
}

TEST(VocabShard, RangesCoverTheVocabularyOnce) {
  for (int32_t size : {1, 2, 3, 7}) {
    int64_t next = 0;
    for (int32_t rank = 0; rank < size; ++rank) {
      const VocabShard v = ShardVocab(151936, rank, size);
      EXPECT_EQ(v.begin, next);
      EXPECT_EQ(v.rows, (151936 + size - 1) / size + 1);
      EXPECT_LT(v.count, v.rows);  // the zero row is always there
      EXPECT_EQ(v.LocalId(v.begin), 0);
      EXPECT_EQ(v.LocalId(v.begin - 1), v.rows - 1);
      EXPECT_EQ(v.LocalId(v.begin + v.count), v.rows - 1);
      next += v.count;
    }
    EXPECT_EQ(next, 151936);
  }
}

}  // namespace
}  // namespace polychip::model
