// Conformance checks of the compute domain: every op the plugin claims (op_supports), for every
// dtype combination, against the plain reference in reference.cc with per-dtype tolerances.
// An op or dtype the plugin does not claim is SKIPped, never failed.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <tuple>

#include "polychip/sdk/op_list.h"
#include "runtime/conformance/harness.h"
#include "runtime/conformance/reference.h"
#include "runtime/dtype.h"

namespace polychip::runtime::conformance {
namespace {

#define PCC_HAS(api, m) (PC_HAS_MEMBER(api, pc_backend_iface_t, m) && (api)->m != nullptr)

const pc_dtype_t kWeightDtypes[] = {PC_DTYPE_F32,  PC_DTYPE_F16,  PC_DTYPE_BF16, PC_DTYPE_Q8_0,
                                    PC_DTYPE_Q4_0, PC_DTYPE_Q4_1, PC_DTYPE_Q5_0, PC_DTYPE_Q5_1,
                                    PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q4_K, PC_DTYPE_Q5_K,
                                    PC_DTYPE_Q6_K, PC_DTYPE_IQ4_NL, PC_DTYPE_IQ4_XS};
const pc_dtype_t kFloatDtypes[] = {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16};
// KV cache types (K and V of one type), and pairs of K's and V's types that differ (1.6).
const pc_dtype_t kCacheDtypes[] = {PC_DTYPE_F32,  PC_DTYPE_F16,  PC_DTYPE_BF16,
                                   PC_DTYPE_Q8_0, PC_DTYPE_Q4_0, PC_DTYPE_FP8_E4M3};
struct CachePair {
  pc_dtype_t k, v;
};
const CachePair kMixedCachePairs[] = {{PC_DTYPE_F16, PC_DTYPE_Q8_0}, {PC_DTYPE_Q8_0, PC_DTYPE_Q4_0}};

std::string Lower(pc_dtype_t d) {
  std::string s = DTypeName(static_cast<DType>(d));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
bool Quantized(pc_dtype_t d) { return IsQuantized(static_cast<DType>(d)); }

// Matmul tolerance by weight dtype. A plugin may round activations to the weight's precision
// before the dot product (as ggml does: f16/bf16 activations, 8-bit activations for the
// quantized formats), so the tolerance covers that rounding, not just accumulation order.
double MatmulTolerance(pc_dtype_t w) {
  switch (w) {
    case PC_DTYPE_F32: return 2e-5;
    case PC_DTYPE_F16: return 4e-3;
    case PC_DTYPE_BF16: return 2e-2;
    default: return 3e-2;
  }
}
// Attention tolerance by cache dtype (q may likewise be rounded to the cache precision).
// A block type's values are exact in the reference (it reads the dequantized cache); its
// tolerance allows a plugin that quantizes q for an integer dot product (as llama.cpp does).
double AttentionTolerance(CachePair c) {
  if (c.k == PC_DTYPE_F32 && c.v == PC_DTYPE_F32) return 1e-4;
  if ((c.k == PC_DTYPE_F32 || c.k == PC_DTYPE_F16) && (c.v == PC_DTYPE_F32 || c.v == PC_DTYPE_F16))
    return 3e-3;
  return 2e-2;
}

// Data of `rows` x `cols` values in `dtype`: the bytes for the device and the float values they
// represent (what the reference computes with).
struct Encoded {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
StatusOr<Encoded> Encode(pc_dtype_t dtype, const std::vector<float>& src, int64_t rows,
                         int64_t cols) {
  Encoded e;
  e.values.resize(rows * cols);
  if (dtype == PC_DTYPE_F32) {
    e.bytes.resize(rows * cols * 4);
    std::memcpy(e.bytes.data(), src.data(), e.bytes.size());
    e.values = src;
  } else if (dtype == PC_DTYPE_F16 || dtype == PC_DTYPE_BF16) {
    e.bytes.resize(rows * cols * 2);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t h = dtype == PC_DTYPE_F16 ? ref::F32ToF16(src[i]) : ref::F32ToBf16(src[i]);
      std::memcpy(&e.bytes[i * 2], &h, 2);
      e.values[i] = dtype == PC_DTYPE_F16 ? ref::F16ToF32(h) : ref::Bf16ToF32(h);
    }
  } else {
    // Quantized: the SDK's encoder makes the blocks; its decoder gives the exact float weights.
    const DType d = static_cast<DType>(dtype);
    const int64_t row_bytes = RowBytes(d, cols);
    if (row_bytes < 0) return InvalidArgument("bad row length for " + Lower(dtype));
    e.bytes.resize(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      if (!QuantizeRow(d, &src[r * cols], &e.bytes[r * row_bytes], cols) ||
          !DequantizeRow(d, &e.bytes[r * row_bytes], &e.values[r * cols], cols)) {
        return Unimplemented("the SDK cannot encode " + Lower(dtype));
      }
    }
  }
  return e;
}

// An encode failure is the kit's limitation, not the plugin's: SKIP.
#define PCC_ENCODE(lhs, expr)                                                   \
  auto PC_CONCAT_(enc_, __LINE__) = (expr);                                     \
  if (!PC_CONCAT_(enc_, __LINE__).ok())                                         \
    return Skip(PC_CONCAT_(enc_, __LINE__).status().message());                 \
  lhs = std::move(PC_CONCAT_(enc_, __LINE__)).value()

Verdict NotClaimed() { return Skip("not claimed by op_supports"); }

// ---- EMBEDDING --------------------------------------------------------------------------------
Verdict Embedding(Harness& h, pc_dtype_t dtype) {
  if (!h.Supports(PC_OP_EMBEDDING, {dtype})) return NotClaimed();
  const int64_t n_rows = 37, row_len = 512, n_ids = 19;
  PCC_ENCODE(Encoded table, Encode(dtype, h.RandomFloats(n_rows * row_len), n_rows, row_len));
  std::vector<int32_t> ids(n_ids);
  for (auto& id : ids) id = static_cast<int32_t>(h.rng() % n_rows);
  ids[0] = 0, ids[1] = n_rows - 1, ids[2] = ids[3];  // both ends, and a repeat
  PCC_ASSIGN(pc_devptr_t d_table, h.UploadVec(table.bytes));
  PCC_ASSIGN(pc_devptr_t d_ids, h.UploadVec(ids));
  PCC_ASSIGN(pc_devptr_t d_out, h.Alloc(n_ids * row_len * sizeof(float)));
  pc_embedding_args_t a{};
  a.struct_size = sizeof(a);
  a.table = d_table, a.table_dtype = dtype, a.n_rows = n_rows, a.row_len = row_len;
  a.ids = d_ids, a.n_ids = n_ids, a.out = d_out;
  PCC_TRY(h.Launch(PC_OP_EMBEDDING, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, n_ids * row_len));
  return CompareOutputs(out, ref::Embedding(table.values, row_len, ids), 1e-6);
}

// EMBEDDING from a table that went through weight_upload, in the layout the plugin chose (ABI
// 1.2): how a model with tied embeddings holds its table once. Skipped when the upload kept the
// GGUF layout (op.embedding.<dtype> covers that) or op_supports does not claim the layout. A
// plugin may fold a K-quant's sub-block scales into f16 (as for MATMUL): hence 4e-3.
Verdict EmbeddingUploaded(Harness& h, pc_dtype_t dtype) {
  if (!PCC_HAS(h.api, weight_upload)) return Skip("no weight_upload (optional)");
  if (!h.Supports(PC_OP_MATMUL, {dtype})) return Skip("matmul weights of this dtype not claimed");
  const int64_t n_rows = 37, row_len = 512, n_ids = 19;
  PCC_ENCODE(Encoded table, Encode(dtype, h.RandomFloats(n_rows * row_len), n_rows, row_len));
  pc_weight_t uploaded{};
  uploaded.struct_size = sizeof(uploaded);
  PCC_TRY(h.Take(h.api->weight_upload(h.device, dtype, n_rows, row_len, table.bytes.data(),
                                      table.bytes.size(), &uploaded),
                 "weight_upload"));
  struct Free {  // the weight goes back on every path out
    Harness& h;
    pc_weight_t& w;
    ~Free() { (void)h.Take(h.api->weight_free(h.device, &w), "weight_free"); }
  } free_weight{h, uploaded};
  if (uploaded.layout == PC_LAYOUT_GGUF) return Skip("weight_upload kept the GGUF layout");
  if (!h.Supports(PC_OP_EMBEDDING, {dtype}, PC_SHAPE_ANY, uploaded.layout)) return NotClaimed();
  std::vector<int32_t> ids(n_ids);
  for (auto& id : ids) id = static_cast<int32_t>(h.rng() % n_rows);
  ids[0] = 0, ids[1] = n_rows - 1, ids[2] = ids[3];
  PCC_ASSIGN(pc_devptr_t d_ids, h.UploadVec(ids));
  PCC_ASSIGN(pc_devptr_t d_out, h.Alloc(n_ids * row_len * sizeof(float)));
  pc_embedding_args_t a{};
  a.struct_size = sizeof(a);
  a.table = uploaded.data, a.table_dtype = dtype, a.table_layout = uploaded.layout;
  a.n_rows = n_rows, a.row_len = row_len, a.ids = d_ids, a.n_ids = n_ids, a.out = d_out;
  PCC_TRY(h.Launch(PC_OP_EMBEDDING, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, n_ids * row_len));
  return CompareOutputs(out, ref::Embedding(table.values, row_len, ids), 4e-3);
}

// ---- RMS_NORM ---------------------------------------------------------------------------------
Verdict RmsNorm(Harness& h, bool with_weight, bool in_place) {
  if (!h.Supports(PC_OP_RMS_NORM, {PC_DTYPE_F32})) return NotClaimed();
  const int64_t n_rows = 7, dim = 1000;
  const float eps = 1e-5f;
  std::vector<float> x = h.RandomFloats(n_rows * dim, -3, 3);
  std::vector<float> w = with_weight ? h.RandomFloats(dim, 0.5f, 1.5f) : std::vector<float>();
  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  pc_devptr_t d_w = 0;
  if (with_weight) {
    PCC_ASSIGN(d_w, h.UploadVec(w));
  }
  pc_devptr_t d_out = d_x;
  if (!in_place) {
    PCC_ASSIGN(d_out, h.Alloc(x.size() * sizeof(float)));
  }
  pc_rms_norm_args_t a{};
  a.struct_size = sizeof(a);
  a.x = d_x, a.weight = d_w, a.out = d_out, a.n_rows = n_rows, a.dim = dim, a.eps = eps;
  PCC_TRY(h.Launch(PC_OP_RMS_NORM, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, x.size()));
  return CompareOutputs(out, ref::RmsNorm(x, w, n_rows, dim, eps), 1e-5);
}

// ---- MATMUL -----------------------------------------------------------------------------------
enum class MatmulCase { kDecode, kDecodeLong, kPrefill, kAccumulate, kUploaded };

Verdict Matmul(Harness& h, pc_dtype_t dtype, MatmulCase c) {
  // decode: one row; decode_long: one row of k not a multiple of 256 (11 blocks of 32; three
  // super-blocks of a K-quant), whose rows start at every even offset mod 16 in most formats (a
  // kernel reading rows in wide words or groups of 256 elements meets its edge cases); prefill:
  // odd m and n, bias, padded strides; accumulate: += into out.
  int64_t m = 1, n = 67, k = 256;
  if (c == MatmulCase::kDecodeLong) k = BlockElems(static_cast<DType>(dtype)) == 256 ? 768 : 352;
  bool bias = false, accumulate = false;
  int64_t x_stride = k, out_stride = n;
  if (c == MatmulCase::kPrefill || c == MatmulCase::kUploaded) {
    m = 13, n = 37, k = 512, bias = true, x_stride = k + 32, out_stride = n + 3;
  } else if (c == MatmulCase::kAccumulate) {
    m = 5, n = 33, k = 256, bias = true, accumulate = true;
  }
  const pc_shape_class_t shape = m == 1 ? PC_SHAPE_DECODE : PC_SHAPE_PREFILL;
  if (!h.Supports(PC_OP_MATMUL, {dtype}, shape)) return NotClaimed();
  if (c == MatmulCase::kUploaded && !PCC_HAS(h.api, weight_upload))
    return Skip("no weight_upload (optional)");

  PCC_ENCODE(Encoded w, Encode(dtype, h.RandomFloats(n * k), n, k));
  std::vector<float> x = h.RandomFloats(m * x_stride);
  std::vector<float> b = bias ? h.RandomFloats(n) : std::vector<float>();
  std::vector<float> out = h.RandomFloats(m * out_stride);  // padding columns must survive
  std::vector<float> expected = out;
  ref::Matmul(x, x_stride, w.values, b, m, n, k, accumulate, expected, out_stride);

  pc_weight_t uploaded{};
  uploaded.struct_size = sizeof(uploaded);
  pc_devptr_t d_w = 0;
  uint32_t layout = PC_LAYOUT_GGUF;
  if (c == MatmulCase::kUploaded) {
    PCC_TRY(h.Take(h.api->weight_upload(h.device, dtype, n, k, w.bytes.data(), w.bytes.size(),
                                        &uploaded),
                   "weight_upload"));
    d_w = uploaded.data, layout = uploaded.layout;
  } else {
    PCC_ASSIGN(d_w, h.UploadVec(w.bytes));
  }
  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  pc_devptr_t d_b = 0;
  if (bias) {
    PCC_ASSIGN(d_b, h.UploadVec(b));
  }
  PCC_ASSIGN(pc_devptr_t d_out, h.UploadVec(out));
  pc_matmul_args_t a{};
  a.struct_size = sizeof(a);
  a.x = d_x, a.w = d_w, a.w_dtype = dtype, a.w_layout = layout, a.bias = d_b, a.out = d_out;
  a.m = m, a.n = n, a.k = k, a.x_stride = x_stride, a.out_stride = out_stride;
  a.accumulate = accumulate ? 1 : 0;
  Status launched = h.Launch(PC_OP_MATMUL, &a);
  auto result = h.DownloadVec<float>(d_out, out.size());
  if (c == MatmulCase::kUploaded)
    PCC_TRY(h.Take(h.api->weight_free(h.device, &uploaded), "weight_free"));
  PCC_TRY(launched);
  PCC_TRY(result.status());
  return CompareOutputs(*result, expected, MatmulTolerance(dtype));
}

// ---- ROPE -------------------------------------------------------------------------------------
enum class RopeCase { kNormal, kNeox, kPartialNormal, kPartialNeox, kFreqFactors, kYarn, kYarnNeox };

Verdict Rope(Harness& h, RopeCase c) {
  if (!h.Supports(PC_OP_ROPE, {PC_DTYPE_F32})) return NotClaimed();
  ref::RopeParams p;
  p.n_tokens = 7, p.n_heads = 3, p.head_dim = 64, p.n_rot = 64;
  p.neox = c == RopeCase::kNeox || c == RopeCase::kPartialNeox || c == RopeCase::kFreqFactors ||
           c == RopeCase::kYarnNeox;
  if (c == RopeCase::kPartialNormal || c == RopeCase::kPartialNeox) p.n_rot = 32;
  p.freq_base = c == RopeCase::kFreqFactors ? 500000.0f : 10000.0f;
  if (c == RopeCase::kYarn || c == RopeCase::kYarnNeox) {
    p.freq_scale = 0.25f, p.ext_factor = 1.0f, p.attn_factor = 1.0f;
    p.beta_fast = 32.0f, p.beta_slow = 1.0f, p.n_ctx_orig = 4096;
  }
  std::vector<float> x = h.RandomFloats(p.n_tokens * p.n_heads * p.head_dim);
  std::vector<int32_t> pos(p.n_tokens);
  for (auto& q : pos) q = static_cast<int32_t>(h.rng() % 64);
  pos[0] = 0;
  std::vector<float> ff;
  if (c == RopeCase::kFreqFactors) ff = h.RandomFloats(p.n_rot / 2, 1.0f, 8.0f);
  std::vector<float> expected = x;
  ref::Rope(expected, pos, ff, p);

  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  PCC_ASSIGN(pc_devptr_t d_pos, h.UploadVec(pos));
  pc_devptr_t d_ff = 0;
  if (!ff.empty()) {
    PCC_ASSIGN(d_ff, h.UploadVec(ff));
  }
  pc_rope_args_t a{};
  a.struct_size = sizeof(a);
  a.x = d_x, a.positions = d_pos, a.freq_factors = d_ff;
  a.n_tokens = p.n_tokens, a.n_heads = p.n_heads, a.head_dim = p.head_dim, a.n_rot = p.n_rot;
  a.mode = p.neox ? PC_ROPE_NEOX : PC_ROPE_NORMAL;
  a.freq_base = p.freq_base, a.freq_scale = p.freq_scale, a.ext_factor = p.ext_factor;
  a.attn_factor = p.attn_factor, a.beta_fast = p.beta_fast, a.beta_slow = p.beta_slow;
  a.n_ctx_orig = p.n_ctx_orig;
  PCC_TRY(h.Launch(PC_OP_ROPE, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_x, x.size()));
  // Plugins may compute theta in float by repeated multiplication (as ggml does).
  return CompareOutputs(out, expected, 1e-3);
}

// ---- KV_STORE ---------------------------------------------------------------------------------
// The cache as the device holds it, decoded with the kit's own converters: rows of head_dim
// (a block type quantizes each head's row on its own).
StatusOr<std::vector<float>> DecodeCache(Harness& h, pc_devptr_t dev, pc_dtype_t dtype,
                                         int64_t elems, int64_t head_dim) {
  const DType d = static_cast<DType>(dtype);
  const int64_t row_bytes = RowBytes(d, head_dim), rows = elems / head_dim;
  PC_ASSIGN_OR_RETURN(auto bytes, h.DownloadVec<uint8_t>(dev, rows * row_bytes));
  std::vector<float> values(elems);
  for (int64_t r = 0; r < rows; ++r) {
    if (!DequantizeRow(d, &bytes[r * row_bytes], &values[r * head_dim], head_dim))
      return Unimplemented("the SDK cannot decode " + Lower(dtype));
  }
  return values;
}

Verdict KvStore(Harness& h, CachePair types) {
  if (!h.Supports(PC_OP_KV_STORE, {types.k, types.v})) return NotClaimed();
  const int64_t n_blocks = 6, block_size = 16, n_kv_heads = 2, head_dim = 64, n_tokens = 21;
  const int64_t row = n_kv_heads * head_dim, cache_elems = n_blocks * block_size * row;
  const int64_t cache_rows = cache_elems / head_dim, new_rows = n_tokens * n_kv_heads;
  // The cache starts with random contents: slots not written must keep them.
  PCC_ENCODE(Encoded k_cache, Encode(types.k, h.RandomFloats(cache_elems), cache_rows, head_dim));
  PCC_ENCODE(Encoded v_cache, Encode(types.v, h.RandomFloats(cache_elems), cache_rows, head_dim));
  std::vector<int32_t> all_slots(n_blocks * block_size);
  std::iota(all_slots.begin(), all_slots.end(), 0);
  std::shuffle(all_slots.begin(), all_slots.end(), h.rng);
  std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n_tokens);
  slots[3] = -1, slots[11] = -1;  // skipped tokens (padding)
  std::vector<float> k = h.RandomFloats(n_tokens * row), v = h.RandomFloats(n_tokens * row);
  PCC_ENCODE(Encoded k_enc, Encode(types.k, k, new_rows, head_dim));
  PCC_ENCODE(Encoded v_enc, Encode(types.v, v, new_rows, head_dim));
  std::vector<float> want_k = k_cache.values, want_v = v_cache.values;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (slots[t] < 0) continue;
    std::copy_n(&k_enc.values[t * row], row, &want_k[slots[t] * row]);
    std::copy_n(&v_enc.values[t * row], row, &want_v[slots[t] * row]);
  }
  PCC_ASSIGN(pc_devptr_t d_kc, h.UploadVec(k_cache.bytes));
  PCC_ASSIGN(pc_devptr_t d_vc, h.UploadVec(v_cache.bytes));
  PCC_ASSIGN(pc_devptr_t d_k, h.UploadVec(k));
  PCC_ASSIGN(pc_devptr_t d_v, h.UploadVec(v));
  PCC_ASSIGN(pc_devptr_t d_slots, h.UploadVec(slots));
  pc_kv_store_args_t a{};
  a.struct_size = sizeof(a);
  a.k = d_k, a.v = d_v, a.k_cache = d_kc, a.v_cache = d_vc, a.slots = d_slots;
  a.cache_dtype = types.k, a.n_tokens = n_tokens, a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim, a.block_size = block_size;
  a.v_cache_dtype = types.v;
  PCC_TRY(h.Launch(PC_OP_KV_STORE, &a));
  PCC_ASSIGN(auto got_k, DecodeCache(h, d_kc, types.k, cache_elems, head_dim));
  PCC_ASSIGN(auto got_v, DecodeCache(h, d_vc, types.v, cache_elems, head_dim));
  // Float types: the inputs rounded to nearest even, exact. Block types: the SDK's encoding
  // (pc_ops.h) up to a rounding tie or an f16 scale rounded apart, well under 1e-2.
  const auto tol = [](pc_dtype_t d) { return Quantized(d) ? 1e-2 : 0.0; };
  Verdict vk = CompareOutputs(got_k, want_k, tol(types.k));
  if (vk.outcome != Outcome::kPass) return Fail("K cache: " + vk.detail);
  Verdict vv = CompareOutputs(got_v, want_v, tol(types.v));
  if (vv.outcome != Outcome::kPass) return Fail("V cache: " + vv.detail);
  return Pass(Quantized(types.k) || Quantized(types.v) ? "K " + vk.detail + ", V " + vv.detail
                                                       : "exact");
}

// ---- ATTENTION --------------------------------------------------------------------------------
// kWindow, kWindowPrefill: the sliding window of ABI 1.4 (shorter than a block, and across
// blocks), asked only of a 1.4 plugin.
enum class AttnCase { kDecode, kPrefill, kMixed, kWindow, kWindowPrefill };

Verdict Attention(Harness& h, CachePair types, AttnCase c) {
  // Per sequence: its length in the cache and its number of new query rows.
  std::vector<int32_t> seq_lens, n_q;
  ref::AttentionShape s;
  s.block_size = 16;
  if (c == AttnCase::kDecode) {  // GQA 8:2, one row per sequence, lengths incl. 1 and a block edge
    seq_lens = {37, 1, 70, 16}, n_q = {1, 1, 1, 1};
    s.n_heads = 8, s.n_kv_heads = 2, s.head_dim = 64;
  } else if (c == AttnCase::kPrefill || c == AttnCase::kWindowPrefill) {  // MHA, whole prompts
    seq_lens = {23, 40}, n_q = {23, 40};
    s.n_heads = 4, s.n_kv_heads = 4, s.head_dim = 64;
    if (c == AttnCase::kWindowPrefill) s.window = 20;
  } else {  // a prefill chunk after a cached prefix, a decode and a whole prompt in one batch
    seq_lens = {39, 17, 12}, n_q = {9, 1, 12};
    s.n_heads = 6, s.n_kv_heads = 2, s.head_dim = 128;
    if (c == AttnCase::kWindow) s.window = 7;
  }
  const pc_shape_class_t shape = c == AttnCase::kDecode    ? PC_SHAPE_DECODE
                                 : c == AttnCase::kPrefill ? PC_SHAPE_PREFILL
                                                           : PC_SHAPE_ANY;
  if (s.window > 0 && h.api->abi_minor < 4) return NotClaimed();  // the member came in 1.4
  if (!h.Supports(PC_OP_ATTENTION, {types.k, types.v}, shape)) return NotClaimed();
  s.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

  const int64_t n_seqs = seq_lens.size();
  std::vector<int32_t> query_start(n_seqs + 1, 0);
  int64_t total_blocks = 0, max_blocks = 0;
  for (int64_t i = 0; i < n_seqs; ++i) {
    query_start[i + 1] = query_start[i] + n_q[i];
    const int64_t b = (seq_lens[i] + s.block_size - 1) / s.block_size;
    total_blocks += b, max_blocks = std::max(max_blocks, b);
  }
  s.max_blocks_per_seq = max_blocks + 1;  // a padded table, as the framework sizes it
  const int64_t n_blocks = total_blocks + 2;  // unused blocks hold garbage that must not be read
  std::vector<int32_t> block_ids(n_blocks);
  std::iota(block_ids.begin(), block_ids.end(), 0);
  std::shuffle(block_ids.begin(), block_ids.end(), h.rng);
  std::vector<int32_t> block_tables(n_seqs * s.max_blocks_per_seq, 0);
  int64_t next = 0;
  for (int64_t i = 0; i < n_seqs; ++i) {
    const int64_t b = (seq_lens[i] + s.block_size - 1) / s.block_size;
    for (int64_t j = 0; j < b; ++j) block_tables[i * s.max_blocks_per_seq + j] = block_ids[next++];
  }
  const int64_t n_tokens = query_start[n_seqs];
  const int64_t cache_elems = n_blocks * s.block_size * s.n_kv_heads * s.head_dim;
  const int64_t cache_rows = cache_elems / s.head_dim;  // a block type quantizes each head's row
  PCC_ENCODE(Encoded kc,
             Encode(types.k, h.RandomFloats(cache_elems, -2, 2), cache_rows, s.head_dim));
  PCC_ENCODE(Encoded vc, Encode(types.v, h.RandomFloats(cache_elems), cache_rows, s.head_dim));
  std::vector<float> q = h.RandomFloats(n_tokens * s.n_heads * s.head_dim, -2, 2);
  std::vector<float> expected =
      ref::Attention(q, kc.values, vc.values, query_start, seq_lens, block_tables, s);

  PCC_ASSIGN(pc_devptr_t d_q, h.UploadVec(q));
  PCC_ASSIGN(pc_devptr_t d_kc, h.UploadVec(kc.bytes));
  PCC_ASSIGN(pc_devptr_t d_vc, h.UploadVec(vc.bytes));
  PCC_ASSIGN(pc_devptr_t d_out, h.Alloc(q.size() * sizeof(float)));
  PCC_ASSIGN(pc_devptr_t d_qs, h.UploadVec(query_start));
  PCC_ASSIGN(pc_devptr_t d_lens, h.UploadVec(seq_lens));
  PCC_ASSIGN(pc_devptr_t d_bt, h.UploadVec(block_tables));
  pc_attention_args_t a{};
  a.struct_size = sizeof(a);
  a.q = d_q, a.k_cache = d_kc, a.v_cache = d_vc, a.out = d_out;
  a.query_start = d_qs, a.seq_lens = d_lens, a.block_tables = d_bt, a.cache_dtype = types.k;
  a.v_cache_dtype = types.v;
  a.n_tokens = n_tokens, a.n_seqs = n_seqs, a.n_heads = s.n_heads, a.n_kv_heads = s.n_kv_heads;
  a.head_dim = s.head_dim, a.block_size = s.block_size;
  a.max_blocks_per_seq = s.max_blocks_per_seq;
  a.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
  a.scale = s.scale;
  a.window = s.window;
  PCC_TRY(h.Launch(PC_OP_ATTENTION, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, q.size()));
  return CompareOutputs(out, expected, AttentionTolerance(types));
}

// ---- SWIGLU, ADD ------------------------------------------------------------------------------
// SWIGLU and GEGLU: out = act(gate) * up, with the same args layout (gate, up, out, n).
template <typename Args>
Verdict GatedActivation(Harness& h, pc_op_t op, bool aliased,
                        std::vector<float> (*reference)(const std::vector<float>&,
                                                        const std::vector<float>&)) {
  if (!h.Supports(op, {PC_DTYPE_F32})) return NotClaimed();
  const int64_t n = 10007;
  std::vector<float> gate = h.RandomFloats(n, -6, 6), up = h.RandomFloats(n, -2, 2);
  PCC_ASSIGN(pc_devptr_t d_g, h.UploadVec(gate));
  PCC_ASSIGN(pc_devptr_t d_u, h.UploadVec(up));
  pc_devptr_t d_out = d_g;
  if (!aliased) {
    PCC_ASSIGN(d_out, h.Alloc(n * sizeof(float)));
  }
  Args a{sizeof(Args), d_g, d_u, d_out, n};
  PCC_TRY(h.Launch(op, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, n));
  return CompareOutputs(out, reference(gate, up), 1e-5);
}

Verdict Swiglu(Harness& h, bool aliased) {
  return GatedActivation<pc_swiglu_args_t>(h, PC_OP_SWIGLU, aliased, ref::Swiglu);
}

Verdict Geglu(Harness& h, bool aliased) {
  return GatedActivation<pc_geglu_args_t>(h, PC_OP_GEGLU, aliased, ref::Geglu);
}

Verdict Scale(Harness& h, bool aliased) {
  if (!h.Supports(PC_OP_SCALE, {PC_DTYPE_F32})) return NotClaimed();
  const int64_t n = 10007;
  const float scale = -21.5f;
  std::vector<float> x = h.RandomFloats(n, -4, 4), want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = x[i] * scale;
  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  pc_devptr_t d_out = d_x;
  if (!aliased) {
    PCC_ASSIGN(d_out, h.Alloc(n * sizeof(float)));
  }
  pc_scale_args_t a{sizeof(pc_scale_args_t), d_x, d_out, n, scale};
  PCC_TRY(h.Launch(PC_OP_SCALE, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, n));
  return CompareOutputs(out, want, 1e-7);  // one rounding: exact in float
}

Verdict Add(Harness& h, bool aliased) {
  if (!h.Supports(PC_OP_ADD, {PC_DTYPE_F32})) return NotClaimed();
  const int64_t n = 10007;
  std::vector<float> x = h.RandomFloats(n, -4, 4), y = h.RandomFloats(n, -4, 4);
  PCC_ASSIGN(pc_devptr_t d_a, h.UploadVec(x));
  PCC_ASSIGN(pc_devptr_t d_b, h.UploadVec(y));
  pc_devptr_t d_out = d_b;
  if (!aliased) {
    PCC_ASSIGN(d_out, h.Alloc(n * sizeof(float)));
  }
  pc_add_args_t a{sizeof(pc_add_args_t), d_a, d_b, d_out, n};
  PCC_TRY(h.Launch(PC_OP_ADD, &a));
  PCC_ASSIGN(auto out, h.DownloadVec<float>(d_out, n));
  return CompareOutputs(out, ref::Add(x, y), 1e-7);  // one rounding: exact in float
}

// ---- CONVERT ----------------------------------------------------------------------------------
// Float conversions are exact (round to nearest even), so they are compared bit for bit.
Verdict Convert(Harness& h, pc_dtype_t src, pc_dtype_t dst) {
  if (!h.Supports(PC_OP_CONVERT, {src, dst})) return NotClaimed();
  const int64_t n = Quantized(src) ? 256 * 7 : 10007;
  std::vector<float> values = h.RandomFloats(n, -100, 100);
  if (!Quantized(src)) {  // edge cases of the narrow formats: subnormals, overflow, signed zero
    const float specials[] = {0.0f, -0.0f, 1e-6f, -3e-5f, 1e-8f, 65504.0f, 65519.0f, 70000.0f,
                              -1e5f, 3.0e38f, 1.00048828125f, 1.0009765625f};
    std::copy(std::begin(specials), std::end(specials), values.begin());
  }
  PCC_ENCODE(Encoded in, Encode(src, values, 1, n));
  // Expected bytes of dst from the exact values of src.
  std::vector<uint8_t> want(n * (dst == PC_DTYPE_F32 ? 4 : 2));
  for (int64_t i = 0; i < n; ++i) {
    const float v = in.values[i];
    if (dst == PC_DTYPE_F32) {
      std::memcpy(&want[i * 4], &v, 4);
    } else {
      const uint16_t u = dst == PC_DTYPE_F16 ? ref::F32ToF16(v) : ref::F32ToBf16(v);
      std::memcpy(&want[i * 2], &u, 2);
    }
  }
  PCC_ASSIGN(pc_devptr_t d_src, h.UploadVec(in.bytes));
  PCC_ASSIGN(pc_devptr_t d_dst, h.Alloc(want.size()));
  pc_convert_args_t a{sizeof(pc_convert_args_t), d_src, d_dst, src, dst, n};
  PCC_TRY(h.Launch(PC_OP_CONVERT, &a));
  PCC_ASSIGN(auto got, h.DownloadVec<uint8_t>(d_dst, want.size()));
  if (Quantized(src)) {  // dequantization may fuse multiply-adds: compare with a tolerance
    std::vector<float> got_f(n);
    std::memcpy(got_f.data(), got.data(), n * 4);
    return CompareOutputs(got_f, in.values, 1e-6);
  }
  const size_t elem = dst == PC_DTYPE_F32 ? 4 : 2;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i * elem], &want[i * elem], elem) != 0) {
      uint32_t g = 0, w = 0;
      std::memcpy(&g, &got[i * elem], elem);
      std::memcpy(&w, &want[i * elem], elem);
      char buf[160];
      std::snprintf(buf, sizeof(buf), "element %lld (%g): got bits 0x%x, want 0x%x",
                    static_cast<long long>(i), in.values[i], g, w);
      return Fail(buf);
    }
  }
  return Pass("bit exact, " + std::to_string(n) + " elements");
}

