// polychip SDK — reference (scalar, readable) kernels for every op of pc_ops.h.
//
// These define the semantics the conformance kit checks and give a new plugin correct results
// on day one. A plugin whose device memory is not host memory (the emu plugin) passes a
// DeviceMemory that translates device addresses into host pointers; a host-memory plugin passes
// IdentityMemory(). Every kernel translates each operand range before touching it, so a bad
// address becomes an error message, never a crash.
#pragma once

#include <cstdint>

#include "polychip/plugin/pc_ops.h"

namespace polychip::sdk {

// How a kernel reaches its operands.
struct DeviceMemory {
  void* ctx = nullptr;
  // Host pointer for [ptr, ptr + bytes), or nullptr when the range is not valid device memory.
  void* (*to_host)(void* ctx, pc_devptr_t ptr, uint64_t bytes) = nullptr;
  // When true, kernels translate their fixed-size operands and return without computing: a
  // plugin uses it to reject bad addresses at launch. (Ranges found through indices stored in
  // device memory, such as KV-cache slots, can only be checked while running.)
  bool validate_only = false;
};

// devptr == host pointer; rejects only null.
DeviceMemory IdentityMemory();

// Every kernel returns nullptr on success or a static message describing the first problem.
// One overload per op of pc_ops.def (RefLaunch finds it by the args type).
const char* RefKernel(const pc_embedding_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_rms_norm_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_matmul_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_rope_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_kv_store_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_attention_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_swiglu_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_add_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_convert_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_moe_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_geglu_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_scale_args_t& a, const DeviceMemory& mem);
const char* RefKernel(const pc_lora_args_t& a, const DeviceMemory& mem);

// The shape/dtype/layout checks of one op's args (not the addresses), one overload per op;
// ValidateOpArgs finds it by the args type. nullptr when valid.
const char* Validate(const pc_embedding_args_t& a);
const char* Validate(const pc_rms_norm_args_t& a);
const char* Validate(const pc_matmul_args_t& a);
const char* Validate(const pc_rope_args_t& a);
const char* Validate(const pc_kv_store_args_t& a);
const char* Validate(const pc_attention_args_t& a);
const char* Validate(const pc_swiglu_args_t& a);
const char* Validate(const pc_add_args_t& a);
const char* Validate(const pc_convert_args_t& a);
const char* Validate(const pc_moe_args_t& a);
const char* Validate(const pc_geglu_args_t& a);
const char* Validate(const pc_scale_args_t& a);
const char* Validate(const pc_lora_args_t& a);

// Byte size of an op's args struct as this SDK was compiled, 0 for an unknown op.
size_t OpArgsSize(pc_op_t op);
// The smallest struct_size a host of this ABI major may pass: the struct's first version
// (members appended since are absent from it). 0 for an unknown op.
size_t OpArgsMinSize(pc_op_t op);
// Checks struct_size and the shape/dtype/layout members (not the addresses). nullptr when
// valid. Only the GGUF layout is valid here: a plugin that reads its own layouts checks those.
const char* ValidateOpArgs(pc_op_t op, const void* args);
// ValidateOpArgs, then the matching Ref* kernel.
const char* RefLaunch(pc_op_t op, const void* args, const DeviceMemory& mem);
// True when the reference kernels implement the query (every op, every dtype they decode, the
// GGUF layout only).
bool RefSupports(const pc_op_query_t& query);

// The rotation angle of pair i at position p as pc_rope_args documents it (YaRN included),
// with cos/sin already scaled by the magnitude factor. Exposed for fast kernels and tests.
void RopeCosSin(const pc_rope_args_t& a, int32_t position, int64_t pair, float freq_factor,
                float* cos_theta, float* sin_theta);

// GELU with the tanh approximation, as pc_geglu_args documents it (the reference of fast
// kernels and tests).
float GeluTanh(float x);

// The V cache's dtype: v_cache_dtype (1.6), or cache_dtype in an older host's shorter struct.
pc_dtype_t KvStoreVDtype(const pc_kv_store_args_t& a);
pc_dtype_t AttentionVDtype(const pc_attention_args_t& a);

// ATTENTION's window (1.4; 0 = none, also when the caller's struct predates the member) and the
// first position a query at `position` sees.
int64_t AttentionWindow(const pc_attention_args_t& a);
int64_t AttentionFirstPosition(const pc_attention_args_t& a, int64_t position);

// MOE's routing for one token as pc_moe_args documents it: the n_used experts of largest
// softmax(logits[0..n_experts)) into experts[n_used] (by descending probability, ties to the
// lower index) and their weights into weights[n_used]. Exposed so that fast kernels route
// exactly as the reference does.
void MoeRoute(const float* logits, int64_t n_experts, int64_t n_used, bool norm_weights,
              int32_t* experts, float* weights);

// MOE's low-rank terms (1.7; absent from an older host's shorter struct). Projection 0 is gate,
// 1 up, 2 down; a term is present when its A and B are both set and its rank positive. rows and
// cols are the shape of one expert's matrix of that projection (A_e [rank, cols], B_e [rows,
// rank]), set whether or not the term is present.
struct MoeLowRank {
  pc_devptr_t a = 0, b = 0;
  int64_t rank = 0;
  float scale = 0;
  int64_t rows = 0, cols = 0;
  bool present() const { return a != 0 && b != 0 && rank > 0; }
};
MoeLowRank MoeLowRankOf(const pc_moe_args_t& a, int projection);
bool MoeHasLowRank(const pc_moe_args_t& a);
// The types MOE's low-rank A and B may have: F32, F16, BF16, Q8_0.
bool IsLowRankDtype(pc_dtype_t t);

}  // namespace polychip::sdk
