// The ModelRunner of the llama family on one device: owns the weights, the paged KV cache and
// the activation workspace (all from one device memory pool) and runs engine steps through the
// Transformer. A batch larger than the workspace is split into sub-steps of at most
// max_tokens_per_step tokens (a sequence's tokens may span sub-steps: its earlier tokens' K/V
// are in the cache by then), so the engine never has to know the workspace size.
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "model/kv_cache_dtypes.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "runtime/device.h"
#include "runtime/memory_pool.h"
#include "util/status.h"

namespace polychip::model {

struct RunnerOptions {
  int64_t context_length = 0;        // max positions per sequence; 0: min(n_ctx_train, 4096)
  int64_t kv_tokens = 0;             // token slots in the KV cache; 0: context_length
  int64_t block_size = 16;           // token slots per KV block
  // Sliding-window layers (gemma3): their KV in a window pool of its own, this fraction of the
  // main pool's token slots (as SGLang's --swa-full-tokens-ratio), whose blocks the engine
  // releases once a sequence has moved a window past them. 0, or a pool no smaller than the
  // main one: those layers share the main blocks (callers that build steps without the engine
  // must leave it 0). Never below what one sequence needs to make progress.
  double swa_full_tokens_ratio = 0;
  // K's and V's: F16 (default, as llama.cpp), F32, BF16, Q8_0, Q4_0 or FP8_E4M3
  KvCacheDtypes kv_dtypes;
  int64_t max_tokens_per_step = 512; // activation workspace rows
  int64_t max_logit_rows = 64;       // logits computed per output launch
  uint64_t arena_bytes = 64ull << 20;  // memory pool arena size
  // Tensor parallel: this runner holds rank `rank` of `size` shards (tensor_parallel.h). The
  // KV cache and workspace then hold only this rank's heads.
  TensorParallel tensor_parallel;
  // Pipeline parallel: this runner holds one stage's layers (and their KV cache).
  PipelineStage pipeline;
  // LoRA adapters (lora.h) resident on the device at once (--max-loras-per-batch): a step uses
  // at most this many distinct adapters; others are uploaded on demand, the least recently
  // used evicted. 0: a step with an adapter fails.
  int64_t max_loras = 8;
};

class TransformerRunner : public engine::ModelRunner {
 public:
  // Uploads the weights of `file` (which may be closed afterwards) and allocates the KV cache
  // and the workspace on `device`.
  static StatusOr<std::unique_ptr<TransformerRunner>> Create(
      const GgufFile& file, const ModelConfig& config, std::shared_ptr<runtime::Device> device,
      const RunnerOptions& options = {});
  ~TransformerRunner() override;

  int64_t vocab_size() const override { return config_.n_vocab; }
  int64_t context_length() const override { return context_length_; }
  int64_t block_size() const override { return options_.block_size; }
  int64_t num_kv_blocks() const override { return num_blocks_; }
  int64_t kv_blocks_per_pool() const override {
    return pool_blocks_ < num_blocks_ ? pool_blocks_ : 0;
  }
  int64_t num_window_kv_blocks() const override { return num_window_blocks_; }
  int64_t kv_window() const override { return num_window_blocks_ > 0 ? config_.sliding_window : 0; }
  int64_t hidden_size() const override { return config_.n_embd; }

  Status Forward(std::span<const engine::SequenceStep> batch,
                 std::vector<float>* logits) override;
  // The device's per-op counters (runtime/op_counters.h), then
  // polychip_op_fallback_launches_total{op, backend, fallback} when ops fall back.
  void RenderMetrics(std::string* out) const override;
  std::optional<double> LastStepDeviceSeconds() const override { return last_step_device_s_; }

  const ModelConfig& config() const { return config_; }
  const RunnerOptions& options() const { return options_; }
  runtime::Device& device() const { return *device_; }
  uint64_t weight_bytes() const { return weights_->device_bytes; }
  uint64_t kv_bytes() const { return kv_bytes_; }