// ---- MOE --------------------------------------------------------------------------------------
// decode: one token, weights not renormalised; prefill: 9 tokens over 8 experts (2 each, so
// experts are shared and some unused), renormalised, accumulating into out; uploaded: prefill
// with the three weights through weight_upload, in the layouts the plugin chose; mixed: the
// Q4_K_M mixture (gate/up Q4_K, down Q6_K).
// With `lora` (1.7, not PC_DTYPE_INVALID): per-expert low-rank terms of rank 32 with A and B
// of that type, on gate and down, and on up too except in the decode case (a projection
// without a term); asked of 1.7 plugins only.
enum class MoeCase { kDecode, kPrefill, kUploaded };

Verdict Moe(Harness& h, pc_dtype_t gate_dtype, pc_dtype_t down_dtype, MoeCase c,
            pc_dtype_t lora = PC_DTYPE_INVALID) {
  ref::MoeShape s;
  s.n_tokens = c == MoeCase::kDecode ? 1 : 9;
  s.n_embd = 256, s.n_ff = 256, s.n_experts = 8, s.n_used = 2;
  s.norm_weights = c != MoeCase::kDecode;
  s.accumulate = c != MoeCase::kDecode;
  const pc_dtype_t up_dtype = gate_dtype;
  if (!h.Supports(PC_OP_MOE, {gate_dtype, up_dtype, down_dtype, lora},
                  s.n_tokens == 1 ? PC_SHAPE_DECODE : PC_SHAPE_PREFILL))
    return NotClaimed();
  if (c == MoeCase::kUploaded && !PCC_HAS(h.api, weight_upload))
    return Skip("no weight_upload (optional)");
  const int64_t ff_rows = s.n_experts * s.n_ff, down_rows = s.n_experts * s.n_embd;
  PCC_ENCODE(Encoded gate, Encode(gate_dtype, h.RandomFloats(ff_rows * s.n_embd), ff_rows, s.n_embd));
  PCC_ENCODE(Encoded up, Encode(up_dtype, h.RandomFloats(ff_rows * s.n_embd), ff_rows, s.n_embd));
  PCC_ENCODE(Encoded down, Encode(down_dtype, h.RandomFloats(down_rows * s.n_ff), down_rows, s.n_ff));
  std::vector<float> x = h.RandomFloats(s.n_tokens * s.n_embd);
  std::vector<float> logits = h.RandomFloats(s.n_tokens * s.n_experts, -4, 4);
  std::vector<float> out = h.RandomFloats(s.n_tokens * s.n_embd);
  std::vector<float> expected = out;
  // The low-rank terms: A [n_experts * r, cols], B [n_experts * rows, r] of type `lora`.
  constexpr int64_t kRank = 32;
  ref::MoeLowRank low;
  Encoded low_a[3], low_b[3];
  const bool has_low = lora != PC_DTYPE_INVALID;
  for (int p = 0; has_low && p < 3; ++p) {
    if (p == 1 && c == MoeCase::kDecode) continue;
    const int64_t rows = p == 2 ? s.n_embd : s.n_ff, cols = p == 2 ? s.n_ff : s.n_embd;
    PCC_ENCODE(low_a[p],
               Encode(lora, h.RandomFloats(s.n_experts * kRank * cols), s.n_experts * kRank, cols));
    PCC_ENCODE(low_b[p],
               Encode(lora, h.RandomFloats(s.n_experts * rows * kRank), s.n_experts * rows, kRank));
    low.a[p] = low_a[p].values;
    low.b[p] = low_b[p].values;
    low.rank[p] = kRank;
    low.scale[p] = 0.3f * float(p + 1);
  }
  ref::Moe(x, logits, gate.values, up.values, down.values, s, expected, has_low ? &low : nullptr);

  struct Weight {
    pc_devptr_t ptr = 0;
    uint32_t layout = PC_LAYOUT_GGUF;
  };
  std::vector<pc_weight_t> uploaded;
  struct FreeAll {  // uploaded weights go back on every path out
    Harness& h;
    std::vector<pc_weight_t>& ws;
    ~FreeAll() {
      for (pc_weight_t& w : ws) (void)h.Take(h.api->weight_free(h.device, &w), "weight_free");
    }
  } free_all{h, uploaded};
  uploaded.reserve(3);
  auto place = [&](pc_dtype_t dtype, const Encoded& e, int64_t rows, int64_t cols)
      -> StatusOr<Weight> {
    if (c != MoeCase::kUploaded) {
      PC_ASSIGN_OR_RETURN(pc_devptr_t p, h.UploadVec(e.bytes));
      return Weight{p, PC_LAYOUT_GGUF};
    }
    pc_weight_t w{};
    w.struct_size = sizeof(w);
    PC_RETURN_IF_ERROR(h.Take(h.api->weight_upload(h.device, dtype, rows, cols, e.bytes.data(),
                                                   e.bytes.size(), &w),
                              "weight_upload"));
    uploaded.push_back(w);
    return Weight{w.data, w.layout};
  };
  PCC_ASSIGN(Weight d_gate, place(gate_dtype, gate, ff_rows, s.n_embd));
  PCC_ASSIGN(Weight d_up, place(up_dtype, up, ff_rows, s.n_embd));
  PCC_ASSIGN(Weight d_down, place(down_dtype, down, down_rows, s.n_ff));
  for (const Weight& w : {d_gate, d_up, d_down}) {
    if (w.layout != PC_LAYOUT_GGUF &&
        !h.Supports(PC_OP_MOE, {gate_dtype, up_dtype, down_dtype, lora}, PC_SHAPE_PREFILL,
                    w.layout))
      return Skip("the layout weight_upload chose is not claimed for MOE");
  }
  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  PCC_ASSIGN(pc_devptr_t d_logits, h.UploadVec(logits));
  PCC_ASSIGN(pc_devptr_t d_out, h.UploadVec(out));
  pc_moe_args_t a{};
  a.struct_size = sizeof(a);
  a.x = d_x, a.logits = d_logits, a.out = d_out;
  a.gate = d_gate.ptr, a.gate_dtype = gate_dtype, a.gate_layout = d_gate.layout;
  a.up = d_up.ptr, a.up_dtype = up_dtype, a.up_layout = d_up.layout;
  a.down = d_down.ptr, a.down_dtype = down_dtype, a.down_layout = d_down.layout;
  a.n_tokens = s.n_tokens, a.n_embd = s.n_embd, a.n_ff = s.n_ff;
  a.n_experts = s.n_experts, a.n_used = s.n_used;
  a.norm_weights = s.norm_weights ? 1 : 0, a.accumulate = s.accumulate ? 1 : 0;
  if (has_low) {
    a.lora_a_dtype = a.lora_b_dtype = lora;
    pc_devptr_t* ptrs[3][2] = {{&a.gate_lora_a, &a.gate_lora_b},
                               {&a.up_lora_a, &a.up_lora_b},
                               {&a.down_lora_a, &a.down_lora_b}};
    int64_t* ranks[3] = {&a.gate_lora_rank, &a.up_lora_rank, &a.down_lora_rank};
    float* scales[3] = {&a.gate_lora_scale, &a.up_lora_scale, &a.down_lora_scale};
    for (int p = 0; p < 3; ++p) {
      if (low.rank[p] == 0) continue;
      PCC_ASSIGN(*ptrs[p][0], h.UploadVec(low_a[p].bytes));
      PCC_ASSIGN(*ptrs[p][1], h.UploadVec(low_b[p].bytes));
      *ranks[p] = low.rank[p];
      *scales[p] = low.scale[p];
    }
  }
  PCC_TRY(h.Launch(PC_OP_MOE, &a));
  PCC_ASSIGN(auto result, h.DownloadVec<float>(d_out, out.size()));
  // Two chained products: the hidden activations may be rounded to the weight's precision
  // again before the down projection.
  double tol = 2 * std::max(MatmulTolerance(gate_dtype), MatmulTolerance(down_dtype));
  if (!has_low) return CompareOutputs(result, expected, tol);
  tol = std::max(tol, 2 * MatmulTolerance(lora));
  // The terms must move the output by more than the tolerance, or ignoring them would pass.
  std::vector<float> without = out;
  ref::Moe(x, logits, gate.values, up.values, down.values, s, without);
  const double moved = RelativeError(without, expected);
  if (moved < 4 * tol)
    return Fail("check too weak: the terms move the output by " + std::to_string(moved) + " only");
  Verdict v = CompareOutputs(result, expected, tol);
  v.detail += "; the terms move it by " + std::to_string(moved);
  return v;
}

