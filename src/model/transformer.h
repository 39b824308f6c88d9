// The decoder-only transformer shared by every architecture of archs.def: the forward pass of
// one step written as op launches. What differs between architectures is their RoPE mode and
// the structure flags of ModelConfig, which each architecture's file sets (arch.h), and the
// optional weights the file carries.
//
// Per step:   x = embedding(tokens)
//   per layer: xn = rms_norm(x) ; q,k,v = xn W^T (+ bias)
//              (qwen3: q,k = rms_norm per head) ; rope(q), rope(k)
//              kv_store(k, v) ; a = paged_attention(q) ; x += a Wo^T
//              xn = rms_norm(x) ; g = silu(xn Wg^T) * (xn Wu^T) ; x += g Wd^T
//              (qwen3moe: x += moe(xn, router logits xn Wr^T), the MOE op)
//   (gemma3: x = sqrt(n_embd) * embedding; the attention and feed-forward outputs RMS-normed
//    before each residual add; g = gelu(xn Wg^T) * (xn Wu^T); local layers attend within a
//    sliding window, with their own RoPE base)
//   logits:    h = rms_norm(gather(x, rows)) ; logits = h Wout^T (+ bias)
//   (embeddings: h itself)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_cache_dtypes.h"
#include "model/lora.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "util/status.h"

namespace polychip::model {

// Where the forward pass's work goes: a stream (StreamLauncher, the runner's), or op coverage's
// recorder, which runs the pass once without a device to learn what it launches
// (op_coverage.h). One Launch per op of the op list, and the collectives of tensor and
// pipeline parallelism (tensor_parallel.h), ordered with the launches.
class Launcher {
 public:
  virtual ~Launcher() = default;
#define PC_OP(NAME, name, Camel, ...) virtual Status Launch(const runtime::Camel##Args& args) = 0;
#include "polychip_op_list.def"  // include/polychip/plugin/pc_ops.def
#undef PC_OP
  virtual Status AllReduce(const TensorParallel& tp, runtime::DevPtr x, int64_t n_rows) = 0;
  virtual Status Send(const PipelineStage& pp, runtime::DevPtr x, int64_t n_rows) = 0;
  virtual Status Recv(const PipelineStage& pp, runtime::DevPtr x, int64_t n_rows) = 0;
  // out [out_floats] = fn(in [in_floats]) computed on the host, ordered with the launches: the
  // host waits for `in`. For what no op expresses (transformer.cc's routing over experts
  // split across allocations).
  using HostFn = std::function<void(const float* in, float* out)>;
  virtual Status HostCompute(runtime::DevPtr in, int64_t in_floats, runtime::DevPtr out,
                             int64_t out_floats, const HostFn& fn) = 0;
  // Whether a MOE launch with these members (its low-rank terms, ABI 1.7) can run here (on the
  // device or its op fallback); otherwise the caller computes it another way.
  virtual bool CanLaunch(const runtime::MoeArgs&) { return false; }
  // Whether the device itself runs this LORA launch (ABI 1.8); otherwise the caller launches
  // the ops it stands for.
  virtual bool RunsOnDevice(const runtime::LoraArgs&) { return false; }
};

// Launches on `stream`; the collectives call tp's and pp's hooks with it.
class StreamLauncher final : public Launcher {
 public:
  explicit StreamLauncher(runtime::Stream& stream) : stream_(stream) {}
#define PC_OP(NAME, name, Camel, ...)                                 \
  Status Launch(const runtime::Camel##Args& args) override {          \
    return runtime::Launch(stream_, args);                            \
  }
#include "polychip_op_list.def"
#undef PC_OP
  Status AllReduce(const TensorParallel& tp, runtime::DevPtr x, int64_t n_rows) override {
    return tp.all_reduce(stream_, x, n_rows);
  }
  Status Send(const PipelineStage& pp, runtime::DevPtr x, int64_t n_rows) override {
    return pp.send(stream_, x, n_rows);
  }
  Status Recv(const PipelineStage& pp, runtime::DevPtr x, int64_t n_rows) override {
    return pp.recv(stream_, x, n_rows);
  }
  Status HostCompute(runtime::DevPtr in, int64_t in_floats, runtime::DevPtr out,
                     int64_t out_floats, const HostFn& fn) override;
  bool CanLaunch(const runtime::MoeArgs& args) override {
    return runtime::CanLaunch(stream_.device(), args);
  }
  bool RunsOnDevice(const runtime::LoraArgs& args) override {
    return runtime::RunsOnDevice(stream_.device(), args);
  }

