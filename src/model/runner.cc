#include "model/runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "model/op_coverage.h"
#include "runtime/op_counters.h"
#include "runtime/op_fallback.h"

namespace polychip::model {

using engine::LogitsMode;
using engine::SequenceStep;
using runtime::DevPtr;

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Sub-arrays of the packed index buffer start on 64-element (256-byte) boundaries.
int64_t Align64(int64_t n) { return CeilDiv(n, 64) * 64; }

// Appends `run` to the runs from `first` on, or extends the last of them when `run` continues
// it (the same adapter at the same scale, the next rows).
void AppendLoraRun(std::vector<LoraSegment>* runs, size_t first, const LoraSegment& run) {
  LoraSegment* last = runs->size() > first ? &runs->back() : nullptr;
  if (last && last->lora == run.lora && last->scale == run.scale &&
      last->begin + last->rows == run.begin) {
    last->rows += run.rows;
  } else {
    runs->push_back(run);
  }
}

}  // namespace

TransformerRunner::TransformerRunner(ModelConfig config, std::shared_ptr<runtime::Device> device,
                                     RunnerOptions options)
    : config_(std::move(config)), device_(std::move(device)), options_(options) {}

TransformerRunner::~TransformerRunner() {
  // Work may still be queued on the stream; let it finish before the buffers go back.
  if (stream_) (void)stream_->Synchronize();
}

StatusOr<std::unique_ptr<TransformerRunner>> TransformerRunner::Create(
    const GgufFile& file, const ModelConfig& config, std::shared_ptr<runtime::Device> device,
    const RunnerOptions& options) {
  std::unique_ptr<TransformerRunner> runner(
      new TransformerRunner(config, std::move(device), options));
  PC_RETURN_IF_ERROR(runner->Init(file));
  return runner;
}

