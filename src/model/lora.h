// LoRA adapters in GGUF, as llama.cpp's convert_lora_to_gguf.py writes them: general.type =
// "adapter", adapter.type = "lora", adapter.lora.alpha, and for each adapted matrix W [n, k]
// of the base a pair `<W's name>.lora_a` [rank, k] and `<W's name>.lora_b` [n, rank] (GGUF
// dims {k, rank} and {rank, n}), in F32, F16, BF16 or Q8_0. The adapted matrix is
//   W' = W + s B A,   s = scale * alpha / rank (scale when alpha is 0),
// so a matmul through W' is y = x W^T + s (x A^T) B^T, launched by the transformer after the
// base matrix's (transformer.h): one LORA per adapter of the launch (ABI 1.8) over its rows,
// or, on a device without it, two thin MATMULs and a SCALE per run of rows of one adapter.
//
// This file: the adapter as read and checked against its base (LoraAdapter), the registry of a
// server's adapters (LoraRegistry), the adapters resident on a device (LoraCache, the runner's),
// and the tools: a random adapter for a base (SynthesizeLora) and the merge into the base
// (MergeLora).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/model_runner.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/tensor_parallel.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "util/status.h"

namespace polychip::model {

// The matrices an adapter may adapt, each layer's then the output: slot = layer * kLoraKinds +
// kind, the output's n_layer * kLoraKinds. The experts' 3-D tensors (ffn_*_exps: A
// [n_expert, rank, k], B [n_expert, n, rank], one pair per expert) are MOE's low-rank terms
// (ABI 1.7, DeviceLora::ExpertTerms), or applied on the host where the device cannot
// (transformer.cc, Experts). The embedding table is not adaptable here (an adapter holding it
// is refused, naming the tensor).
enum LoraKind : int32_t {
  kLoraQ, kLoraK, kLoraV, kLoraQkv, kLoraO, kLoraGate, kLoraUp, kLoraDown, kLoraRouter,
  kLoraGateExps, kLoraUpExps, kLoraDownExps,
  kLoraKinds
};
inline bool IsExpertsKind(int32_t kind) { return kind >= kLoraGateExps && kind <= kLoraDownExps; }
inline int32_t LoraSlot(int64_t layer, LoraKind kind) {
  return static_cast<int32_t>(layer * kLoraKinds + kind);
}
inline int32_t LoraOutputSlot(int64_t n_layer) { return static_cast<int32_t>(n_layer * kLoraKinds); }
// The slot of a base tensor's name ("blk.3.attn_q.weight", "output.weight"), or -1.
int32_t LoraSlotOfTensor(const std::string& name, int64_t n_layer);

// One adapted matrix: A [rank, k] and B [n, rank] in the file.
struct LoraPair {
  std::string base;  // the base tensor's name
  int32_t slot = -1;
  const GgufTensor* a = nullptr;
  const GgufTensor* b = nullptr;
  int64_t rank = 0;
};

// An adapter file, opened (mapped) and checked against a base model's configuration. Immutable
// once opened; shared by the registry, the requests using it and the runner's device cache.
class LoraAdapter : public engine::Adapter, public std::enable_shared_from_this<LoraAdapter> {
 public:
  // Fails naming the first mismatch: not an adapter, another architecture, a tensor the base
  // does not have (or that cannot be adapted), a shape that does not fit, a missing half.
  static StatusOr<std::shared_ptr<LoraAdapter>> Open(const std::string& path,
                                                     const ModelConfig& base);
  // The same adapter opened by another rank of a parallel job (src/dist), under the id, name
  // and scale rank 0's registry gave it, so that both runners' device caches key it alike.
  static StatusOr<std::shared_ptr<const LoraAdapter>> OpenReplica(const std::string& path,
                                                                  const ModelConfig& base,
                                                                  int64_t id, std::string name,
                                                                  float default_scale);

  int64_t id() const override { return id_; }
  const std::string& name() const override { return name_; }
  const std::string& path() const { return path_; }
  float alpha() const { return alpha_; }
  float default_scale() const { return default_scale_; }
  int64_t max_rank() const { return max_rank_; }
  const std::vector<LoraPair>& pairs() const { return pairs_; }
  // The pair adapting `slot`, or null.
  const LoraPair* Find(int32_t slot) const;
  // Whether it adapts the experts of `layer` (MOE's low-rank terms, or the host path).
  bool AdaptsExperts(int64_t layer) const {
    for (int32_t k = kLoraGateExps; k <= kLoraDownExps; ++k) {
      if (Find(LoraSlot(layer, static_cast<LoraKind>(k))) != nullptr) return true;
    }
    return false;
  }
  const GgufFile& file() const { return *file_; }
  // The factor s of W + s B A for a matrix of `rank` at the user's `scale`.
  float Factor(int64_t rank, float scale) const {
    return alpha_ != 0 ? scale * alpha_ / static_cast<float>(rank) : scale;
  }