 private:
  runtime::Stream& stream_;
};

// The paged KV cache: per layer one K and one V buffer of
// [n_blocks, block_size, n_head_kv, head_dim] elements of `dtype`, or, where that is more than
// the device allocates at once, one per pool of blocks (a sequence's blocks all in one pool:
// engine::ModelRunner::kv_blocks_per_pool). With a window pool (`window_pool`), the sliding
// layers' buffers have that pool's blocks (in one buffer) and their steps use StepInputs'
// window_slots and window_block_tables.
struct KvCacheView {
  std::vector<std::vector<runtime::DevPtr>> k, v;  // [n_layer][n_pools]
  KvCacheDtypes dtypes;  // K's and V's element types
  int64_t block_size = 16;
  bool window_pool = false;
};

// A run of a step's sequences whose KV blocks are all in pool `pool` (KvCacheView): its
// tokens [token_begin, token_begin + n_tokens), with index arrays of its own on the device
// (block ids and slots within the pool, query_start from 0).
struct KvPoolRun {
  int64_t pool = 0;
  int64_t token_begin = 0;
  int64_t n_tokens = 0;
  int64_t n_seqs = 0;
  runtime::DevPtr slots = 0;         // [n_tokens]
  runtime::DevPtr query_start = 0;   // [n_seqs + 1]
  runtime::DevPtr seq_lens = 0;      // [n_seqs]
  runtime::DevPtr block_tables = 0;  // [n_seqs, max_blocks_per_seq]
};

// Index arrays of one step, already on the device (all int32).
struct StepInputs {
  int64_t n_tokens = 0;
  int64_t n_seqs = 0;
  runtime::DevPtr tokens = 0;        // [n_tokens]
  // An embedding table split by rows (ModelWeights::embd_pieces): per piece, each token's
  // TablePiece::LocalId, [n_pieces, piece_tokens_stride] (elements); else 0.
  runtime::DevPtr piece_tokens = 0;
  int64_t piece_tokens_stride = 0;
  runtime::DevPtr positions = 0;     // [n_tokens]
  runtime::DevPtr slots = 0;         // [n_tokens] KV slot of each token
  runtime::DevPtr query_start = 0;   // [n_seqs + 1]
  runtime::DevPtr seq_lens = 0;      // [n_seqs]
  runtime::DevPtr block_tables = 0;  // [n_seqs, max_blocks_per_seq]
  // The same for the sliding layers' window pool (KvCacheView::window_pool).
  runtime::DevPtr window_slots = 0;
  runtime::DevPtr window_block_tables = 0;
  int64_t max_blocks_per_seq = 0;
  int64_t max_seq_len = 0;
  // With the KV cache in several pools: the step's runs of sequences of one pool, which
  // KV_STORE and ATTENTION of the layers on those pools take one at a time (the window pool's
  // layers take the whole step with the arrays above). Empty: one pool, the arrays above.
  std::span<const KvPoolRun> pool_runs;
  // LoRA adapters (lora.h) over runs of the step's tokens; empty: the base model only. The
  // same runs grouped by adapter for LORA launches (empty: the runs launch MATMUL, SCALE,
  // MATMUL each).
  std::span<const LoraSegment> lora;
  std::span<const LoraGroup> lora_groups;
  // The base model's file, for the experts of an adapter that adapts them (computed on the
  // host from the file's weights); null when no adapter of the step does.
  const GgufFile* lora_base = nullptr;
};

// F32 activation buffers, sized for at least n_tokens rows.
struct StepBuffers {
  runtime::DevPtr x = 0;     // [n_tokens, n_embd] residual stream
  runtime::DevPtr xn = 0;    // [n_tokens, n_embd] normed
  runtime::DevPtr q = 0;     // [n_tokens, n_head, head_dim]
  runtime::DevPtr k = 0;     // [n_tokens, n_head_kv, head_dim]
  runtime::DevPtr v = 0;     // [n_tokens, n_head_kv, head_dim]
  runtime::DevPtr attn = 0;  // [n_tokens, n_head, head_dim]
  runtime::DevPtr gate = 0;  // [n_tokens, n_ff]
  runtime::DevPtr up = 0;    // [n_tokens, n_ff]
  runtime::DevPtr lora = 0;  // [n_tokens, max LoRA rank]: x A^T (with adapters only)
};

// The adapters of a launch: runs of its rows, the scratch for x A^T, and the runs grouped by
// adapter for LORA (StepInputs::lora_groups).
struct LoraRuns {
  std::span<const LoraSegment> segments;
  runtime::DevPtr scratch = 0;
  const GgufFile* base = nullptr;  // StepInputs::lora_base
  std::span<const LoraGroup> groups;
};

class Transformer {
 public:
  // Unimplemented for configurations the ops cannot express (e.g. head_dim_v != head_dim).
  static StatusOr<Transformer> Create(const ModelConfig& config, const ModelWeights& weights);