 private:
  // A contiguous run of one sequence's tokens inside a sub-step.
  struct Piece {
    const engine::SequenceStep* seq;
    int64_t begin;  // index into seq->tokens
    int64_t count;
  };
  TransformerRunner(ModelConfig config, std::shared_ptr<runtime::Device> device,
                    RunnerOptions options);
  Status Init(const GgufFile& file);
  Status Validate(const engine::SequenceStep& s) const;
  // The KV pool of a sequence's blocks (0 with one pool).
  int64_t PoolOf(const engine::SequenceStep& s) const {
    return s.block_table.empty() ? 0 : s.block_table[0] / pool_blocks_;
  }
  // Forward over a batch already in pool order.
  Status ForwardSorted(std::span<const engine::SequenceStep> batch, std::vector<float>* logits);
  Status RunPieces(std::span<const Piece> pieces, std::vector<float>* logits);
  // Makes the batch's adapters resident and the scratch of their x A^T large enough.
  Status PrepareLoras(std::span<const engine::SequenceStep> batch);
  // The resident adapter of a step's sequence (null: the base model).
  const DeviceLora* LoraOf(const engine::SequenceStep& s) const;
  // The logits of `rows` rows just left in logits_, into dst [rows, n_vocab] (host memory). A
  // tensor-parallel rank's are its vocabulary shard's, gathered from every rank here.
  Status CopyLogits(float* dst, int64_t rows);

  ModelConfig config_;
  std::shared_ptr<runtime::Device> device_;
  RunnerOptions options_;
  int64_t context_length_ = 0;
  int64_t num_blocks_ = 0;
  // Blocks per KV pool: num_blocks_ but where one layer's K or V would exceed the device's max
  // single allocation; then each pool has buffers of its own (KvCacheView).
  int64_t pool_blocks_ = 0;
  int64_t num_window_blocks_ = 0;  // 0: no window pool
  int64_t max_blocks_per_seq_ = 0;
  uint64_t kv_bytes_ = 0;

  std::shared_ptr<runtime::MemoryPool> pool_;
  std::unique_ptr<runtime::Stream> stream_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<Transformer> transformer_;
  std::vector<float> shard_logits_, gathered_logits_;  // tensor parallel: CopyLogits's staging

  std::vector<PoolBuffer> kv_buffers_;  // K and V of every layer
  KvCacheView kv_;  // with a window pool, the sliding layers' K/V have its blocks
  std::vector<PoolBuffer> work_;        // activation buffers
  StepBuffers buf_;
  runtime::DevPtr h_ = 0;        // [max_logit_rows, n_embd]
  std::optional<double> last_step_device_s_;
  runtime::DevPtr logits_ = 0;   // [max_logit_rows, n_vocab] (tensor parallel: vocab.rows)
  PoolBuffer meta_;              // packed int32 index arrays of a step
  uint64_t meta_bytes_ = 0;
  std::vector<int32_t> host_meta_;  // staging for meta_ (alive until the step synchronizes)
  std::vector<bool> row_hidden_;    // per output row of a sub-step: hidden state, not logits
  std::vector<KvPoolRun> pool_runs_;  // a sub-step's runs of one KV pool (several pools only)

  // LoRA: the resident adapters, the scratch [max(T, max_logit_rows), max rank] of x A^T, the
  // sub-step's runs of token rows and their groups by adapter (lora.h), each output row's
  // adapter, and each logits launch's runs and groups.
  std::unique_ptr<LoraCache> loras_;
  // The base model's file, opened again (from base_path_) for an adapter of the experts, whose
  // feed-forward runs on the host from the file's weights (transformer.cc).
  std::string base_path_;
  std::unique_ptr<GgufFile> lora_base_;
  PoolBuffer lora_scratch_;
  int64_t lora_scratch_rank_ = 0;
  std::vector<LoraSegment> lora_tokens_;
  std::vector<LoraGroup> lora_token_groups_;
  std::vector<LoraSegment> row_lora_;  // per output row (begin, rows unused)
  // A sub-step's logits launches: max_logit_rows rows at a time over runs of rows of one kind,
  // with their ranges of lora_rows_ and lora_row_groups_ (all launches' runs, then groups).
  struct LogitsLaunch {
    int64_t first_row = 0, rows = 0;
    bool hidden = false;
    size_t runs_begin = 0, runs_end = 0, groups_begin = 0, groups_end = 0;
  };
  std::vector<LogitsLaunch> logits_launches_;
  std::vector<LoraSegment> lora_rows_;
  std::vector<LoraGroup> lora_row_groups_;
  // loras_->uploads(), for /metrics, which reads it from another thread than the steps'.
  std::atomic<int64_t> lora_uploads_{0};
};

}  // namespace polychip::model
