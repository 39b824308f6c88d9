// polychip SDK — reference kernels. Plain loops, float accumulation, one function per op.
#include "polychip/sdk/ref_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "polychip/sdk/op_list.h"
#include "polychip/sdk/quant.h"

namespace polychip::sdk {
namespace {

void* IdentityToHost(void*, pc_devptr_t ptr, uint64_t) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
}

template <typename T>
T* Map(const DeviceMemory& mem, pc_devptr_t ptr, uint64_t bytes) {
  if (ptr == 0) return nullptr;
  return static_cast<T*>(mem.to_host(mem.ctx, ptr, bytes));
}

// The KV cache types (pc_ops.h): floats, and (1.6) block types quantizing each head's row.
bool IsCacheDtype(pc_dtype_t t) {
  return t == PC_DTYPE_F32 || t == PC_DTYPE_F16 || t == PC_DTYPE_BF16 || t == PC_DTYPE_Q8_0 ||
         t == PC_DTYPE_Q4_0 || t == PC_DTYPE_FP8_E4M3;
}
bool IsFloatType(pc_dtype_t t) {
  return t == PC_DTYPE_F32 || t == PC_DTYPE_F16 || t == PC_DTYPE_BF16;
}

constexpr const char* kBadAddress = "operand address is not valid device memory";

}  // namespace

DeviceMemory IdentityMemory() {
  DeviceMemory mem;
  mem.to_host = IdentityToHost;
  return mem;
}

const char* RefKernel(const pc_embedding_args_t& a, const DeviceMemory& mem) {
  const int64_t row_bytes = RowBytes(a.table_dtype, a.row_len);
  auto* table = Map<const uint8_t>(mem, a.table, a.n_rows * row_bytes);
  auto* ids = Map<const int32_t>(mem, a.ids, a.n_ids * 4);
  auto* out = Map<float>(mem, a.out, a.n_ids * a.row_len * 4);
  if (!table || !ids || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n_ids; ++i) {
    if (ids[i] < 0 || ids[i] >= a.n_rows) return "embedding id out of range";
    DequantizeRow(a.table_dtype, table + ids[i] * row_bytes, out + i * a.row_len, a.row_len);
  }
  return nullptr;
}

const char* RefKernel(const pc_rms_norm_args_t& a, const DeviceMemory& mem) {
  const uint64_t bytes = a.n_rows * a.dim * 4;
  auto* x = Map<const float>(mem, a.x, bytes);
  auto* out = Map<float>(mem, a.out, bytes);
  const float* w = a.weight ? Map<const float>(mem, a.weight, a.dim * 4) : nullptr;
  if (!x || !out || (a.weight && !w)) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t r = 0; r < a.n_rows; ++r) {
    const float* xr = x + r * a.dim;
    float* yr = out + r * a.dim;
    double ss = 0;
    for (int64_t i = 0; i < a.dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / a.dim) + a.eps);
    for (int64_t i = 0; i < a.dim; ++i) yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  }
  return nullptr;
}

const char* RefKernel(const pc_matmul_args_t& a, const DeviceMemory& mem) {
  if (a.m == 0) return nullptr;  // nothing to read or write
  const int64_t w_row_bytes = RowBytes(a.w_dtype, a.k);
  auto* x = Map<const float>(mem, a.x, ((a.m - 1) * a.x_stride + a.k) * 4);
  auto* w = Map<const uint8_t>(mem, a.w, a.n * w_row_bytes);
  auto* out = Map<float>(mem, a.out, ((a.m - 1) * a.out_stride + a.n) * 4);
  const float* bias = a.bias ? Map<const float>(mem, a.bias, a.n * 4) : nullptr;
  if (!x || !w || !out || (a.bias && !bias)) return kBadAddress;
  if (mem.validate_only) return nullptr;
  std::vector<float> w_row(a.k);  // one dequantized weight row, reused for every x row
  for (int64_t j = 0; j < a.n; ++j) {
    DequantizeRow(a.w_dtype, w + j * w_row_bytes, w_row.data(), a.k);
    for (int64_t i = 0; i < a.m; ++i) {
      const float* xi = x + i * a.x_stride;
      float sum = 0;
      for (int64_t k = 0; k < a.k; ++k) sum += xi[k] * w_row[k];
      if (bias) sum += bias[j];
      float& y = out[i * a.out_stride + j];
      y = a.accumulate ? y + sum : sum;
    }
  }
  return nullptr;
}