// ---- LORA (1.8) -------------------------------------------------------------------------------
// rows: an interleaved, unordered list of rows of a batch (the rows of one of several adapters);
// contiguous: rows 0 (the first n_rows rows); uploaded: the list with A and B through
// weight_upload, in the layouts the plugin chose (those the host's adapters have); prefill:
// 40 of 48 rows listed (a plugin may take another kernel for many rows), uploaded where the
// plugin has weight_upload; in_order: the list, then at once a MATMUL reading out and one
// overwriting x (a plugin that runs a LORA launch beside the next ones, as the cpu plugin does
// a decode step's, must still give each launch what came before it).
enum class LoraCase { kRows, kContiguous, kUploaded, kPrefill, kInOrder };

Verdict Lora(Harness& h, pc_dtype_t a_dtype, pc_dtype_t b_dtype, LoraCase c) {
  // B's rows are rank long: a whole Q8_0 block needs a rank of 32 or more.
  const int64_t m = c == LoraCase::kPrefill ? 48 : 16, k = 256, n = 96;
  const int64_t rank = b_dtype == PC_DTYPE_Q8_0 ? 32 : 16;
  const float scale = 0.75f;
  std::vector<int32_t> rows = {13, 2, 6, 10, 15};
  if (c == LoraCase::kContiguous) rows = {0, 1, 2, 3, 4, 5};
  if (c == LoraCase::kPrefill) {
    rows.resize(m);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), h.rng);
    rows.resize(40);
  }
  PCC_ENCODE(Encoded a, Encode(a_dtype, h.RandomFloats(rank * k), rank, k));
  PCC_ENCODE(Encoded b, Encode(b_dtype, h.RandomFloats(n * rank), n, rank));
  std::vector<float> x = h.RandomFloats(m * k);
  std::vector<float> out = h.RandomFloats(m * n);  // the rows not listed must survive
  std::vector<float> expected = out;
  ref::Lora(x, a.values, b.values, rows, k, n, rank, scale, expected);

  pc_weight_t uploaded[2] = {};
  struct Free {  // the weights go back on every path out
    Harness& h;
    pc_weight_t* w;
    ~Free() {
      for (int i = 0; i < 2; ++i) {
        if (w[i].data != 0) (void)h.Take(h.api->weight_free(h.device, &w[i]), "weight_free");
      }
    }
  } free_weights{h, uploaded};
  pc_devptr_t d_a = 0, d_b = 0;
  uint32_t a_layout = PC_LAYOUT_GGUF, b_layout = PC_LAYOUT_GGUF;
  const bool upload = PCC_HAS(h.api, weight_upload);
  if (c == LoraCase::kUploaded && !upload) return Skip("no weight_upload (optional)");
  if (upload && (c == LoraCase::kUploaded || c == LoraCase::kPrefill ||
                 c == LoraCase::kInOrder)) {
    const Encoded* src[2] = {&a, &b};
    const pc_dtype_t dtypes[2] = {a_dtype, b_dtype};
    const int64_t shape[2][2] = {{rank, k}, {n, rank}};
    for (int i = 0; i < 2; ++i) {
      uploaded[i].struct_size = sizeof(uploaded[i]);
      PCC_TRY(h.Take(h.api->weight_upload(h.device, dtypes[i], shape[i][0], shape[i][1],
                                          src[i]->bytes.data(), src[i]->bytes.size(), &uploaded[i]),
                     "weight_upload"));
    }
    d_a = uploaded[0].data, a_layout = uploaded[0].layout;
    d_b = uploaded[1].data, b_layout = uploaded[1].layout;
  }
  const uint32_t layout = a_layout != PC_LAYOUT_GGUF ? a_layout : b_layout;
  if (!h.Supports(PC_OP_LORA, {a_dtype, b_dtype}, PC_SHAPE_ANY, layout)) return NotClaimed();
  if (d_a == 0) {
    PCC_ASSIGN(d_a, h.UploadVec(a.bytes));
    PCC_ASSIGN(d_b, h.UploadVec(b.bytes));
  }
  PCC_ASSIGN(pc_devptr_t d_x, h.UploadVec(x));
  PCC_ASSIGN(pc_devptr_t d_out, h.UploadVec(out));
  pc_devptr_t d_rows = 0;
  if (c != LoraCase::kContiguous) {
    PCC_ASSIGN(d_rows, h.UploadVec(rows));
  }
  pc_lora_args_t l{};
  l.struct_size = sizeof(l);
  l.x = d_x, l.out = d_out, l.m = m, l.rows = d_rows, l.n_rows = int64_t(rows.size());
  l.k = k, l.n = n, l.a = d_a, l.b = d_b, l.a_dtype = a_dtype, l.b_dtype = b_dtype;
  l.a_layout = a_layout, l.b_layout = b_layout, l.rank = rank, l.scale = scale;
  // in_order: read = out W1^T [m, 8], launched right after the LORA, then x = read W2^T [m, k]
  // (everything uploaded before the LORA: a copy would wait for it).
  const int64_t n_read = 8;
  const std::vector<float> w1 = h.RandomFloats(n_read * n), w2 = h.RandomFloats(k * n_read);
  pc_devptr_t d_w1 = 0, d_w2 = 0, d_read = 0;
  if (c == LoraCase::kInOrder) {
    PCC_ASSIGN(d_w1, h.UploadVec(w1));
    PCC_ASSIGN(d_w2, h.UploadVec(w2));
    PCC_ASSIGN(d_read, h.UploadVec(std::vector<float>(m * n_read)));
  }
  // Launched one after the other with no synchronize between them, as the host does.
  const auto launch = [&](pc_op_t op, const void* args) {
    return c == LoraCase::kInOrder ? h.Take(h.api->op_launch(h.stream, op, args), "op_launch")
                                   : h.Launch(op, args);
  };
  PCC_TRY(launch(PC_OP_LORA, &l));
  // Two chained products, each input possibly rounded to its weight's precision.
  const double tol = 2 * std::max(MatmulTolerance(a_dtype), MatmulTolerance(b_dtype));
  if (c == LoraCase::kInOrder) {
    pc_matmul_args_t mm{};
    mm.struct_size = sizeof(mm);
    mm.w_dtype = PC_DTYPE_F32, mm.w_layout = PC_LAYOUT_GGUF;
    mm.x = d_out, mm.w = d_w1, mm.out = d_read, mm.m = m, mm.n = n_read, mm.k = n;
    mm.x_stride = n, mm.out_stride = n_read;
    PCC_TRY(launch(PC_OP_MATMUL, &mm));
    mm.x = d_read, mm.w = d_w2, mm.out = d_x, mm.n = k, mm.k = n_read;
    mm.x_stride = n_read, mm.out_stride = k;
    PCC_TRY(launch(PC_OP_MATMUL, &mm));
    PCC_TRY(h.Sync());
    std::vector<float> read(m * n_read), new_x(m * k);
    ref::Matmul(expected, n, w1, {}, m, n_read, n, false, read, n_read);
    ref::Matmul(read, n_read, w2, {}, m, k, n_read, false, new_x, k);
    PCC_ASSIGN(auto got_out, h.DownloadVec<float>(d_out, out.size()));
    PCC_ASSIGN(auto got_read, h.DownloadVec<float>(d_read, read.size()));
    PCC_ASSIGN(auto got_x, h.DownloadVec<float>(d_x, new_x.size()));
    for (const auto& [got, want, what] :
         {std::tuple{&got_out, &expected, "out"}, {&got_read, &read, "out W1^T"},
          {&got_x, &new_x, "x overwritten"}}) {
      Verdict v = CompareOutputs(*got, *want, 2 * tol);
      if (v.outcome != Outcome::kPass) {
        v.detail = std::string(what) + ": " + v.detail;
        return v;
      }
    }
    return Pass();
  }
  PCC_ASSIGN(auto result, h.DownloadVec<float>(d_out, out.size()));
  // The term must move the output by more than the tolerance, or a no-op would pass.
  const double moved = RelativeError(out, expected);
  if (moved < 4 * tol)
    return Fail("check too weak: the term moves the output by " + std::to_string(moved) + " only");
  return CompareOutputs(result, expected, tol);
}