  // Embedding and every layer: leaves the hidden states [n_tokens, n_embd] in buffers.x and
  // the new tokens' K/V in the cache.
  Status Layers(Launcher& ops, const StepInputs& in, const StepBuffers& buf,
                const KvCacheView& kv) const;

  // h [n_rows, n_embd] = output_norm(the rows `row_ids` (int32 [n_rows]) of x [n_tokens,
  // n_embd]): the final hidden states, what embeddings are pooled from.
  Status FinalHidden(Launcher& ops, runtime::DevPtr x, int64_t n_tokens, runtime::DevPtr row_ids,
                     int64_t n_rows, runtime::DevPtr h) const;
  // logits [n_rows, n_vocab] of the rows `row_ids` (int32 [n_rows]) of x [n_tokens, n_embd];
  // h is scratch [n_rows, n_embd] (left holding FinalHidden). `lora`: adapters over runs of
  // the n_rows rows (and their groups), their x A^T in its scratch [n_rows, max rank].
  Status Logits(Launcher& ops, runtime::DevPtr x, int64_t n_tokens, runtime::DevPtr row_ids,
                int64_t n_rows, runtime::DevPtr h, runtime::DevPtr logits,
                const LoraRuns& lora = {}) const;

  // The same on a stream.
  Status Layers(runtime::Stream& stream, const StepInputs& in, const StepBuffers& buf,
                const KvCacheView& kv) const {
    StreamLauncher ops(stream);
    return Layers(ops, in, buf, kv);
  }
  Status FinalHidden(runtime::Stream& stream, runtime::DevPtr x, int64_t n_tokens,
                     runtime::DevPtr row_ids, int64_t n_rows, runtime::DevPtr h) const {
    StreamLauncher ops(stream);
    return FinalHidden(ops, x, n_tokens, row_ids, n_rows, h);
  }
  Status Logits(runtime::Stream& stream, runtime::DevPtr x, int64_t n_tokens,
                runtime::DevPtr row_ids, int64_t n_rows, runtime::DevPtr h, runtime::DevPtr logits,
                const LoraRuns& lora = {}) const {
    StreamLauncher ops(stream);
    return Logits(ops, x, n_tokens, row_ids, n_rows, h, logits, lora);
  }