void RopeCosSin(const pc_rope_args_t& a, int32_t position, int64_t pair, float freq_factor,
                float* cos_theta, float* sin_theta) {
  // theta_extrap: the unscaled angle; theta_interp: the angle with linear position scaling.
  const float theta_extrap =
      position * std::pow(a.freq_base, -2.0f * pair / a.n_rot) / freq_factor;
  const float theta_interp = a.freq_scale * theta_extrap;
  float theta = theta_interp;
  float mscale = a.attn_factor;
  if (a.ext_factor != 0.0f) {
    // YaRN: pairs below the low correction dim extrapolate (keep theta), pairs above the high
    // one interpolate; a linear ramp mixes the two in between.
    auto corr_dim = [&](float n_rotations) {
      return a.n_rot * std::log(a.n_ctx_orig / (n_rotations * 2 * static_cast<float>(M_PI))) /
             (2 * std::log(a.freq_base));
    };
    const float low = std::max(0.0f, std::floor(corr_dim(a.beta_fast)));
    const float high = std::min(static_cast<float>(a.n_rot - 1), std::ceil(corr_dim(a.beta_slow)));
    const float y = (pair - low) / std::max(0.001f, high - low);
    const float ramp = 1 - std::min(1.0f, std::max(0.0f, y));
    const float mix = ramp * a.ext_factor;
    theta = theta_interp * (1 - mix) + theta_extrap * mix;
    mscale *= 1.0f + 0.1f * std::log(1.0f / a.freq_scale);
  }
  *cos_theta = std::cos(theta) * mscale;
  *sin_theta = std::sin(theta) * mscale;
}

const char* RefKernel(const pc_rope_args_t& a, const DeviceMemory& mem) {
  auto* x = Map<float>(mem, a.x, a.n_tokens * a.n_heads * a.head_dim * 4);
  auto* pos = Map<const int32_t>(mem, a.positions, a.n_tokens * 4);
  const float* ff = a.freq_factors ? Map<const float>(mem, a.freq_factors, a.n_rot / 2 * 4) : nullptr;
  if (!x || !pos || (a.freq_factors && !ff)) return kBadAddress;
  if (mem.validate_only) return nullptr;
  const int64_t half = a.n_rot / 2;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float c, s;
      RopeCosSin(a, pos[t], i, ff ? ff[i] : 1.0f, &c, &s);
      for (int64_t h = 0; h < a.n_heads; ++h) {
        float* v = x + (t * a.n_heads + h) * a.head_dim;  // [head_dim]
        // NORMAL pairs adjacent elements; NEOX pairs element i with i + n_rot/2.
        const int64_t i0 = a.mode == PC_ROPE_NEOX ? i : 2 * i;
        const int64_t i1 = a.mode == PC_ROPE_NEOX ? i + half : 2 * i + 1;
        const float x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * c - x1 * s;
        v[i1] = x0 * s + x1 * c;
      }
    }
  }
  return nullptr;
}

const char* RefKernel(const pc_kv_store_args_t& a, const DeviceMemory& mem) {
  const int64_t row = a.n_kv_heads * a.head_dim;  // elements per token
  auto* k = Map<const float>(mem, a.k, a.n_tokens * row * 4);
  auto* v = Map<const float>(mem, a.v, a.n_tokens * row * 4);
  auto* slots = Map<const int32_t>(mem, a.slots, a.n_tokens * 4);
  if (!k || !v || !slots) return kBadAddress;
  if (mem.validate_only) return nullptr;
  const pc_dtype_t kt = a.cache_dtype, vt = KvStoreVDtype(a);
  const int64_t k_head = RowBytes(kt, a.head_dim), v_head = RowBytes(vt, a.head_dim);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    if (slots[t] < 0) continue;
    // Slot s holds n_kv_heads rows of head_dim ([n_blocks, block_size] flattens to slots).
    const uint64_t slot = static_cast<uint64_t>(slots[t]);
    auto* kc = Map<uint8_t>(mem, a.k_cache + slot * a.n_kv_heads * k_head, a.n_kv_heads * k_head);
    auto* vc = Map<uint8_t>(mem, a.v_cache + slot * a.n_kv_heads * v_head, a.n_kv_heads * v_head);
    if (!kc || !vc) return "kv slot outside the cache allocation";
    // Each head's row on its own: a block type's blocks never straddle two heads.
    for (int64_t h = 0; h < a.n_kv_heads; ++h) {
      QuantizeRow(kt, k + t * row + h * a.head_dim, kc + h * k_head, a.head_dim);
      QuantizeRow(vt, v + t * row + h * a.head_dim, vc + h * v_head, a.head_dim);
    }
  }
  return nullptr;
}

pc_dtype_t KvStoreVDtype(const pc_kv_store_args_t& a) {
  const bool has = a.struct_size >= offsetof(pc_kv_store_args_t, v_cache_dtype) + sizeof(pc_dtype_t);
  return has ? a.v_cache_dtype : a.cache_dtype;
}