// Checks generated from the op list (pc_ops.def), for every op:
//   op.<name>.short_args_rejected  an args struct shorter than the op's first version is an
//                                  error, not a launch that reads past the caller's struct;
//   op.<name>.has_checks           the op has checks of its own above (fails for an op added
//                                  to the list without any: a new op cannot slip in untested).
template <typename Add>
void AddOpListChecks(const std::vector<Check>& checks, Add& add) {
  sdk::ForEachOp([&](auto t) {
    using T = decltype(t);
    const std::string prefix = std::string("op.") + T::kName + ".";
    const bool has_own = std::any_of(checks.begin(), checks.end(), [&](const Check& c) {
      return c.name.rfind(prefix, 0) == 0;
    });
    add(prefix + "short_args_rejected", [](Harness& h) -> Verdict {
      int n_dtypes = 0;
      T::Dtypes([&](auto, const char*, sdk::DtypeKind) { ++n_dtypes; });
      const pc_dtype_t f = PC_DTYPE_F32;
      const bool claimed = n_dtypes < 2    ? h.Supports(T::kOp, {f})
                           : n_dtypes == 2 ? h.Supports(T::kOp, {f, f})
                                           : h.Supports(T::kOp, {f, f, f});
      if (!claimed) return NotClaimed();
      typename T::Args a{};
      a.struct_size = sdk::OpArgsMinSizeOf<T>() - 1;
      const Status s = h.Launch(T::kOp, &a);
      if (s.ok()) return Fail("accepted struct_size " + std::to_string(a.struct_size));
      return Pass(s.ToString());
    });
    add(prefix + "has_checks", [has_own](Harness&) -> Verdict {
      if (has_own) return Pass();
      return Fail("pc_ops.def lists this op but the conformance kit has no check for it: add "
                  "its checks to src/runtime/conformance/checks_ops.cc");
    });
  });
}

}  // namespace