  // Tensor parallel (tensor_parallel.h): the weights are this rank's shard, and the partial
  // results of the two down projections of each layer are all-reduced, as are the embeddings
  // (StepInputs::tokens then hold VocabShard::LocalId of each token, and Logits gives this
  // rank's [n_rows, vocab.rows] logits). `tp` must outlive this.
  void SetTensorParallel(const TensorParallel* tp) { tp_ = tp; }
  // Pipeline parallel: this transformer runs one stage's layers (tensor_parallel.h).
  void SetPipeline(const PipelineStage* pp) { pp_ = pp; }

 private:
  Transformer(const ModelConfig& config, const ModelWeights& weights, runtime::RopeMode rope_mode)
      : c_(&config), w_(&weights), rope_mode_(rope_mode) {}
  // out [m, w.rows] (+)= x [m, w.cols] W^T (+ bias), plus each segment's adapter of matrix
  // `slot` (lora.h) over its rows: out += s (x A^T) B^T.
  Status Matmul(Launcher& ops, runtime::DevPtr x, const MatrixRef& w, runtime::DevPtr bias,
                runtime::DevPtr out, int64_t m, bool accumulate, const LoraRuns& lora = {},
                int32_t slot = -1) const;
  // The adapters' terms of Matmul: one LORA per group where the device runs it, else MATMUL,
  // SCALE, MATMUL per run (ComposeLora).
  Status ApplyLora(Launcher& ops, runtime::DevPtr x, const MatrixRef& w, runtime::DevPtr out,
                   int64_t m, const LoraRuns& lora, int32_t slot) const;
  Status ComposeLora(Launcher& ops, runtime::DevPtr x, const MatrixRef& w, runtime::DevPtr out,
                     const LoraSegment& seg, runtime::DevPtr scratch, int32_t slot) const;
  // `sliding`: a local layer of interleaved sliding-window attention (its own RoPE base).
  Status Rope(Launcher& ops, runtime::DevPtr x, runtime::DevPtr positions, int64_t n_tokens,
              int64_t n_heads, bool sliding) const;
  // RMSNorm of every head of x [n_tokens, n_heads, head_dim] in place, by `weight` [head_dim].
  Status HeadNorm(Launcher& ops, runtime::DevPtr x, runtime::DevPtr weight, int64_t n_tokens,
                  int64_t n_heads) const;
  // x += the routed experts of b.xn (n_expert > 0): the router's matmul into b.gate, then MOE
  // (the rows of an adapter of the experts with its low-rank terms, one launch per run of
  // rows, or on the host where the device cannot).
  Status Experts(Launcher& ops, const LayerWeights& L, const StepBuffers& b,
                 int64_t n_tokens, const LoraRuns& lora, int64_t layer) const;
  // MOE's args for rows [begin, begin + rows): x += the experts of b.xn routed by b.gate.
  runtime::MoeArgs MoeOf(const LayerWeights& L, const StepBuffers& b, int64_t begin,
                         int64_t rows) const;
  // x += MOE of b.xn routed by the logits in b.gate, over every row.
  Status DeviceExperts(Launcher& ops, const LayerWeights& L, const StepBuffers& b,
                       int64_t n_tokens) const;
  // x += post_norm(all_reduce(in W^T + bias)): the all-reduce over the tensor-parallel ranks,
  // the RMSNorm by post_norm [n_embd] only where it is not 0 (gemma3); scratch [m, n_embd].
  Status Residual(Launcher& ops, runtime::DevPtr in, const MatrixRef& w, runtime::DevPtr bias,
                  runtime::DevPtr post_norm, runtime::DevPtr scratch, runtime::DevPtr x,
                  int64_t m, const LoraRuns& lora, int32_t slot) const;

  const ModelConfig* c_;
  const ModelWeights* w_;
  runtime::RopeMode rope_mode_;
  const TensorParallel* tp_ = nullptr;
  const PipelineStage* pp_ = nullptr;
};

}  // namespace polychip::model