pc_dtype_t AttentionVDtype(const pc_attention_args_t& a) {
  const bool has =
      a.struct_size >= offsetof(pc_attention_args_t, v_cache_dtype) + sizeof(pc_dtype_t);
  return has ? a.v_cache_dtype : a.cache_dtype;
}

int64_t AttentionWindow(const pc_attention_args_t& a) {
  return a.struct_size >= offsetof(pc_attention_args_t, window) + sizeof(a.window) ? a.window : 0;
}

int64_t AttentionFirstPosition(const pc_attention_args_t& a, int64_t position) {
  const int64_t window = AttentionWindow(a);
  return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
}

const char* RefKernel(const pc_attention_args_t& a, const DeviceMemory& mem) {
  const int64_t q_bytes = a.n_tokens * a.n_heads * a.head_dim * 4;
  auto* q = Map<const float>(mem, a.q, q_bytes);
  auto* out = Map<float>(mem, a.out, q_bytes);
  auto* qstart = Map<const int32_t>(mem, a.query_start, (a.n_seqs + 1) * 4);
  auto* seq_lens = Map<const int32_t>(mem, a.seq_lens, a.n_seqs * 4);
  auto* tables = Map<const int32_t>(mem, a.block_tables, a.n_seqs * a.max_blocks_per_seq * 4);
  if (!q || !out || !qstart || !seq_lens || !tables) return kBadAddress;
  if (mem.validate_only) return nullptr;
  const int64_t group = a.n_heads / a.n_kv_heads;         // query heads per KV head
  const pc_dtype_t kt = a.cache_dtype, vt = AttentionVDtype(a);
  const int64_t k_head = RowBytes(kt, a.head_dim), v_head = RowBytes(vt, a.head_dim);
  const int64_t k_block = a.block_size * a.n_kv_heads * k_head;  // bytes of one cache block
  const int64_t v_block = a.block_size * a.n_kv_heads * v_head;
  std::vector<float> scores, row(a.head_dim);
  std::vector<const uint8_t*> k_blocks, v_blocks;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    const int64_t q0 = qstart[s], q1 = qstart[s + 1], len = seq_lens[s];
    const int64_t n_q = q1 - q0;
    if (q0 < 0 || q1 > a.n_tokens || n_q < 0 || n_q > len) return "bad query_start/seq_lens";
    const int64_t n_blocks = (len + a.block_size - 1) / a.block_size;
    if (n_blocks > a.max_blocks_per_seq) return "seq_len exceeds the block table";
    // Resolve the sequence's blocks once.
    k_blocks.assign(n_blocks, nullptr);
    v_blocks.assign(n_blocks, nullptr);
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int32_t block = tables[s * a.max_blocks_per_seq + b];
      if (block < 0) return "negative block index";
      k_blocks[b] = Map<const uint8_t>(mem, a.k_cache + uint64_t(block) * k_block, k_block);
      v_blocks[b] = Map<const uint8_t>(mem, a.v_cache + uint64_t(block) * v_block, v_block);
      if (!k_blocks[b] || !v_blocks[b]) return "block index outside the cache allocation";
    }
    // The row of KV head kvh at position p, dequantized into `row`.
    auto load = [&](const std::vector<const uint8_t*>& blocks, pc_dtype_t dtype, int64_t head,
                    int64_t p, int64_t kvh) {
      const uint8_t* b = blocks[p / a.block_size];
      DequantizeRow(dtype, b + ((p % a.block_size) * a.n_kv_heads + kvh) * head, row.data(),
                    a.head_dim);
    };
    for (int64_t j = 0; j < n_q; ++j) {
      const int64_t t = q0 + j;
      const int64_t last = len - n_q + j;  // causal: attend to positions first..last
      const int64_t first = AttentionFirstPosition(a, last);
      scores.resize(last + 1);
      for (int64_t h = 0; h < a.n_heads; ++h) {
        const float* qv = q + (t * a.n_heads + h) * a.head_dim;  // [head_dim]
        const int64_t kvh = h / group;
        float max_score = -INFINITY;
        for (int64_t p = first; p <= last; ++p) {
          load(k_blocks, kt, k_head, p, kvh);
          float dot = 0;
          for (int64_t d = 0; d < a.head_dim; ++d) dot += qv[d] * row[d];
          scores[p] = dot * a.scale;
          max_score = std::max(max_score, scores[p]);
        }
        // Numerically stable softmax: subtract the max before exponentiating.
        float denom = 0;
        for (int64_t p = first; p <= last; ++p) {
          scores[p] = std::exp(scores[p] - max_score);
          denom += scores[p];
        }
        float* o = out + (t * a.n_heads + h) * a.head_dim;  // [head_dim]
        for (int64_t d = 0; d < a.head_dim; ++d) o[d] = 0;
        for (int64_t p = first; p <= last; ++p) {
          load(v_blocks, vt, v_head, p, kvh);
          const float w = scores[p] / denom;
          for (int64_t d = 0; d < a.head_dim; ++d) o[d] += w * row[d];
        }
      }
    }
  }
  return nullptr;
}

