// Plain reference implementations of every op of the plugin ABI, for the conformance kit.
//
// Deliberately naive: simple loops, double accumulation, no SIMD, no blocking, no shortcuts, so
// that a reader can check each against the op's definition in pc_ops.h line by line. Inputs and
// outputs are float vectors; quantized weights are dequantized by the caller first. Nothing here
// knows about plugins or devices.
#pragma once

#include <cstdint>
#include <vector>

namespace polychip::runtime::conformance::ref {

// Rounding of F32 values to half and bfloat16 (round to nearest even), written here rather than
// taken from the SDK so the kit does not test plugins against the code they may share.
uint16_t F32ToF16(float f);
float F16ToF32(uint16_t h);
uint16_t F32ToBf16(float f);
float Bf16ToF32(uint16_t b);

// out[i, :] = table[ids[i], :]
// table: [n_rows, row_len] (already dequantized); returns [n_ids, row_len]
std::vector<float> Embedding(const std::vector<float>& table, int64_t row_len,
                             const std::vector<int32_t>& ids);

// x: [n_rows, dim]; weight: [dim] or empty for no scaling; returns [n_rows, dim]
std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& weight,
                           int64_t n_rows, int64_t dim, float eps);

// out[i, j] = sum_k x[i, k] * w[j, k] + bias[j] (+ out[i, j] if accumulate).
// x: [m, x_stride] (first k used); w: [n, k]; bias: [n] or empty;
// out: [m, out_stride], updated in place (columns >= n untouched).
void Matmul(const std::vector<float>& x, int64_t x_stride, const std::vector<float>& w,
            const std::vector<float>& bias, int64_t m, int64_t n, int64_t k, bool accumulate,
            std::vector<float>& out, int64_t out_stride);

// out[rows[i], :] += scale (x[rows[i], :] A^T) B^T for each listed row (LORA): x [m, k], a
// [rank, k], b [n, rank], out [m, n] updated in place.
void Lora(const std::vector<float>& x, const std::vector<float>& a, const std::vector<float>& b,
          const std::vector<int32_t>& rows, int64_t k, int64_t n, int64_t rank, float scale,
          std::vector<float>& out);

struct RopeParams {
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int32_t n_rot = 0;
  bool neox = false;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int32_t n_ctx_orig = 0;
};
// x: [n_tokens, n_heads, head_dim], rotated in place; positions: [n_tokens];
// freq_factors: [n_rot / 2] or empty.
void Rope(std::vector<float>& x, const std::vector<int32_t>& positions,
          const std::vector<float>& freq_factors, const RopeParams& p);

// Paged attention, causal, GQA. Caches hold float values already rounded to the cache dtype.
// q: [n_tokens, n_heads, head_dim]; k_cache/v_cache: [n_blocks, block_size, n_kv_heads,
// head_dim]; query_start: [n_seqs + 1]; seq_lens: [n_seqs]; block_tables: [n_seqs,
// max_blocks_per_seq]. Returns [n_tokens, n_heads, head_dim].
struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t max_blocks_per_seq = 0;
  float scale = 1.0f;
  int64_t window = 0;  // > 0: a query sees the last `window` positions up to its own
};
std::vector<float> Attention(const std::vector<float>& q, const std::vector<float>& k_cache,
                             const std::vector<float>& v_cache,
                             const std::vector<int32_t>& query_start,
                             const std::vector<int32_t>& seq_lens,
                             const std::vector<int32_t>& block_tables, const AttentionShape& s);

// out[i] = gate[i] * sigmoid(gate[i]) * up[i]
std::vector<float> Swiglu(const std::vector<float>& gate, const std::vector<float>& up);
// out[i] = gelu_tanh(gate[i]) * up[i] (pc_geglu_args_t's formula, in double)
std::vector<float> Geglu(const std::vector<float>& gate, const std::vector<float>& up);
// out[i] = a[i] + b[i]
std::vector<float> Add(const std::vector<float>& a, const std::vector<float>& b);

// The routed experts of MOE (pc_moe_args_t): per token, the n_used experts of largest
// softmax(logits) (ties to the lower index), weights renormalised to sum 1 when norm_weights
// (the sum clamped below at 2^-14), out[t] (+)= sum_e w_e down_e(silu(gate_e x) * up_e x).
// x: [n_tokens, n_embd]; logits: [n_tokens, n_experts]; gate, up: [n_experts * n_ff, n_embd];
// down: [n_experts * n_embd, n_ff] (already dequantized); out: [n_tokens, n_embd] in place.
struct MoeShape {
  int64_t n_tokens = 0, n_embd = 0, n_ff = 0, n_experts = 0, n_used = 0;
  bool norm_weights = true;
  bool accumulate = false;
};
// (1.7) Per-expert low-rank terms of gate, up, down (index 0, 1, 2; an empty a: none): A
// [n_experts * rank, cols] and B [n_experts * rows, rank] (dequantized), each chosen expert's
// matrix acting as W_e + scale B_e A_e.
struct MoeLowRank {
  std::vector<float> a[3], b[3];
  int64_t rank[3] = {0, 0, 0};
  float scale[3] = {0, 0, 0};
};
void Moe(const std::vector<float>& x, const std::vector<float>& logits,
         const std::vector<float>& gate, const std::vector<float>& up,
         const std::vector<float>& down, const MoeShape& s, std::vector<float>& out,
         const MoeLowRank* low = nullptr);

}  // namespace polychip::runtime::conformance::ref
