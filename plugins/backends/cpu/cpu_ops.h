// The cpu plugin's fast ops: matmul (packed quantized weights, float weights, any GGUF type),
// paged attention, rope, rms_norm, swiglu, the routed experts (moe) and LoRA terms (lora), parallel on the plugin's thread pool through the
// selected kernel table, and embedding from packed tables. Other ops use the SDK reference
// kernels. Arguments are validated by the caller; each function returns nullptr on success or
// a static message.
#pragma once

#include "kernels.h"
#include "streams_tuner.h"
#include "polychip/plugin/pc_ops.h"
#include "thread_pool.h"

namespace polychip::cpu {

struct OpContext {
  ThreadPool* pool;
  const KernelTable* k;
  // Weight streams per thread of a decode matmul (KernelTable::gemm_packed_streams; 1: one
  // sequential read per task) where there is no tuner: the plugin parameter weight_streams
  // set to a number. Which count is best depends on the host (three on the Zen 5 VMs, one on a
  // Zen 4: docs/performance.md "Decode weight streams"), hence the tuner by default.
  int weight_streams = 3;
  // When set (the plugin's default, weight_streams=auto), decode matmuls take their streams and
  // prefetching from the tuner, which measures them, instead of weight_streams and
  // weight_prefetch.
  StreamsTuner* streams_tuner = nullptr;
  // Whether decode's streams kernel prefetches in software (plugin parameter weight_prefetch).
  bool weight_prefetch = true;
};

const char* Matmul(const OpContext& c, const pc_matmul_args_t& a);
const char* Attention(const OpContext& c, const pc_attention_args_t& a);
const char* Rope(const OpContext& c, const pc_rope_args_t& a);
const char* KvStore(const OpContext& c, const pc_kv_store_args_t& a);
const char* RmsNorm(const OpContext& c, const pc_rms_norm_args_t& a);
const char* Swiglu(const OpContext& c, const pc_swiglu_args_t& a);
const char* Geglu(const OpContext& c, const pc_geglu_args_t& a);
// MOE, each weight in any of the plugin's layouts (moe.cc); a.*_layout are not validated here.
const char* Moe(const OpContext& c, const pc_moe_args_t& a);
// LORA, A and B each in any of the plugin's layouts (lora.cc); a.*_layout are not validated
// here.
const char* Lora(const OpContext& c, const pc_lora_args_t& a);
// Whether Lora(c, a) succeeds on the calling thread alone, using no pool (a decode step's
// launches of a small adapter): the plugin may then run it on a worker beside the next ones.
bool LoraRunsAlone(const OpContext& c, const pc_lora_args_t& a);
// EMBEDDING whose table is in one of the plugin's layouts (kLayoutPacked or kLayoutPanel;
// a.table_layout is ignored), embedding.cc; GGUF tables use the SDK's.
const char* EmbeddingPacked(const pc_embedding_args_t& a, uint32_t layout);

// Repacks a GGUF [n, k] matrix of a packable dtype into dst (PackedBytes long), in parallel.
void PackParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n, int64_t k,
                  void* dst);
// Rearranges a GGUF [n, k] float matrix (F16/BF16/F32) into panels (PanelBytes long), in
// parallel.
void PackPanelsParallel(const OpContext& c, pc_dtype_t dtype, const void* src, int64_t n,
                        int64_t k, void* dst);

}  // namespace polychip::cpu