const char* RefKernel(const pc_swiglu_args_t& a, const DeviceMemory& mem) {
  auto* gate = Map<const float>(mem, a.gate, a.n * 4);
  auto* up = Map<const float>(mem, a.up, a.n * 4);
  auto* out = Map<float>(mem, a.out, a.n * 4);
  if (!gate || !up || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  return nullptr;
}

float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

const char* RefKernel(const pc_geglu_args_t& a, const DeviceMemory& mem) {
  auto* gate = Map<const float>(mem, a.gate, a.n * 4);
  auto* up = Map<const float>(mem, a.up, a.n * 4);
  auto* out = Map<float>(mem, a.out, a.n * 4);
  if (!gate || !up || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n; ++i) out[i] = GeluTanh(gate[i]) * up[i];
  return nullptr;
}

const char* RefKernel(const pc_scale_args_t& a, const DeviceMemory& mem) {
  auto* x = Map<const float>(mem, a.x, a.n * 4);
  auto* out = Map<float>(mem, a.out, a.n * 4);
  if (!x || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n; ++i) out[i] = x[i] * a.scale;
  return nullptr;
}

// t = scale (x[rows] A^T), then out[rows] += t B^T: the numbers of the MATMUL, SCALE, MATMUL
// (accumulating) the op stands for, row by row.
const char* RefKernel(const pc_lora_args_t& a, const DeviceMemory& mem) {
  if (a.n_rows == 0) return nullptr;
  const int64_t a_row = RowBytes(a.a_dtype, a.k), b_row = RowBytes(a.b_dtype, a.rank);
  auto* x = Map<const float>(mem, a.x, a.m * a.k * 4);
  auto* out = Map<float>(mem, a.out, a.m * a.n * 4);
  const int32_t* rows = a.rows ? Map<const int32_t>(mem, a.rows, a.n_rows * 4) : nullptr;
  auto* wa = Map<const uint8_t>(mem, a.a, a.rank * a_row);
  auto* wb = Map<const uint8_t>(mem, a.b, a.n * b_row);
  if (!x || !out || (a.rows && !rows) || !wa || !wb) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n_rows; ++i) {
    if (rows && (rows[i] < 0 || rows[i] >= a.m)) return "lora row out of range";
  }
  const auto row = [&](int64_t i) { return rows ? int64_t{rows[i]} : i; };
  std::vector<float> w(std::max(a.k, a.rank)), t(a.n_rows * a.rank);  // t [n_rows, rank]
  for (int64_t j = 0; j < a.rank; ++j) {
    DequantizeRow(a.a_dtype, wa + j * a_row, w.data(), a.k);
    for (int64_t i = 0; i < a.n_rows; ++i) {
      const float* xi = x + row(i) * a.k;
      float sum = 0;
      for (int64_t k = 0; k < a.k; ++k) sum += xi[k] * w[k];
      t[i * a.rank + j] = sum * a.scale;
    }
  }
  for (int64_t j = 0; j < a.n; ++j) {
    DequantizeRow(a.b_dtype, wb + j * b_row, w.data(), a.rank);
    for (int64_t i = 0; i < a.n_rows; ++i) {
      float sum = 0;
      for (int64_t r = 0; r < a.rank; ++r) sum += t[i * a.rank + r] * w[r];
      out[row(i) * a.n + j] += sum;
    }
  }
  return nullptr;
}