Status TransformerRunner::Init(const GgufFile& file) {
  base_path_ = file.path();
  const ModelConfig& c = config_;
  RunnerOptions& o = options_;
  PC_RETURN_IF_ERROR(CheckKvCacheDtypes(o.kv_dtypes, c.head_dim, c.head_dim));
  if (o.block_size <= 0 || o.max_tokens_per_step <= 0 || o.max_logit_rows <= 0) {
    return InvalidArgument("block size, tokens per step and logit rows must be positive");
  }
  context_length_ = o.context_length > 0 ? o.context_length
                                         : std::min<int64_t>(c.n_ctx_train > 0 ? c.n_ctx_train
                                                                               : 4096,
                                                             4096);
  const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : context_length_;
  num_blocks_ = CeilDiv(kv_tokens, o.block_size);
  max_blocks_per_seq_ = CeilDiv(context_length_, o.block_size);
  // The sliding layers' window pool: never smaller than one sequence needs to step (the window,
  // three blocks of slack and a 64-token chunk: BlockManager::MaxStepTokens), and only where it
  // saves memory (smaller than the main pool).
  if (c.NumSlidingLayers() > 0 && o.swa_full_tokens_ratio > 0) {
    const int64_t least = c.sliding_window / o.block_size + 4 + CeilDiv(64, o.block_size);
    const int64_t wanted = std::max<int64_t>(
        least, static_cast<int64_t>(std::ceil(double(num_blocks_) * o.swa_full_tokens_ratio)));
    if (wanted < num_blocks_) num_window_blocks_ = wanted;
  }

  // LongRoPE (phi3): the long factors serve contexts beyond the original one, as llama.cpp
  // chooses them by its context size.
  config_.rope_long_factors =
      context_length_ > (c.rope_orig_ctx > 0 ? c.rope_orig_ctx : c.n_ctx_train);

  const TensorParallel& tp = o.tensor_parallel;
  if (tp.size > 1) {
    if (!tp.all_reduce || !tp.all_gather || tp.rank < 0 || tp.rank >= tp.size) {
      return InvalidArgument("tensor parallel: rank " + std::to_string(tp.rank) + " of " +
                             std::to_string(tp.size) + " without an all-reduce and all-gather");
    }
    PC_ASSIGN_OR_RETURN(config_, ShardConfig(config_, tp.size));
  }

  const PipelineStage& pp = o.pipeline;
  const bool pipeline = pp.n_stages > 1;
  if (pipeline && (!pp.send || !pp.recv || pp.first_layer < 0 ||
                   pp.end_layer <= pp.first_layer || pp.end_layer > c.n_layer)) {
    return InvalidArgument("pipeline stage " + std::to_string(pp.stage) + ": layers [" +
                           std::to_string(pp.first_layer) + ", " + std::to_string(pp.end_layer) +
                           ") invalid for " + std::to_string(c.n_layer) + " layers, or no send/recv");
  }
  const int64_t layer_begin = pipeline ? pp.first_layer : 0;
  const int64_t layer_end = pipeline ? pp.end_layer : c.n_layer;

  // Before anything is allocated: every op this model launches, asked of the device (and of
  // its fallback device); a gap is one error naming the ops and the tensors that need them.
  const std::vector<CoverageRow> coverage =
      CheckCoverage(*device_, RequiredOps(file, config_, o.kv_dtypes, tp.size > 1));
  PC_RETURN_IF_ERROR(CoverageStatus(*device_, coverage));
  std::string fallen_back;
  for (const CoverageRow& r : coverage) {
    if (r.state != OpState::kFallback) continue;
    fallen_back += (fallen_back.empty() ? "" : ", ") + std::string(runtime::OpName(r.use.op)) +
                   "(" + r.use.DtypeText() + ")";
  }
  if (!fallen_back.empty()) {
    runtime::OpFallback& f = *device_->op_fallback();
    spdlog::warn("op fallback: {} run on {}:{} (not supported by {}), operands staged through "
                 "host memory",
                 fallen_back, f.device().backend()->name(), f.device().physical_id(),
                 device_->backend()->name());
  }

  runtime::MemoryPoolOptions pool_options;
  pool_options.arena_bytes = o.arena_bytes;
  pool_ = std::make_shared<runtime::MemoryPool>(device_, pool_options);
  PC_ASSIGN_OR_RETURN(stream_, device_->CreateStream());
  PC_ASSIGN_OR_RETURN(weights_, LoadWeights(file, c, device_, pool_, *stream_, tp.rank, tp.size,
                                            layer_begin, layer_end));
  for (const WeightSplit& split : weights_->splits) {
    spdlog::info("{} ({} bytes) split by rows into {} allocations: {} allows {} bytes at most",
                 split.tensor, split.bytes, split.pieces, device_->props().name,
                 device_->props().max_alloc_size);
  }
  PC_ASSIGN_OR_RETURN(Transformer transformer, Transformer::Create(c, *weights_));
  transformer_ = std::make_unique<Transformer>(std::move(transformer));
  if (tp.size > 1) transformer_->SetTensorParallel(&options_.tensor_parallel);
  if (pipeline) transformer_->SetPipeline(&options_.pipeline);

  // KV cache: per layer, K and V of [n_blocks, block_size, n_head_kv, head_dim]; a sliding
  // layer with the window pool has its blocks plus a spare one, zeroed, that released blocks'
  // table entries point to (the window masks what it holds; it is never written).
  // K's and V's blocks differ in size when their types do.
  const uint64_t k_block_bytes =
      uint64_t(o.block_size) * KvRowBytes(o.kv_dtypes.k, c.n_head_kv, c.head_dim);
  const uint64_t v_block_bytes =
      uint64_t(o.block_size) * KvRowBytes(o.kv_dtypes.v, c.n_head_kv, c.head_dim);
  const uint64_t kv_block_bytes = std::max(k_block_bytes, v_block_bytes);
  // A layer's K (or V) is one operand of ATTENTION, so the blocks one launch reads are in one
  // allocation. Where a layer's blocks would exceed the device's max single allocation they go
  // into pools that each fit, one sequence's blocks all in one pool (the engine keeps them so:
  // kv_blocks_per_pool), so a sequence is at most a pool long (the sliding layers' window pool
  // stays one buffer, with its spare block).
  pool_blocks_ = num_blocks_;
  const uint64_t max_alloc = device_->props().max_alloc_size;
  if (max_alloc != 0) {
    const int64_t fit = int64_t(max_alloc / kv_block_bytes);
    if (fit < 2) {
      return ResourceExhausted("KV cache: a block of " + std::to_string(kv_block_bytes) +
                               " bytes per layer leaves no room in the max single allocation of " +
                               device_->props().name + " (" + std::to_string(max_alloc) +
                               " bytes); lower --page-size");
    }
    if (max_blocks_per_seq_ > fit) {
      spdlog::warn("KV cache: a sequence of {} tokens takes {} bytes per layer, over the max "
                   "single allocation of {} ({} bytes): context length {} tokens instead",
                   context_length_, max_blocks_per_seq_ * kv_block_bytes, device_->props().name,
                   max_alloc, fit * o.block_size);
      context_length_ = fit * o.block_size;
      max_blocks_per_seq_ = fit;
    }
    if (num_blocks_ > fit) {
      int64_t pools = CeilDiv(num_blocks_, fit);
      pool_blocks_ = CeilDiv(num_blocks_, pools);  // even pools
      // Every pool holds a sequence of the full context, or one could never finish in its pool.
      if (pool_blocks_ < max_blocks_per_seq_) {
        pool_blocks_ = max_blocks_per_seq_;
        pools = std::max<int64_t>(1, num_blocks_ / pool_blocks_);
      }
      num_blocks_ = pools * pool_blocks_;
      spdlog::info("KV cache split: {} blocks of {} bytes per layer in {} pools of {} blocks "
                   "({} bytes each, one allocation per pool and layer for K and for V): {} "
                   "allows {} bytes at most; a sequence's blocks stay in one pool",
                   num_blocks_, kv_block_bytes, pools, pool_blocks_, pool_blocks_ * kv_block_bytes,
                   device_->props().name, max_alloc);
    }
    if (num_window_blocks_ + 1 > fit) num_window_blocks_ = fit - 1;
  }
  const int64_t n_pools = num_blocks_ / pool_blocks_;
  kv_.dtypes = o.kv_dtypes;
  kv_.block_size = o.block_size;
  kv_.window_pool = num_window_blocks_ > 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    kv_.k.emplace_back();
    kv_.v.emplace_back();
    if (l < layer_begin || l >= layer_end) {  // another pipeline stage's layer
      kv_.k.back().push_back(0);
      kv_.v.back().push_back(0);
      continue;
    }
    const bool windowed = kv_.window_pool && c.IsSlidingLayer(l);
    const uint64_t layer_blocks = uint64_t(windowed ? num_window_blocks_ + 1 : pool_blocks_);
    for (int64_t p = 0; p < (windowed ? 1 : n_pools); ++p) {
      for (auto [list, block_bytes] :
           {std::pair{&kv_.k.back(), k_block_bytes}, {&kv_.v.back(), v_block_bytes}}) {
        const uint64_t bytes = layer_blocks * block_bytes;
        PC_ASSIGN_OR_RETURN(PoolBuffer b, PoolBuffer::Allocate(pool_, bytes));
        if (windowed) {
          PC_RETURN_IF_ERROR(
              stream_->Memset(b.ptr() + num_window_blocks_ * block_bytes, 0, block_bytes));
        }
        list->push_back(b.ptr());
        kv_buffers_.push_back(std::move(b));
        kv_bytes_ += bytes;
      }
    }
  }

  // Activation workspace for max_tokens_per_step rows.
  const int64_t T = o.max_tokens_per_step;
  auto alloc = [&](int64_t floats) -> StatusOr<DevPtr> {
    PC_ASSIGN_OR_RETURN(PoolBuffer b, PoolBuffer::Allocate(pool_, uint64_t(floats) * 4));
    const DevPtr p = b.ptr();
    work_.push_back(std::move(b));
    return p;
  };
  PC_ASSIGN_OR_RETURN(buf_.x, alloc(T * c.n_embd));
  PC_ASSIGN_OR_RETURN(buf_.xn, alloc(T * c.n_embd));
  PC_ASSIGN_OR_RETURN(buf_.q, alloc(T * c.q_dim()));
  PC_ASSIGN_OR_RETURN(buf_.k, alloc(T * c.kv_dim()));
  PC_ASSIGN_OR_RETURN(buf_.v, alloc(T * c.kv_dim()));
  PC_ASSIGN_OR_RETURN(buf_.attn, alloc(T * c.q_dim()));
  // The gate buffer also holds a mixture of experts' router logits [T, n_expert].
  PC_ASSIGN_OR_RETURN(buf_.gate, alloc(T * std::max(c.n_ff, c.n_expert)));
  // The up buffer also holds the routing over experts split into pieces: [T, n_expert + pieces]
  // (transformer.cc).
  int64_t up_cols = c.n_ff;
  for (const LayerWeights& L : weights_->layers) {
    up_cols = std::max(up_cols, c.n_expert + int64_t(L.gate_exps.pieces.size()));
  }
  PC_ASSIGN_OR_RETURN(buf_.up, alloc(T * up_cols));
  // The logits buffer is one allocation (MATMUL's output): as many rows as fit.
  const int64_t logit_width = tp.size > 1 ? weights_->vocab.rows : c.n_vocab;
  if (max_alloc != 0) {
    o.max_logit_rows =
        std::clamp<int64_t>(int64_t(max_alloc / (uint64_t(logit_width) * 4)), 1, o.max_logit_rows);
  }
  PC_ASSIGN_OR_RETURN(h_, alloc(o.max_logit_rows * c.n_embd));
  PC_ASSIGN_OR_RETURN(logits_, alloc(o.max_logit_rows * logit_width));

  // tokens, positions, slots, rows: [T]; query_start [T + 1]; seq_lens [T];
  // block_tables [T, max_blocks_per_seq]; with the window pool, window slots [T] and window
  // block tables [T, max_blocks_per_seq].
  // With an embedding table split by rows, each piece's local ids [T] follow (64 elements of
  // slack for their alignment).
  // With the KV cache in pools, each run of one pool's sequences (at most one per pool: the
  // batch is sorted by pool) has its slots [its tokens], query_start [its sequences + 1],
  // seq_lens and block tables, each 64-aligned.
  // With LoRA adapters, the row lists of the LORA launches (lora.h, LoraGroup): the step's
  // tokens' [at most T], then its logits launches' [at most T].
  const int64_t meta_elems = 7 * Align64(T) + Align64(T + 1) + Align64(T * max_blocks_per_seq_) +
                             (kv_.window_pool ? Align64(T) + Align64(T * max_blocks_per_seq_) : 0) +
                             int64_t(weights_->embd_pieces.size()) * Align64(T) + 64 +
                             (n_pools > 1 ? 3 * T + n_pools + T * max_blocks_per_seq_ +
                                                4 * 64 * std::min(n_pools, T)
                                          : 0);
  meta_bytes_ = uint64_t(meta_elems) * 4;
  PC_ASSIGN_OR_RETURN(meta_, PoolBuffer::Allocate(pool_, meta_bytes_));
  host_meta_.resize(meta_elems);
  return Status::Ok();
}