 private:
  friend class LoraRegistry;
  LoraAdapter() = default;
  int64_t id_ = 0;
  std::string name_, path_;
  float alpha_ = 0;
  float default_scale_ = 1;
  int64_t max_rank_ = 0;
  std::unique_ptr<GgufFile> file_;
  std::vector<LoraPair> pairs_;
};

// `NAME=PATH[:SCALE]` (the --lora flag): a name of letters, digits and -_./, the scale a
// number (default 1).
struct LoraSpec {
  std::string name, path;
  float scale = 1;
};
StatusOr<LoraSpec> ParseLoraSpec(const std::string& text);

// A server's adapters by name. Thread-safe: HTTP threads load and unload while requests hold
// what they resolved (an unloaded adapter lives on until its last request ends). Ids are never
// reused, so the prefix cache and the runner's device cache cannot confuse two loads.
class LoraRegistry {
 public:
  explicit LoraRegistry(ModelConfig base) : base_(std::move(base)) {}
  StatusOr<std::shared_ptr<const LoraAdapter>> Load(const LoraSpec& spec);
  Status Unload(const std::string& name);  // NOT_FOUND when no such adapter
  std::shared_ptr<const LoraAdapter> Find(const std::string& name) const;
  // Also accepts a path of a loaded adapter (SGLang's lora_path may be either).
  std::shared_ptr<const LoraAdapter> FindByNameOrPath(const std::string& key) const;
  std::vector<std::shared_ptr<const LoraAdapter>> List() const;  // in load order