const char* RefKernel(const pc_add_args_t& a, const DeviceMemory& mem) {
  auto* x = Map<const float>(mem, a.a, a.n * 4);
  auto* y = Map<const float>(mem, a.b, a.n * 4);
  auto* out = Map<float>(mem, a.out, a.n * 4);
  if (!x || !y || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  for (int64_t i = 0; i < a.n; ++i) out[i] = x[i] + y[i];
  return nullptr;
}

const char* RefKernel(const pc_convert_args_t& a, const DeviceMemory& mem) {
  auto* src = Map<const uint8_t>(mem, a.src, RowBytes(a.src_dtype, a.n));
  auto* dst = Map<uint8_t>(mem, a.dst, RowBytes(a.dst_dtype, a.n));
  if (!src || !dst) return kBadAddress;
  if (mem.validate_only) return nullptr;
  // Through F32 in chunks of whole blocks: exact for every supported pair, since F16 and BF16
  // are subsets of F32 and the final rounding happens once.
  const int64_t block = GetDtypeInfo(a.src_dtype)->block_elems;
  const int64_t chunk = std::max<int64_t>(block, 4096 / block * block);
  std::vector<float> tmp(chunk);
  for (int64_t i = 0; i < a.n; i += chunk) {
    const int64_t len = std::min(chunk, a.n - i);
    DequantizeRow(a.src_dtype, src + RowBytes(a.src_dtype, i), tmp.data(), len);
    QuantizeRow(a.dst_dtype, tmp.data(), dst + RowBytes(a.dst_dtype, i), len);
  }
  return nullptr;
}

void MoeRoute(const float* logits, int64_t n_experts, int64_t n_used, bool norm_weights,
              int32_t* experts, float* weights) {
  float max_logit = -INFINITY;
  for (int64_t e = 0; e < n_experts; ++e) max_logit = std::max(max_logit, logits[e]);
  double denom = 0;
  for (int64_t e = 0; e < n_experts; ++e) denom += std::exp(logits[e] - max_logit);
  // Selection by repeated maximum: n_used is small (8 of 128 for Qwen3-30B-A3B). A larger
  // logit is a larger probability, so the logits decide; the strict '>' keeps the lower index
  // of a tie.
  for (int64_t j = 0; j < n_used; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || experts[i] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = static_cast<int32_t>(e);
    }
    experts[j] = best;
    weights[j] = static_cast<float>(std::exp(logits[best] - max_logit) / denom);
  }
  if (norm_weights) {
    float sum = 0;
    for (int64_t j = 0; j < n_used; ++j) sum += weights[j];
    // As llama.cpp: the sum is clamped to the smallest normal F16 (2^-14) before dividing.
    sum = std::max(sum, 6.103515625e-5f);
    for (int64_t j = 0; j < n_used; ++j) weights[j] /= sum;
  }
}

bool IsLowRankDtype(pc_dtype_t t) { return IsFloatType(t) || t == PC_DTYPE_Q8_0; }

MoeLowRank MoeLowRankOf(const pc_moe_args_t& a, int projection) {
  MoeLowRank t;
  if (a.struct_size >= offsetof(pc_moe_args_t, down_lora_scale) + sizeof(a.down_lora_scale)) {
    switch (projection) {
      case 0: t = {a.gate_lora_a, a.gate_lora_b, a.gate_lora_rank, a.gate_lora_scale}; break;
      case 1: t = {a.up_lora_a, a.up_lora_b, a.up_lora_rank, a.up_lora_scale}; break;
      case 2: t = {a.down_lora_a, a.down_lora_b, a.down_lora_rank, a.down_lora_scale}; break;
      default: break;
    }
  }
  t.rows = projection == 2 ? a.n_embd : a.n_ff;  // gate/up [n_ff, n_embd], down [n_embd, n_ff]
  t.cols = projection == 2 ? a.n_ff : a.n_embd;
  return t;
}

bool MoeHasLowRank(const pc_moe_args_t& a) {
  for (int p = 0; p < 3; ++p) {
    if (MoeLowRankOf(a, p).present()) return true;
  }
  return false;
}

namespace {

// One projection's low-rank term of MOE, mapped: A [n_experts * rank, cols], B [n_experts *
// rows, rank]. Adds s B_e (A_e v) to y[rows] for expert e. The reference rounds nothing (as its
// MATMUL): the product is F32 arithmetic over the dequantized A and B.
struct RefLowRank {
  const uint8_t* a = nullptr;
  const uint8_t* b = nullptr;
  pc_dtype_t a_dtype = PC_DTYPE_F32, b_dtype = PC_DTYPE_F32;
  int64_t rank = 0, rows = 0, cols = 0;
  float scale = 0;

  void Add(int64_t e, const float* v, float* y) const {
    if (a == nullptr) return;
    const int64_t a_row = RowBytes(a_dtype, cols), b_row = RowBytes(b_dtype, rank);
    std::vector<float> w(std::max(cols, rank)), t(rank);
    for (int64_t i = 0; i < rank; ++i) {  // t = A_e v   [rank]
      DequantizeRow(a_dtype, a + (e * rank + i) * a_row, w.data(), cols);
      float sum = 0;
      for (int64_t k = 0; k < cols; ++k) sum += v[k] * w[k];
      t[i] = sum;
    }
    for (int64_t r = 0; r < rows; ++r) {  // y += s B_e t   [rows]
      DequantizeRow(b_dtype, b + (e * rows + r) * b_row, w.data(), rank);
      float sum = 0;
      for (int64_t i = 0; i < rank; ++i) sum += t[i] * w[i];
      y[r] += scale * sum;
    }
  }
};

}  // namespace