Status TransformerRunner::Validate(const SequenceStep& s) const {
  const int64_t end = int64_t(s.start_pos) + int64_t(s.tokens.size());
  if (s.start_pos < 0 || end > context_length_) {
    return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": positions [" +
                           std::to_string(s.start_pos) + ", " + std::to_string(end) +
                           ") exceed the context length " + std::to_string(context_length_));
  }
  if (int64_t(s.block_table.size()) < CeilDiv(end, options_.block_size)) {
    return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": block table has " +
                           std::to_string(s.block_table.size()) + " blocks, " +
                           std::to_string(CeilDiv(end, options_.block_size)) + " needed");
  }
  for (int32_t b : s.block_table) {
    if (b < 0 || b >= num_blocks_) {
      return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": block id " +
                             std::to_string(b) + " out of range [0, " +
                             std::to_string(num_blocks_) + ")");
    }
  }
  // The blocks its positions use, in one pool (a table may name more blocks than it uses);
  // with one pool (the cache not split) there is nothing to check.
  const bool split = pool_blocks_ < num_blocks_;
  for (int64_t i = 0; split && i < CeilDiv(end, options_.block_size); ++i) {
    if (s.block_table[i] / pool_blocks_ != PoolOf(s)) {
      return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": blocks " +
                             std::to_string(s.block_table[0]) + " and " +
                             std::to_string(s.block_table[i]) + " are in different KV pools (" +
                             std::to_string(pool_blocks_) + " blocks each)");
    }
  }
  if (num_window_blocks_ > 0) {
    const auto& w = s.window_block_table;
    if (int64_t(w.size()) < CeilDiv(end, options_.block_size)) {
      return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": window block table has " +
                             std::to_string(w.size()) + " blocks, " +
                             std::to_string(CeilDiv(end, options_.block_size)) + " needed");
    }
    for (int32_t b : w) {
      if (b < 0 || b > num_window_blocks_) {
        return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": window block id " +
                               std::to_string(b) + " out of range [0, " +
                               std::to_string(num_window_blocks_) + "]");
      }
    }
    // The new tokens' K/V go to real blocks, never to the spare one.
    for (int64_t b = s.start_pos / options_.block_size; b < CeilDiv(end, options_.block_size); ++b) {
      if (w[b] == num_window_blocks_) {
        return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": window block " +
                               std::to_string(b) + " (positions being written) was released");
      }
    }
  }
  for (int32_t t : s.tokens) {
    if (t < 0 || t >= config_.n_vocab) {
      return InvalidArgument("sequence " + std::to_string(s.seq_id) + ": token id " +
                             std::to_string(t) + " out of range");
    }
  }
  if (s.tokens.empty() && s.logits != LogitsMode::kNone) {
    return InvalidArgument("sequence " + std::to_string(s.seq_id) +
                           ": logits requested for a step without tokens");
  }
  return Status::Ok();
}