 private:
  ModelConfig base_;
  mutable std::mutex mu_;
  int64_t next_id_ = 1;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
};

// One adapter's matrices on a device, by slot: A [rank, k], B [n, rank] as MATMUL weights.
struct DeviceLora {
  struct Matrix {
    MatrixRef a, b;
    int64_t rank = 0;
  };
  // A layer's expert pairs (ffn_{gate,up,down}_exps, index 0, 1, 2) as MOE's low-rank terms
  // (ABI 1.7, pc_moe_args_t): the stacked A [n_expert * rank, k] and B [n_expert * n, rank] of
  // the file as they are (GGUF layout, plain buffers: MOE reads them unrepacked), A's of one
  // type and B's of one type. A 0 address: that matrix is not adapted.
  struct ExpertTerms {
    runtime::DevPtr a[3] = {0, 0, 0}, b[3] = {0, 0, 0};
    int64_t rank[3] = {0, 0, 0};
    DType a_dtype = DType::kF32, b_dtype = DType::kF32;
  };
  std::shared_ptr<const LoraAdapter> adapter;
  std::vector<Matrix> by_slot;  // rank 0: not adapted
  // By layer; absent (nullptr) where the layer's experts are not adapted, or their pairs could
  // not be uploaded as terms (types that differ between the three, forced to the host by
  // POLYCHIP_LORA_HOST_EXPERTS=1): those run on the host.
  std::vector<std::unique_ptr<ExpertTerms>> experts;
  std::vector<std::unique_ptr<runtime::DeviceWeight>> weights;
  std::vector<std::unique_ptr<runtime::DeviceBuffer>> buffers;
  uint64_t bytes = 0;
  const Matrix* Find(int32_t slot) const {
    return slot >= 0 && slot < int32_t(by_slot.size()) && by_slot[slot].rank > 0 ? &by_slot[slot]
                                                                                  : nullptr;
  }
  const ExpertTerms* FindExperts(int64_t layer) const {
    return layer >= 0 && layer < int64_t(experts.size()) ? experts[size_t(layer)].get() : nullptr;
  }
};

// POLYCHIP_LORA_HOST_EXPERTS=1: adapters of experts run on the host (transformer.cc's
// HostAdaptedExperts) even where the device's MOE takes low-rank terms; tests compare the two.
bool LoraExpertsForcedToHost();

// The part of the model a runner holds, which its adapters' matrices follow: layers
// [layer_begin, layer_end) (pipeline), the output matrix only on the last stage, and under
// tensor parallelism its share of each matrix, cut as model_loader.cc cuts the base
// (tensor_parallel.h). A column-parallel base (Wq/Wk/Wv, Wgate/Wup: this rank's rows) keeps
// A whole and takes its rows of B; a row-parallel one (Wo, Wdown: this rank's columns, the
// partial sums all-reduced after) takes A's same columns and keeps B whole, so the ranks'
// low-rank terms add up to the whole one in the same all-reduce; the output matrix takes B's
// rows of the vocabulary shard, then zero rows as the base's shard has.
struct LoraShard {
  int64_t layer_begin = 0, layer_end = 0;
  bool output = true;
  int32_t tp_rank = 0, tp_size = 1;
  VocabShard vocab;  // tp_size > 1 only
};

// Uploads an adapter's matrices (F16 and F32 as they are, Q8_0 where the device multiplies it,
// anything else as F32; a column cut of a quantized A as F32) and its expert pairs as MOE's
// low-rank terms (as they are; the transformer asks the device whether it takes them at
// launch). `config` is the runner's (its tensor-parallel share).
StatusOr<std::unique_ptr<DeviceLora>> UploadLora(std::shared_ptr<const LoraAdapter> adapter,
                                                 const ModelConfig& config,
                                                 const std::shared_ptr<runtime::Device>& device,
                                                 const LoraShard& shard);

// A run of consecutive rows of a step that one adapter applies to, at factor scale.
struct LoraSegment {
  int64_t begin = 0, rows = 0;
  const DeviceLora* lora = nullptr;
  float scale = 1;  // the user's scale (times alpha / rank per matrix)
};

// Every row of a launch (a step's tokens, a logits launch's rows) that one adapter applies to
// at one scale, wherever they lie: one LORA launch per adapted matrix (ABI 1.8) for all of
// them, where the runs would take three launches each (a batch whose sequences take turns
// among adapters has a run per row). `rows`: int32 [n_rows] on the device, or 0 for the rows
// [begin, begin + n_rows) of a group that is one run.
struct LoraGroup {
  const DeviceLora* lora = nullptr;
  float scale = 1;
  int64_t begin = 0, n_rows = 0;
  runtime::DevPtr rows = 0;
};

// Appends to `groups` the runs' (adapter, scale) pairs, in the order of their first runs. The
// rows of a group of several runs are written to `list` (room for all the runs' rows), which
// the caller copies to the device at `list_on_device`; returns how many were written.
int64_t GroupLoraRuns(std::span<const LoraSegment> runs, int32_t* list,
                      runtime::DevPtr list_on_device, std::vector<LoraGroup>* groups);

// POLYCHIP_LORA_COMPOSED=1: adapters run as MATMUL, SCALE, MATMUL per run of rows even where
// the device has LORA (read at each step); tests and bench/lora.sh compare the two.
bool LoraComposed();

// The adapters resident on one device: at most `capacity`, the least recently used out.
class LoraCache {
 public:
  LoraCache(std::shared_ptr<runtime::Device> device, int64_t capacity)
      : device_(std::move(device)), capacity_(capacity) {}
  // Makes every adapter of `wanted` resident (evicting the least recently used others);
  // RESOURCE_EXHAUSTED when they are more than the capacity. Call between steps.
  Status Prepare(const std::vector<std::shared_ptr<const LoraAdapter>>& wanted,
                 const ModelConfig& config, const LoraShard& shard);
  const DeviceLora* Get(int64_t id) const;
  int64_t max_rank() const { return max_rank_; }
  int64_t uploads() const { return uploads_; }

 private:
  std::shared_ptr<runtime::Device> device_;
  int64_t capacity_;
  std::list<std::unique_ptr<DeviceLora>> resident_;  // most recently used first
  int64_t max_rank_ = 0;
  int64_t uploads_ = 0;
};

// ---- tools ----

struct LoraSynthOptions {
  int64_t rank = 8;
  float alpha = 16;
  DType type = DType::kF16;  // F32, F16, BF16 or Q8_0
  // Which matrices: "attn" (q, k, v, output / qkv), "ffn" (gate, up, down; the router of a
  // mixture of experts), "experts" (a mixture of experts' ffn_{gate,up,down}_exps), "output"
  // (untied output only).
  std::vector<std::string> targets = {"attn", "ffn", "output"};
  uint64_t seed = 7;
  float std = 0.05f;  // A and B ~ N(0, std)
};
// Writes a random adapter for the base model `base` to `out`.
Status SynthesizeLora(const GgufFile& base, const LoraSynthOptions& opts, const std::string& out);

// Writes `base` with `scale` times the adapter merged into its matrices (W + s B A) to `out`;
// each adapted matrix keeps its type (re-quantized when quantized).
Status MergeLora(const std::string& base_path, const std::string& adapter_path, float scale,
                 const std::string& out);

}  // namespace polychip::model