const char* RefKernel(const pc_moe_args_t& a, const DeviceMemory& mem) {
  if (a.n_tokens == 0) return nullptr;
  // The low-rank terms of gate, up, down (1.7): [rows, cols] of one expert's matrix.
  RefLowRank terms[3];
  for (int p = 0; p < 3; ++p) {
    const MoeLowRank t = MoeLowRankOf(a, p);
    if (!t.present()) continue;
    RefLowRank& r = terms[p];
    r.a_dtype = a.lora_a_dtype;
    r.b_dtype = a.lora_b_dtype;
    r.rank = t.rank;
    r.rows = t.rows;
    r.cols = t.cols;
    r.scale = t.scale;
    r.a = Map<const uint8_t>(mem, t.a, a.n_experts * t.rank * RowBytes(r.a_dtype, r.cols));
    r.b = Map<const uint8_t>(mem, t.b, a.n_experts * r.rows * RowBytes(r.b_dtype, t.rank));
    if (!r.a || !r.b) return kBadAddress;
  }
  const int64_t gate_row = RowBytes(a.gate_dtype, a.n_embd);
  const int64_t up_row = RowBytes(a.up_dtype, a.n_embd);
  const int64_t down_row = RowBytes(a.down_dtype, a.n_ff);
  auto* x = Map<const float>(mem, a.x, a.n_tokens * a.n_embd * 4);
  auto* logits = Map<const float>(mem, a.logits, a.n_tokens * a.n_experts * 4);
  auto* gate = Map<const uint8_t>(mem, a.gate, a.n_experts * a.n_ff * gate_row);
  auto* up = Map<const uint8_t>(mem, a.up, a.n_experts * a.n_ff * up_row);
  auto* down = Map<const uint8_t>(mem, a.down, a.n_experts * a.n_embd * down_row);
  auto* out = Map<float>(mem, a.out, a.n_tokens * a.n_embd * 4);
  if (!x || !logits || !gate || !up || !down || !out) return kBadAddress;
  if (mem.validate_only) return nullptr;
  std::vector<int32_t> experts(a.n_used);
  std::vector<float> weights(a.n_used), w_row(std::max(a.n_embd, a.n_ff));
  std::vector<float> h(a.n_ff), y_up(a.n_ff), y(a.n_embd), d_e(a.n_embd);
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* xt = x + t * a.n_embd;  // [n_embd]
    MoeRoute(logits + t * a.n_experts, a.n_experts, a.n_used, a.norm_weights != 0,
             experts.data(), weights.data());
    std::fill(y.begin(), y.end(), 0.f);
    for (int64_t j = 0; j < a.n_used; ++j) {
      const int64_t e = experts[j];
      for (int64_t r = 0; r < a.n_ff; ++r) {  // h = silu(gate_e x) * up_e x   [n_ff]
        float g = 0, u = 0;
        DequantizeRow(a.gate_dtype, gate + (e * a.n_ff + r) * gate_row, w_row.data(), a.n_embd);
        for (int64_t k = 0; k < a.n_embd; ++k) g += xt[k] * w_row[k];
        DequantizeRow(a.up_dtype, up + (e * a.n_ff + r) * up_row, w_row.data(), a.n_embd);
        for (int64_t k = 0; k < a.n_embd; ++k) u += xt[k] * w_row[k];
        h[r] = g;
        y_up[r] = u;
      }
      terms[0].Add(e, xt, h.data());
      terms[1].Add(e, xt, y_up.data());
      for (int64_t r = 0; r < a.n_ff; ++r) h[r] = h[r] / (1.0f + std::exp(-h[r])) * y_up[r];
      std::fill(d_e.begin(), d_e.end(), 0.f);
      for (int64_t r = 0; r < a.n_embd; ++r) {  // y += w_e * down_e h   [n_embd]
        DequantizeRow(a.down_dtype, down + (e * a.n_embd + r) * down_row, w_row.data(), a.n_ff);
        float d = 0;
        for (int64_t k = 0; k < a.n_ff; ++k) d += h[k] * w_row[k];
        d_e[r] = d;
      }
      terms[2].Add(e, h.data(), d_e.data());
      for (int64_t r = 0; r < a.n_embd; ++r) y[r] += weights[j] * d_e[r];
    }
    float* ot = out + t * a.n_embd;
    for (int64_t r = 0; r < a.n_embd; ++r) ot[r] = a.accumulate ? ot[r] + y[r] : y[r];
  }
  return nullptr;
}

namespace {

// A weight's types: FP8_E4M3 is a KV cache type only (pc_common.h).
bool Decodable(pc_dtype_t t) {
  const DtypeInfo* info = GetDtypeInfo(t);
  return info != nullptr && t != PC_DTYPE_FP8_E4M3 && (info->quantized || IsFloatType(t));
}

}  // namespace

// ---- validation, one overload per op (shape/dtype/layout members; not the addresses) ------