void AddOpChecks(std::vector<Check>& checks) {
  auto add = [&](std::string name, std::function<Verdict(Harness&)> fn) {
    checks.push_back({std::move(name), Stage::kDevice, std::move(fn)});
  };
  for (pc_dtype_t d : kWeightDtypes)
    add("op.embedding." + Lower(d), [d](Harness& h) { return Embedding(h, d); });
  for (pc_dtype_t d : kWeightDtypes) {
    add("op.embedding." + Lower(d) + ".uploaded",
        [d](Harness& h) { return EmbeddingUploaded(h, d); });
  }
  add("op.rms_norm.weighted", [](Harness& h) { return RmsNorm(h, true, false); });
  add("op.rms_norm.in_place_unweighted", [](Harness& h) { return RmsNorm(h, false, true); });
  for (pc_dtype_t d : kWeightDtypes) {
    const std::string base = "op.matmul." + Lower(d);
    add(base + ".decode", [d](Harness& h) { return Matmul(h, d, MatmulCase::kDecode); });
    add(base + ".decode_long",
        [d](Harness& h) { return Matmul(h, d, MatmulCase::kDecodeLong); });
    add(base + ".prefill", [d](Harness& h) { return Matmul(h, d, MatmulCase::kPrefill); });
    add(base + ".accumulate", [d](Harness& h) { return Matmul(h, d, MatmulCase::kAccumulate); });
    add(base + ".uploaded", [d](Harness& h) { return Matmul(h, d, MatmulCase::kUploaded); });
  }
  const std::pair<const char*, RopeCase> ropes[] = {
      {"normal", RopeCase::kNormal},           {"neox", RopeCase::kNeox},
      {"partial_normal", RopeCase::kPartialNormal}, {"partial_neox", RopeCase::kPartialNeox},
      {"freq_factors", RopeCase::kFreqFactors}, {"yarn", RopeCase::kYarn},
      {"yarn_neox", RopeCase::kYarnNeox}};
  for (auto [name, c] : ropes) add(std::string("op.rope.") + name, [c](Harness& h) { return Rope(h, c); });
  // One KV type for K and V (op.kv_store.q8_0), then K and V apart (op.kv_store.f16_q8_0: K's
  // type, V's type), which only a 1.6 plugin is asked about.
  std::vector<std::pair<std::string, CachePair>> cache_types;
  for (pc_dtype_t d : kCacheDtypes) cache_types.push_back({Lower(d), {d, d}});
  for (CachePair p : kMixedCachePairs) cache_types.push_back({Lower(p.k) + "_" + Lower(p.v), p});
  for (const auto& [name, pair] : cache_types) {
    const CachePair d = pair;  // a copy: the lambdas below capture it by value
    add("op.kv_store." + name, [d](Harness& h) { return KvStore(h, d); });
    const std::string base = "op.attention." + name;
    add(base + ".decode", [d](Harness& h) { return Attention(h, d, AttnCase::kDecode); });
    add(base + ".prefill", [d](Harness& h) { return Attention(h, d, AttnCase::kPrefill); });
    add(base + ".mixed", [d](Harness& h) { return Attention(h, d, AttnCase::kMixed); });
    add(base + ".window", [d](Harness& h) { return Attention(h, d, AttnCase::kWindow); });
    add(base + ".window_prefill",
        [d](Harness& h) { return Attention(h, d, AttnCase::kWindowPrefill); });
  }
  add("op.swiglu", [](Harness& h) { return Swiglu(h, false); });
  add("op.swiglu.aliased", [](Harness& h) { return Swiglu(h, true); });
  add("op.geglu", [](Harness& h) { return Geglu(h, false); });
  add("op.geglu.aliased", [](Harness& h) { return Geglu(h, true); });
  add("op.scale", [](Harness& h) { return Scale(h, false); });
  add("op.scale.in_place", [](Harness& h) { return Scale(h, true); });
  add("op.add", [](Harness& h) { return Add(h, false); });
  add("op.add.aliased", [](Harness& h) { return Add(h, true); });
  for (pc_dtype_t s : kFloatDtypes) {
    for (pc_dtype_t d : kFloatDtypes)
      add("op.convert." + Lower(s) + "_" + Lower(d), [s, d](Harness& h) { return Convert(h, s, d); });
  }
  for (pc_dtype_t s : kWeightDtypes) {
    if (!Quantized(s)) continue;
    add("op.convert." + Lower(s) + "_f32",
        [s](Harness& h) { return Convert(h, s, PC_DTYPE_F32); });
  }
  for (pc_dtype_t d : kWeightDtypes) {
    const std::string base = "op.moe." + Lower(d);
    add(base + ".decode", [d](Harness& h) { return Moe(h, d, d, MoeCase::kDecode); });
    add(base + ".prefill", [d](Harness& h) { return Moe(h, d, d, MoeCase::kPrefill); });
    add(base + ".uploaded", [d](Harness& h) { return Moe(h, d, d, MoeCase::kUploaded); });
  }
  add("op.moe.q4_k_q6_k.prefill", [](Harness& h) {
    return Moe(h, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K, MoeCase::kPrefill);
  });
  // Per-expert low-rank terms (1.7): on GGUF Q8_0 experts (a plugin's expert-by-expert path)
  // and on uploaded Q4_K/Q6_K ones (a plugin's own layout), A and B in F32 or Q8_0.
  for (pc_dtype_t lora : {PC_DTYPE_F32, PC_DTYPE_Q8_0}) {
    const std::string base = "op.moe.lora_" + Lower(lora);
    add(base + ".decode", [lora](Harness& h) {
      return Moe(h, PC_DTYPE_Q8_0, PC_DTYPE_Q8_0, MoeCase::kDecode, lora);
    });
    add(base + ".prefill", [lora](Harness& h) {
      return Moe(h, PC_DTYPE_Q8_0, PC_DTYPE_Q8_0, MoeCase::kPrefill, lora);
    });
    add(base + ".uploaded", [lora](Harness& h) {
      return Moe(h, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K, MoeCase::kUploaded, lora);
    });
  }
  add("op.moe.q4_k_q6_k.uploaded", [](Harness& h) {
    return Moe(h, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K, MoeCase::kUploaded);
  });
  // The types adapters have (lora.h): A and B alike, or a Q8_0 A with an F16 or Q8_0 B.
  const std::pair<pc_dtype_t, pc_dtype_t> lora_types[] = {{PC_DTYPE_F32, PC_DTYPE_F32},
                                                          {PC_DTYPE_F16, PC_DTYPE_F16},
                                                          {PC_DTYPE_BF16, PC_DTYPE_BF16},
                                                          {PC_DTYPE_Q8_0, PC_DTYPE_F16},
                                                          {PC_DTYPE_Q8_0, PC_DTYPE_Q8_0}};
  for (auto [a, b] : lora_types) {
    const std::string base = "op.lora." + Lower(a) + "_" + Lower(b);
    add(base + ".rows", [a, b](Harness& h) { return Lora(h, a, b, LoraCase::kRows); });
    add(base + ".contiguous", [a, b](Harness& h) { return Lora(h, a, b, LoraCase::kContiguous); });
    add(base + ".uploaded", [a, b](Harness& h) { return Lora(h, a, b, LoraCase::kUploaded); });
    add(base + ".prefill", [a, b](Harness& h) { return Lora(h, a, b, LoraCase::kPrefill); });
    add(base + ".in_order", [a, b](Harness& h) { return Lora(h, a, b, LoraCase::kInOrder); });
  }
  AddOpListChecks(checks, add);
}

}  // namespace polychip::runtime::conformance