Status TransformerRunner::Forward(std::span<const SequenceStep> batch,
                                  std::vector<float>* logits) {
  logits->clear();
  for (const SequenceStep& s : batch) PC_RETURN_IF_ERROR(Validate(s));
  // The step's device time, from the plugin's per-op counters (two reads of a few records).
  last_step_device_s_.reset();
  const auto counters_before = device_->backend()->ReadOpCounters(*device_);
  PC_RETURN_IF_ERROR(PrepareLoras(batch));
  const bool sorted = std::ranges::is_sorted(
      batch, {}, [&](const SequenceStep& s) { return PoolOf(s); });
  if (sorted) {
    PC_RETURN_IF_ERROR(ForwardSorted(batch, logits));
  } else {
    // The KV cache in pools: one run of sequences per pool, so that each layer stores and
    // attends once per pool. The output rows come back in the batch's order.
    std::vector<size_t> order(batch.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::ranges::stable_sort(order, {}, [&](size_t i) { return PoolOf(batch[i]); });
    std::vector<SequenceStep> by_pool;
    for (size_t i : order) by_pool.push_back(batch[i]);
    std::vector<float> out;
    PC_RETURN_IF_ERROR(ForwardSorted(by_pool, &out));
    auto floats = [&](const SequenceStep& s) -> size_t {  // the output of s (Forward's contract)
      const size_t width = engine::IsHidden(s.logits) ? config_.n_embd : config_.n_vocab;
      switch (s.logits) {
        case LogitsMode::kNone: return 0;
        case LogitsMode::kLast:
        case LogitsMode::kHiddenLast: return width;
        case LogitsMode::kAll:
        case LogitsMode::kHiddenAll: return width * s.tokens.size();
      }
      return 0;
    };
    std::vector<size_t> offset(batch.size() + 1, 0);  // of each sequence in the batch's order
    for (size_t i = 0; i < batch.size(); ++i) offset[i + 1] = offset[i] + floats(batch[i]);
    PC_CHECK(out.size() == offset.back());
    logits->resize(out.size());
    size_t from = 0;
    for (size_t i : order) {
      std::copy_n(out.data() + from, offset[i + 1] - offset[i], logits->data() + offset[i]);
      from += offset[i + 1] - offset[i];
    }
  }
  if (counters_before) {
    if (auto after = device_->backend()->ReadOpCounters(*device_)) {
      last_step_device_s_ =
          runtime::DeviceSeconds(runtime::OpCountersDelta(*counters_before, *after));
    }
  }
  return Status::Ok();
}

Status TransformerRunner::ForwardSorted(std::span<const SequenceStep> batch,
                                        std::vector<float>* logits) {
  // Pack the batch into sub-steps of at most max_tokens_per_step tokens.
  const int64_t cap = options_.max_tokens_per_step;
  std::vector<Piece> pieces;
  int64_t used = 0;
  for (const SequenceStep& s : batch) {
    int64_t begin = 0;
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    while (begin < n) {
      if (used == cap) {
        PC_RETURN_IF_ERROR(RunPieces(pieces, logits));
        pieces.clear();
        used = 0;
      }
      const int64_t take = std::min(n - begin, cap - used);
      pieces.push_back({&s, begin, take});
      begin += take;
      used += take;
    }
  }
  if (!pieces.empty()) PC_RETURN_IF_ERROR(RunPieces(pieces, logits));
  return Status::Ok();
}

Status TransformerRunner::PrepareLoras(std::span<const SequenceStep> batch) {
  std::vector<std::shared_ptr<const LoraAdapter>> wanted;
  for (const SequenceStep& s : batch) {
    if (s.adapter == nullptr) continue;
    const auto* a = dynamic_cast<const LoraAdapter*>(s.adapter);
    if (a == nullptr) return InvalidArgument("the step's adapter is not a LoRA adapter");
    bool seen = false;
    for (const auto& w : wanted) seen = seen || w->id() == a->id();
    if (!seen) wanted.push_back(a->shared_from_this());
  }
  if (wanted.empty()) return Status::Ok();
  if (options_.max_loras <= 0) return InvalidArgument("LoRA adapters are off (max loras 0)");
  if (!loras_) loras_ = std::make_unique<LoraCache>(device_, options_.max_loras);
  // The adapters' matrices follow this runner's part of the model (lora.h, LoraShard).
  const PipelineStage& pp = options_.pipeline;
  const TensorParallel& tp = options_.tensor_parallel;
  LoraShard shard;
  shard.layer_begin = pp.n_stages > 1 ? pp.first_layer : 0;
  shard.layer_end = pp.n_stages > 1 ? pp.end_layer : config_.n_layer;
  shard.output = pp.n_stages <= 1 || pp.last();
  if (tp.size > 1) {
    shard.tp_rank = tp.rank;
    shard.tp_size = tp.size;
    shard.vocab = weights_->vocab;
  }
  const Status prepared = loras_->Prepare(wanted, config_, shard);
  if (!lora_base_) {
    for (const auto& a : wanted) {
      for (int64_t l = shard.layer_begin; l < shard.layer_end && !lora_base_; ++l) {
        if (!a->AdaptsExperts(l)) continue;
        PC_ASSIGN_OR_RETURN(lora_base_, GgufFile::Open(base_path_));
      }
    }
  }
  lora_uploads_.store(loras_->uploads(), std::memory_order_relaxed);
  PC_RETURN_IF_ERROR(prepared);
  if (loras_->max_rank() > lora_scratch_rank_) {
    const int64_t rows = std::max(options_.max_tokens_per_step, options_.max_logit_rows);
    PC_ASSIGN_OR_RETURN(lora_scratch_,
                        PoolBuffer::Allocate(pool_, uint64_t(rows * loras_->max_rank()) * 4));
    lora_scratch_rank_ = loras_->max_rank();
    buf_.lora = lora_scratch_.ptr();
  }
  return Status::Ok();
}

const DeviceLora* TransformerRunner::LoraOf(const SequenceStep& s) const {
  if (s.adapter == nullptr || !loras_) return nullptr;
  return loras_->Get(s.adapter->id());
}

Status TransformerRunner::RunPieces(std::span<const Piece> pieces, std::vector<float>* logits) {
  const ModelConfig& c = config_;
  const int64_t bs = options_.block_size;
  const int64_t T_cap = options_.max_tokens_per_step;

  int64_t n_tokens = 0, max_blocks = 0, max_len = 0;
  for (const Piece& p : pieces) {
    n_tokens += p.count;
    const int64_t len = p.seq->start_pos + p.begin + p.count;
    max_len = std::max(max_len, len);
    max_blocks = std::max(max_blocks, CeilDiv(len, bs));
  }
  const int64_t n_seqs = static_cast<int64_t>(pieces.size());

  // Host staging of the index arrays, in one packed buffer (one copy to the device).
  int32_t* m = host_meta_.data();
  const int64_t o_tokens = 0, o_pos = Align64(T_cap), o_slots = 2 * Align64(T_cap),
                o_rows = 3 * Align64(T_cap), o_lens = 4 * Align64(T_cap),
                o_qstart = 5 * Align64(T_cap), o_tables = o_qstart + Align64(T_cap + 1);
  // The window pool's arrays right after this step's tables, so that one copy of what the
  // step uses carries them all (meta_ is sized for the largest step).
  const bool window = kv_.window_pool;
  const int64_t o_wslots = Align64(o_tables + n_seqs * max_blocks),
                o_wtables = o_wslots + Align64(n_tokens);
  int64_t t = 0, n_rows = 0;
  row_hidden_.clear();
  lora_tokens_.clear();
  row_lora_.clear();
  for (int64_t s = 0; s < n_seqs; ++s) {
    const Piece& p = pieces[s];
    const SequenceStep& seq = *p.seq;
    const LoraSegment lora{t, p.count, LoraOf(seq), seq.adapter_scale};
    if (lora.lora != nullptr) AppendLoraRun(&lora_tokens_, 0, lora);  // runs of one adapter
    m[o_qstart + s] = static_cast<int32_t>(t);
    m[o_lens + s] = static_cast<int32_t>(seq.start_pos + p.begin + p.count);
    for (int64_t b = 0; b < max_blocks; ++b) {
      m[o_tables + s * max_blocks + b] =
          b < int64_t(seq.block_table.size()) ? seq.block_table[b] : 0;
      if (window) {
        m[o_wtables + s * max_blocks + b] = b < int64_t(seq.window_block_table.size())
                                                ? seq.window_block_table[b]
                                                : static_cast<int32_t>(num_window_blocks_);
      }
    }
    const bool last_piece = p.begin + p.count == int64_t(seq.tokens.size());
    for (int64_t i = 0; i < p.count; ++i, ++t) {
      const int64_t pos = seq.start_pos + p.begin + i;
      m[o_tokens + t] = seq.tokens[p.begin + i];
      m[o_pos + t] = static_cast<int32_t>(pos);
      m[o_slots + t] = static_cast<int32_t>(seq.block_table[pos / bs] * bs + pos % bs);
      if (window) {
        m[o_wslots + t] = static_cast<int32_t>(seq.window_block_table[pos / bs] * bs + pos % bs);
      }
      const bool every = seq.logits == LogitsMode::kAll || seq.logits == LogitsMode::kHiddenAll;
      const bool last = (seq.logits == LogitsMode::kLast ||
                         seq.logits == LogitsMode::kHiddenLast) &&
                        last_piece && i == p.count - 1;
      if (every || last) {
        m[o_rows + n_rows++] = static_cast<int32_t>(t);
        row_hidden_.push_back(engine::IsHidden(seq.logits));
        row_lora_.push_back(lora);
      }
    }
  }
  m[o_qstart + n_seqs] = static_cast<int32_t>(t);
  if (options_.tensor_parallel.size > 1) {  // this rank's rows of the embedding table
    for (int64_t i = 0; i < t; ++i) m[o_tokens + i] = int32_t(weights_->vocab.LocalId(m[o_tokens + i]));
  }

  // Each piece of a split embedding table looks tokens up by its own ids.
  const int64_t o_pieces =
      Align64(window ? o_wtables + n_seqs * max_blocks : o_tables + n_seqs * max_blocks);
  const std::vector<TablePiece>& pieces_of_table = weights_->embd_pieces;
  for (size_t p = 0; p < pieces_of_table.size(); ++p) {
    int32_t* ids = m + o_pieces + int64_t(p) * Align64(t);
    for (int64_t i = 0; i < t; ++i) ids[i] = int32_t(pieces_of_table[p].LocalId(m[o_tokens + i]));
  }

  const DevPtr base = meta_.ptr();
  int64_t end = pieces_of_table.empty()  // elements of host_meta_ in use
                    ? (window ? o_wtables + n_seqs * max_blocks : o_tables + n_seqs * max_blocks)
                    : o_pieces + int64_t(pieces_of_table.size()) * Align64(t);

  // The KV cache in pools: each run of one pool's sequences (pieces come in pool order) gets
  // the step's arrays of its own, block ids and slots made local to the pool.
  pool_runs_.clear();
  for (int64_t s0 = 0; s0 < n_seqs && pool_blocks_ < num_blocks_;) {
    KvPoolRun run;
    run.pool = PoolOf(*pieces[s0].seq);
    int64_t s1 = s0 + 1;
    while (s1 < n_seqs && PoolOf(*pieces[s1].seq) == run.pool) ++s1;
    run.n_seqs = s1 - s0;
    run.token_begin = m[o_qstart + s0];
    run.n_tokens = m[o_qstart + s1] - run.token_begin;
    const int64_t first_block = run.pool * pool_blocks_;
    const int64_t o_rslots = Align64(end), o_rqstart = Align64(o_rslots + run.n_tokens),
                  o_rlens = Align64(o_rqstart + run.n_seqs + 1),
                  o_rtables = Align64(o_rlens + run.n_seqs);
    end = o_rtables + run.n_seqs * max_blocks;
    PC_CHECK(end <= int64_t(host_meta_.size()));
    for (int64_t i = 0; i < run.n_tokens; ++i) {
      m[o_rslots + i] = int32_t(m[o_slots + run.token_begin + i] - first_block * bs);
    }
    for (int64_t j = 0; j <= run.n_seqs; ++j) {
      m[o_rqstart + j] = int32_t(m[o_qstart + s0 + j] - run.token_begin);
    }
    std::copy_n(m + o_lens + s0, run.n_seqs, m + o_rlens);
    for (int64_t j = 0; j < run.n_seqs * max_blocks; ++j) {
      // Entries past a sequence's own blocks are never read; they may name another pool's.
      const int64_t local = m[o_tables + s0 * max_blocks + j] - first_block;
      m[o_rtables + j] = local >= 0 && local < pool_blocks_ ? int32_t(local) : 0;
    }
    run.slots = base + o_rslots * 4;
    run.query_start = base + o_rqstart * 4;
    run.seq_lens = base + o_rlens * 4;
    run.block_tables = base + o_rtables * 4;
    pool_runs_.push_back(run);
    s0 = s1;
  }
  // The logits launches: max_logit_rows rows at a time over runs of rows of one kind, each with
  // the runs of one adapter among its rows.
  logits_launches_.clear();
  lora_rows_.clear();
  for (int64_t r = 0; r < n_rows;) {
    LogitsLaunch l{r, 1, row_hidden_[r]};
    while (l.rows < options_.max_logit_rows && r + l.rows < n_rows &&
           row_hidden_[r + l.rows] == l.hidden) {
      ++l.rows;
    }
    l.runs_begin = lora_rows_.size();
    for (int64_t i = 0; i < l.rows && !l.hidden; ++i) {
      const LoraSegment& row = row_lora_[size_t(r + i)];
      if (row.lora != nullptr)
        AppendLoraRun(&lora_rows_, l.runs_begin, {i, 1, row.lora, row.scale});
    }
    l.runs_end = lora_rows_.size();
    logits_launches_.push_back(l);
    r += l.rows;
  }
  // The runs grouped by adapter for LORA launches, their row lists copied with the rest.
  lora_token_groups_.clear();
  lora_row_groups_.clear();
  if (!LoraComposed()) {
    end += GroupLoraRuns(lora_tokens_, m + end, base + uint64_t(end) * 4, &lora_token_groups_);
    for (LogitsLaunch& l : logits_launches_) {
      l.groups_begin = lora_row_groups_.size();
      end += GroupLoraRuns(std::span(lora_rows_).subspan(l.runs_begin, l.runs_end - l.runs_begin),
                           m + end, base + uint64_t(end) * 4, &lora_row_groups_);
      l.groups_end = lora_row_groups_.size();
    }
    PC_CHECK(end <= int64_t(host_meta_.size()));
  }
  PC_RETURN_IF_ERROR(stream_->CopyH2D(base, host_meta_.data(), uint64_t(end) * 4));

  StepInputs in;
  in.n_tokens = n_tokens;
  in.n_seqs = n_seqs;
  in.tokens = base + o_tokens * 4;
  if (!pieces_of_table.empty()) {
    in.piece_tokens = base + o_pieces * 4;
    in.piece_tokens_stride = Align64(t);
  }
  in.positions = base + o_pos * 4;
  in.slots = base + o_slots * 4;
  in.query_start = base + o_qstart * 4;
  in.seq_lens = base + o_lens * 4;
  in.block_tables = base + o_tables * 4;
  if (window) {
    in.window_slots = base + o_wslots * 4;
    in.window_block_tables = base + o_wtables * 4;
  }
  in.max_blocks_per_seq = max_blocks;
  in.max_seq_len = max_len;
  in.lora = lora_tokens_;
  in.lora_groups = lora_token_groups_;
  in.lora_base = lora_base_.get();
  in.pool_runs = pool_runs_;
  PC_RETURN_IF_ERROR(transformer_->Layers(*stream_, in, buf_, kv_));

  // Logits (or hidden states), max_logit_rows at a time over runs of rows of one kind, copied
  // straight into the caller's vector.
  size_t out = logits->size();
  size_t out_floats = 0;
  for (bool hidden : row_hidden_) out_floats += hidden ? c.n_embd : c.n_vocab;
  logits->resize(out + out_floats);
  if (options_.pipeline.n_stages > 1 && !options_.pipeline.last()) {
    return stream_->Synchronize();  // only the last stage has the logits (these stay zero)
  }
  for (const LogitsLaunch& l : logits_launches_) {
    const DevPtr row_ids = base + (o_rows + l.first_row) * 4;
    if (l.hidden) {
      PC_RETURN_IF_ERROR(
          transformer_->FinalHidden(*stream_, buf_.x, n_tokens, row_ids, l.rows, h_));
      PC_RETURN_IF_ERROR(
          stream_->CopyD2H(logits->data() + out, h_, uint64_t(l.rows) * c.n_embd * 4));
      out += size_t(l.rows) * c.n_embd;
    } else {
      const LoraRuns lora{
          std::span(lora_rows_).subspan(l.runs_begin, l.runs_end - l.runs_begin), buf_.lora,
          nullptr,
          std::span(lora_row_groups_).subspan(l.groups_begin, l.groups_end - l.groups_begin)};
      PC_RETURN_IF_ERROR(
          transformer_->Logits(*stream_, buf_.x, n_tokens, row_ids, l.rows, h_, logits_, lora));
      PC_RETURN_IF_ERROR(CopyLogits(logits->data() + out, l.rows));
      out += size_t(l.rows) * c.n_vocab;
    }
  }
  // The host staging buffer and the logits must not be touched before the stream is done.
  return stream_->Synchronize();
}

Status TransformerRunner::CopyLogits(float* dst, int64_t rows) {
  const int64_t n_vocab = config_.n_vocab;
  const TensorParallel& tp = options_.tensor_parallel;
  if (tp.size == 1) return stream_->CopyD2H(dst, logits_, uint64_t(rows) * n_vocab * 4);
  // Every rank's [rows, vocab.rows] (its range, then zero rows), cut back to n_vocab columns.
  const int64_t width = weights_->vocab.rows;
  shard_logits_.resize(size_t(rows * width));
  gathered_logits_.resize(size_t(tp.size * rows * width));
  PC_RETURN_IF_ERROR(stream_->CopyD2H(shard_logits_.data(), logits_, uint64_t(rows) * width * 4));
  PC_RETURN_IF_ERROR(stream_->Synchronize());
  PC_RETURN_IF_ERROR(tp.all_gather(shard_logits_.data(), gathered_logits_.data(), rows * width));
  for (int32_t q = 0; q < tp.size; ++q) {
    const VocabShard v = ShardVocab(n_vocab, q, tp.size);
    const float* from = gathered_logits_.data() + size_t(q) * rows * width;
    for (int64_t i = 0; i < rows; ++i) {
      std::copy_n(from + i * width, v.count, dst + i * n_vocab + v.begin);
    }
  }
  return Status::Ok();
}

void TransformerRunner::RenderMetrics(std::string* out) const {
  runtime::AppendOpCounterMetrics({device_.get()}, out);
  if (options_.max_loras > 0) {
    // More uploads than distinct adapters served: --max-loras-per-batch is making them swap.
    *out += "# HELP polychip_lora_uploads_total LoRA adapters uploaded to the device (each "
            "evicted one uploaded again when needed).\n"
            "# TYPE polychip_lora_uploads_total counter\npolychip_lora_uploads_total " +
            std::to_string(lora_uploads_.load(std::memory_order_relaxed)) + "\n";
  }
  const runtime::OpFallback* fallback = device_->op_fallback();
  if (fallback == nullptr) return;
  *out +=
      "# HELP polychip_op_fallback_launches_total Op launches the device lacked, run on the "
      "fallback device.\n# TYPE polychip_op_fallback_launches_total counter\n";
  for (const auto& [op, count] : fallback->LaunchCounts()) {
    *out += "polychip_op_fallback_launches_total{op=\"" + op + "\",backend=\"" +
            device_->backend()->name() + "\",fallback=\"" +
            fallback->device().backend()->name() + "\"} " + std::to_string(count) + "\n";
  }
}

}  // namespace polychip::model