const char* Validate(const pc_embedding_args_t& a) {
  // table_layout came in 1.2: a shorter struct (checked by the caller) has the GGUF layout.
  const bool has_layout =
      a.struct_size >= offsetof(pc_embedding_args_t, table_layout) + sizeof(a.table_layout);
  if (has_layout && a.table_layout != PC_LAYOUT_GGUF) return "unknown table layout";
  if (!Decodable(a.table_dtype)) return "unsupported table dtype";
  if (a.n_rows < 0 || a.n_ids < 0 || a.row_len <= 0) return "bad shape";
  if (RowBytes(a.table_dtype, a.row_len) < 0) return "row_len not a multiple of the block";
  return nullptr;
}

const char* Validate(const pc_rms_norm_args_t& a) {
  if (a.n_rows < 0 || a.dim <= 0) return "bad shape";
  return nullptr;
}

const char* Validate(const pc_matmul_args_t& a) {
  if (a.w_layout != PC_LAYOUT_GGUF) return "unknown weight layout";
  if (!Decodable(a.w_dtype)) return "unsupported weight dtype";
  if (a.m < 0 || a.n <= 0 || a.k <= 0) return "bad shape";
  if (a.x_stride < a.k || a.out_stride < a.n) return "stride smaller than the row";
  if (RowBytes(a.w_dtype, a.k) < 0) return "k not a multiple of the weight block";
  return nullptr;
}

const char* Validate(const pc_rope_args_t& a) {
  if (a.n_tokens < 0 || a.n_heads <= 0 || a.head_dim <= 0) return "bad shape";
  if (a.n_rot <= 0 || a.n_rot % 2 != 0 || a.n_rot > a.head_dim) return "bad n_rot";
  if (a.mode != PC_ROPE_NORMAL && a.mode != PC_ROPE_NEOX) return "unknown rope mode";
  if (!(a.freq_base > 0) || !(a.freq_scale > 0)) return "bad frequency parameters";
  return nullptr;
}

namespace {

const char* ValidateCacheDtypes(pc_dtype_t k, pc_dtype_t v, int64_t head_dim) {
  if (!IsCacheDtype(k) || !IsCacheDtype(v)) return "unsupported cache dtype";
  if (head_dim > 0 && (RowBytes(k, head_dim) < 0 || RowBytes(v, head_dim) < 0))
    return "head_dim not a multiple of the cache dtype's block";
  return nullptr;
}

}  // namespace

const char* Validate(const pc_kv_store_args_t& a) {
  if (const char* why = ValidateCacheDtypes(a.cache_dtype, KvStoreVDtype(a), a.head_dim))
    return why;
  if (a.n_tokens < 0 || a.n_kv_heads <= 0 || a.head_dim <= 0 || a.block_size <= 0)
    return "bad shape";
  return nullptr;
}

const char* Validate(const pc_attention_args_t& a) {
  if (const char* why = ValidateCacheDtypes(a.cache_dtype, AttentionVDtype(a), a.head_dim))
    return why;
  if (a.n_tokens < 0 || a.n_seqs < 0 || a.n_heads <= 0 || a.n_kv_heads <= 0 ||
      a.head_dim <= 0 || a.block_size <= 0 || a.max_blocks_per_seq < 0)
    return "bad shape";
  if (a.n_heads % a.n_kv_heads != 0) return "n_heads not a multiple of n_kv_heads";
  if (AttentionWindow(a) < 0) return "negative window";
  return nullptr;
}

const char* Validate(const pc_swiglu_args_t& a) { return a.n < 0 ? "bad shape" : nullptr; }

const char* Validate(const pc_add_args_t& a) { return a.n < 0 ? "bad shape" : nullptr; }

const char* Validate(const pc_geglu_args_t& a) { return a.n < 0 ? "bad shape" : nullptr; }

const char* Validate(const pc_scale_args_t& a) { return a.n < 0 ? "bad shape" : nullptr; }

const char* Validate(const pc_lora_args_t& a) {
  if (a.a_layout != PC_LAYOUT_GGUF || a.b_layout != PC_LAYOUT_GGUF) return "unknown weight layout";
  if (!Decodable(a.a_dtype) || !Decodable(a.b_dtype)) return "unsupported weight dtype";
  if (a.m < 0 || a.n_rows < 0 || a.n_rows > a.m || a.k <= 0 || a.n <= 0 || a.rank <= 0)
    return "bad shape";
  if (RowBytes(a.a_dtype, a.k) < 0 || RowBytes(a.b_dtype, a.rank) < 0)
    return "row length not a multiple of the weight block";
  return nullptr;
}

const char* Validate(const pc_convert_args_t& a) {
  if (!Decodable(a.src_dtype) || !IsFloatType(a.dst_dtype)) return "unsupported dtype pair";
  if (GetDtypeInfo(a.src_dtype)->quantized && a.dst_dtype != PC_DTYPE_F32)
    return "a quantized source converts to F32 only";
  if (a.n < 0 || RowBytes(a.src_dtype, a.n) < 0) return "n not a multiple of the block";
  return nullptr;
}

const char* Validate(const pc_moe_args_t& a) {
  if (a.gate_layout != PC_LAYOUT_GGUF || a.up_layout != PC_LAYOUT_GGUF ||
      a.down_layout != PC_LAYOUT_GGUF)
    return "unknown weight layout";
  if (!Decodable(a.gate_dtype) || !Decodable(a.up_dtype) || !Decodable(a.down_dtype))
    return "unsupported weight dtype";
  if (a.n_tokens < 0 || a.n_embd <= 0 || a.n_ff <= 0 || a.n_experts <= 0) return "bad shape";
  if (a.n_used < 1 || a.n_used > a.n_experts) return "n_used outside 1..n_experts";
  if (RowBytes(a.gate_dtype, a.n_embd) < 0 || RowBytes(a.up_dtype, a.n_embd) < 0 ||
      RowBytes(a.down_dtype, a.n_ff) < 0)
    return "row length not a multiple of the weight block";
  // The low-rank terms (1.7; absent from an older host's shorter struct).
  for (int p = 0; p < 3; ++p) {
    const MoeLowRank t = MoeLowRankOf(a, p);
    if ((t.a != 0) != (t.b != 0) || (t.a != 0 && t.rank <= 0))
      return "a low-rank term needs A, B and a positive rank";
    if (!t.present()) continue;
    if (!IsLowRankDtype(a.lora_a_dtype) || !IsLowRankDtype(a.lora_b_dtype))
      return "low-rank A and B are F32, F16, BF16 or Q8_0";
    if (RowBytes(a.lora_a_dtype, t.cols) < 0 || RowBytes(a.lora_b_dtype, t.rank) < 0)
      return "low-rank row length not a multiple of its type's block";
  }
  return nullptr;
}

// ---- dispatch, generated from the op list (op_list.h) --------------------------------------

size_t OpArgsSize(pc_op_t op) {
  return VisitOp(op, size_t{0}, [](auto t) { return sizeof(typename decltype(t)::Args); });
}

size_t OpArgsMinSize(pc_op_t op) {
  return VisitOp(op, size_t{0}, [](auto t) { return OpArgsMinSizeOf<decltype(t)>(); });
}

const char* ValidateOpArgs(pc_op_t op, const void* args) {
  const size_t want = OpArgsMinSize(op);
  if (want == 0) return "unknown op";
  if (args == nullptr) return "null args";
  // Shorter than the struct's first version: a caller bug. Longer (a newer host) is fine; we
  // read only what we know, and members appended later are read through PC_HAS_MEMBER.
  if (*static_cast<const size_t*>(args) < want) return "args struct_size too small";
  return VisitOp(op, "unknown op", [args](auto t) {
    return Validate(*static_cast<const typename decltype(t)::Args*>(args));
  });
}

const char* RefLaunch(pc_op_t op, const void* args, const DeviceMemory& mem) {
  if (const char* why = ValidateOpArgs(op, args)) return why;
  return VisitOp(op, "unknown op", [args, &mem](auto t) {
    return RefKernel(*static_cast<const typename decltype(t)::Args*>(args), mem);
  });
}

bool RefSupports(const pc_op_query_t& q) {
  // The reference kernels read the GGUF layout only.
  const bool has_layout = q.struct_size >= offsetof(pc_op_query_t, layout) + sizeof(q.layout);
  if (has_layout && q.layout != PC_LAYOUT_GGUF) return false;
  return VisitOp(q.op, false, [&q](auto t) {
    bool ok = true;
    int i = 0;
    decltype(t)::Dtypes([&](auto, const char*, DtypeKind kind) {
      pc_dtype_t d = q.dtypes[i++];
      // V's cache dtype from a host older than 1.6: the same as K's.
      if (kind == DtypeKind::kCache && i == 2 && d == PC_DTYPE_INVALID) d = q.dtypes[0];
      ok = ok && (kind == DtypeKind::kWeight    ? Decodable(d)
                  : kind == DtypeKind::kCache   ? IsCacheDtype(d)
                  : kind == DtypeKind::kLowRank ? d == PC_DTYPE_INVALID || IsLowRankDtype(d)
                                                : IsFloatType(d));
    });
    // An op without dtype members reads F32 activations only.
    if (i == 0) ok = q.dtypes[0] == PC_DTYPE_F32 || q.dtypes[0] == PC_DTYPE_INVALID;
    // CONVERT dequantizes a quantized source into F32 only.
    if (ok && q.op == PC_OP_CONVERT && GetDtypeInfo(q.dtypes[0])->quantized)
      ok = q.dtypes[1] == PC_DTYPE_F32;
    return ok;
  });
}

}  // namespace polychip::sdk
