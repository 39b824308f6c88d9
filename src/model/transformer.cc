#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "model/arch.h"

namespace polychip::model {

using runtime::DevPtr;

namespace {

// A logit no expert chosen by the routing gets in a piece's launch: its softmax weight is 0 in
// F32 (exp(-1e4) underflows), and it is finite, so that no plugin's exp sees an infinity.
constexpr float kNotChosen = -1e4f;

// MOE's routing (pc_ops.h) of one token: the weight of each of the n logits' experts, zero for
// those not among the n_used chosen.
void RouteToken(const float* logits, int64_t n, int64_t n_used, bool norm, float* w) {
  const float max = *std::max_element(logits, logits + n);
  float sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += w[e] = std::exp(logits[e] - max);
  for (int64_t e = 0; e < n; ++e) w[e] /= sum;
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return w[a] > w[b]; });
  float chosen = 0;
  for (int64_t i = 0; i < n_used; ++i) chosen += w[order[i]];
  const float scale = norm ? 1 / std::max(chosen, 0x1p-14f) : 1;
  for (int64_t i = 0; i < n; ++i) w[order[i]] = i < n_used ? w[order[i]] * scale : 0;
}

// A float vector of rows [begin, begin + count) of a 2-D tensor (3-D: its matrices stacked)
// in the file, dequantized.
std::vector<float> HostRows(const GgufTensor& t, int64_t begin, int64_t count) {
  const int64_t cols = t.row_len(), row_bytes = RowBytes(t.dtype, cols);
  std::vector<float> out(size_t(count * cols));
  for (int64_t r = 0; r < count; ++r) {
    PC_CHECK(DequantizeRow(t.dtype, t.data + (begin + r) * row_bytes, out.data() + r * cols, cols));
  }
  return out;
}

// y [n] (+)= W [n, k] x [k].
void HostMatVec(const float* w, const float* x, int64_t n, int64_t k, float* y, bool add) {
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    const float* wi = w + i * k;
    for (int64_t j = 0; j < k; ++j) acc += double(wi[j]) * x[j];
    y[i] = add ? y[i] + float(acc) : float(acc);
  }
}

// The input x [k] of a product with a weight of type `w`, as the devices multiply it: against
// a quantized weight the cpu plugin's MATMUL and MOE (and llama.cpp's) round x to int8 in
// blocks of 32 first, so x comes back so rounded (in *buf); against a float weight, x itself.
// Unrounded, an adapter's Q8_0 A alone moved perplexity 0.17-0.52% from llama.cpp's on an F32
// base (docs/lora.md).
const float* RoundedInput(DType w, const float* x, int64_t k, std::vector<float>* buf) {
  if (w == DType::kF32 || w == DType::kF16 || w == DType::kBF16 || k % 32 != 0) return x;
  std::vector<uint8_t> q8(size_t(RowBytes(DType::kQ8_0, k)));
  buf->resize(size_t(k));
  PC_CHECK(QuantizeRow(DType::kQ8_0, x, q8.data(), k));
  PC_CHECK(DequantizeRow(DType::kQ8_0, q8.data(), buf->data(), k));
  return buf->data();
}

// The feed-forward of a mixture of experts under an adapter of the experts, on the host, as
// MOE defines it (pc_ops.h) with each chosen expert's matrices W_e + s B_e A_e: out [rows,
// n_embd] = sum over the chosen experts of w_e down'_e(silu(gate'_e x) * up'_e x), for the
// rows xn [rows, n_embd] routed by logits [rows, n_expert]. The low-rank terms are applied as
// two products (W_e x + s B_e (A_e x)), never merged.
Status HostAdaptedExperts(const GgufFile& base, const LoraAdapter& adapter, float scale,
                          const ModelConfig& c, int64_t layer, const float* xn,
                          const float* logits, int64_t rows, float* out) {
  const int64_t E = c.n_expert, ff = c.n_ff_exp, d = c.n_embd;
  const GgufTensor* w[3];
  const LoraPair* p[3];
  const char* names[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
  for (int m = 0; m < 3; ++m) {
    w[m] = base.FindTensor(LayerTensorName(layer, names[m]));
    if (w[m] == nullptr) return NotFound(base.path() + ": no " + LayerTensorName(layer, names[m]));
    p[m] = adapter.Find(LoraSlot(layer, static_cast<LoraKind>(kLoraGateExps + m)));
  }
  std::vector<float> weights(size_t(rows * E));
  for (int64_t t = 0; t < rows; ++t) {
    RouteToken(logits + t * E, E, c.n_expert_used, c.moe_norm_weights, weights.data() + t * E);
  }
  std::fill(out, out + rows * d, 0.0f);
  std::vector<float> g(static_cast<size_t>(ff)), u(static_cast<size_t>(ff)),
      y(static_cast<size_t>(d)), low, x_rounded, low_rounded;
  for (int64_t e = 0; e < E; ++e) {
    bool used = false;
    for (int64_t t = 0; t < rows && !used; ++t) used = weights[size_t(t * E + e)] > 0;
    if (!used) continue;
    // Expert e's matrices (rows of the stacked ones: gate/up [ff, d], down [d, ff]) and pairs.
    const int64_t n_out[3] = {ff, ff, d};
    std::vector<float> we[3], ae[3], be[3];
    float factor[3] = {0, 0, 0};
    for (int m = 0; m < 3; ++m) {
      we[m] = HostRows(*w[m], e * n_out[m], n_out[m]);
      if (p[m] == nullptr) continue;
      const int64_t r = p[m]->rank;
      ae[m] = HostRows(*p[m]->a, e * r, r);
      be[m] = HostRows(*p[m]->b, e * n_out[m], n_out[m]);
      factor[m] = adapter.Factor(r, scale);
    }
    // W_e x + s B_e (A_e x), into y [n_out[m]], each product's input rounded as the device's
    // MATMUL rounds it for that weight's type (RoundedInput): the rows of the step that MOE
    // and MATMUL compute, and llama.cpp, multiply so.
    auto product = [&](int m, const float* x, float* dst) {
      const int64_t k = m == 2 ? ff : d;
      HostMatVec(we[m].data(), RoundedInput(w[m]->dtype, x, k, &x_rounded), n_out[m], k, dst,
                 false);
      if (p[m] == nullptr || factor[m] == 0) return;
      const int64_t r = p[m]->rank;
      low.resize(size_t(r));
      HostMatVec(ae[m].data(), RoundedInput(p[m]->a->dtype, x, k, &x_rounded), r, k, low.data(),
                 false);
      for (float& v : low) v *= factor[m];
      HostMatVec(be[m].data(), RoundedInput(p[m]->b->dtype, low.data(), r, &low_rounded),
                 n_out[m], r, dst, true);
    };
    for (int64_t t = 0; t < rows; ++t) {
      const float wt = weights[size_t(t * E + e)];
      if (wt <= 0) continue;
      const float* x = xn + t * d;
      product(0, x, g.data());
      product(1, x, u.data());
      for (int64_t i = 0; i < ff; ++i) {  // silu(gate) * up
        g[size_t(i)] = g[size_t(i)] / (1 + std::exp(-g[size_t(i)])) * u[size_t(i)];
      }
      product(2, g.data(), y.data());
      for (int64_t i = 0; i < d; ++i) out[t * d + i] += wt * y[size_t(i)];
    }
  }
  return Status::Ok();
}

}  // namespace

Status StreamLauncher::HostCompute(DevPtr in, int64_t in_floats, DevPtr out, int64_t out_floats,
                                   const HostFn& fn) {
  std::vector<float> host_in(in_floats), host_out(out_floats);
  PC_RETURN_IF_ERROR(stream_.CopyD2H(host_in.data(), in, uint64_t(in_floats) * 4));
  PC_RETURN_IF_ERROR(stream_.Synchronize());
  fn(host_in.data(), host_out.data());
  PC_RETURN_IF_ERROR(stream_.CopyH2D(out, host_out.data(), uint64_t(out_floats) * 4));
  return stream_.Synchronize();  // host_out dies here
}

StatusOr<Transformer> Transformer::Create(const ModelConfig& config,
                                          const ModelWeights& weights) {
  if (config.head_dim_v != config.head_dim) {
    return Unimplemented("value head size " + std::to_string(config.head_dim_v) +
                         " differs from key head size " + std::to_string(config.head_dim));
  }
  if (config.n_head_kv <= 0 || config.n_head % config.n_head_kv != 0) {
    return InvalidArgument("head_count " + std::to_string(config.n_head) +
                           " is not a multiple of head_count_kv " +
                           std::to_string(config.n_head_kv));
  }
  if (config.n_rot > config.head_dim || config.n_rot % 2 != 0) {
    return InvalidArgument("rope dimension " + std::to_string(config.n_rot) + " invalid");
  }
  return Transformer(config, weights, GetArch(config.arch).rope_mode);
}

Status Transformer::ApplyLora(Launcher& ops, DevPtr x, const MatrixRef& w, DevPtr out, int64_t m,
                              const LoraRuns& lora, int32_t slot) const {
  if (lora.groups.empty()) {  // POLYCHIP_LORA_COMPOSED=1
    for (const LoraSegment& seg : lora.segments) {
      PC_RETURN_IF_ERROR(ComposeLora(ops, x, w, out, seg, lora.scratch, slot));
    }
    return Status::Ok();
  }
  for (const LoraGroup& g : lora.groups) {
    const DeviceLora::Matrix* ab = g.lora->Find(slot);
    if (ab == nullptr) continue;
    const float factor = g.lora->adapter->Factor(ab->rank, g.scale);
    if (factor == 0) continue;
    runtime::LoraArgs op;  // out[rows] += factor (x[rows] A^T) B^T
    if (g.rows == 0) {     // one run: its rows, from the first
      op.x = x + uint64_t(g.begin * w.cols) * 4;
      op.out = out + uint64_t(g.begin * w.rows) * 4;
      op.m = g.n_rows;
    } else {
      op.x = x;
      op.out = out;
      op.m = m;
      op.rows = g.rows;
    }
    op.n_rows = g.n_rows;
    op.k = w.cols;
    op.n = w.rows;
    op.a = ab->a.data;
    op.b = ab->b.data;
    op.a_dtype = ab->a.dtype;
    op.b_dtype = ab->b.dtype;
    op.a_layout = ab->a.layout;
    op.b_layout = ab->b.layout;
    op.rank = ab->rank;
    op.scale = factor;
    if (ops.RunsOnDevice(op)) {
      PC_RETURN_IF_ERROR(ops.Launch(op));
      continue;
    }
    // A device without LORA for these types and layouts (vulkan, a plugin older than 1.8).
    for (const LoraSegment& seg : lora.segments) {
      if (seg.lora != g.lora || seg.scale != g.scale) continue;
      PC_RETURN_IF_ERROR(ComposeLora(ops, x, w, out, seg, lora.scratch, slot));
    }
  }
  return Status::Ok();
}

Status Transformer::ComposeLora(Launcher& ops, DevPtr x, const MatrixRef& w, DevPtr out,
                                const LoraSegment& seg, DevPtr scratch, int32_t slot) const {
  const DeviceLora::Matrix* ab = seg.lora->Find(slot);
  if (ab == nullptr) return Status::Ok();
  const float factor = seg.lora->adapter->Factor(ab->rank, seg.scale);
  if (factor == 0) return Status::Ok();
  // t [rows, rank] = x A^T; t *= factor; out += t B^T
  runtime::MatmulArgs down;
  down.x = x + uint64_t(seg.begin * w.cols) * 4;
  down.w = ab->a.data;
  down.w_dtype = ab->a.dtype;
  down.w_layout = ab->a.layout;
  down.out = scratch;
  down.m = seg.rows;
  down.n = ab->rank;
  down.k = w.cols;
  PC_RETURN_IF_ERROR(ops.Launch(down));
  if (factor != 1) {
    runtime::ScaleArgs scale;
    scale.x = scratch;
    scale.out = scratch;
    scale.n = seg.rows * ab->rank;
    scale.scale = factor;
    PC_RETURN_IF_ERROR(ops.Launch(scale));
  }
  runtime::MatmulArgs up;
  up.x = scratch;
  up.w = ab->b.data;
  up.w_dtype = ab->b.dtype;
  up.w_layout = ab->b.layout;
  up.out = out + uint64_t(seg.begin * w.rows) * 4;
  up.m = seg.rows;
  up.n = w.rows;
  up.k = ab->rank;
  up.accumulate = 1;
  return ops.Launch(up);
}

Status Transformer::Matmul(Launcher& ops, DevPtr x, const MatrixRef& w,
                           DevPtr bias, DevPtr out, int64_t m, bool accumulate,
                           const LoraRuns& lora, int32_t slot) const {
  if (!lora.segments.empty() && slot >= 0) {
    PC_RETURN_IF_ERROR(Matmul(ops, x, w, bias, out, m, accumulate));
    return ApplyLora(ops, x, w, out, m, lora, slot);
  }
  if (!w.pieces.empty()) {
    // Split by rows (model_loader.h): each piece writes its columns of out [m, w.rows].
    for (const MatrixRef& piece : w.pieces) {
      runtime::MatmulArgs a;
      a.x = x;
      a.w = piece.data;
      a.w_dtype = piece.dtype;
      a.w_layout = piece.layout;
      a.bias = bias != 0 ? bias + uint64_t(piece.begin) * 4 : 0;
      a.out = out + uint64_t(piece.begin) * 4;
      a.m = m;
      a.n = piece.rows;
      a.k = piece.cols;
      a.x_stride = w.cols;
      a.out_stride = w.rows;
      a.accumulate = accumulate;
      PC_RETURN_IF_ERROR(ops.Launch(a));
    }
    return Status::Ok();
  }
  runtime::MatmulArgs a;
  a.x = x;
  a.w = w.data;
  a.w_dtype = w.dtype;
  a.w_layout = w.layout;
  a.bias = bias;
  a.out = out;
  a.m = m;
  a.n = w.rows;
  a.k = w.cols;
  a.accumulate = accumulate;
  return ops.Launch(a);
}

Status Transformer::Rope(Launcher& ops, DevPtr x, DevPtr positions,
                         int64_t n_tokens, int64_t n_heads, bool sliding) const {
  const ModelConfig& c = *c_;
  runtime::RopeArgs a;
  a.x = x;
  a.positions = positions;
  a.freq_factors = w_->rope_freqs;
  a.n_tokens = n_tokens;
  a.n_heads = n_heads;
  a.head_dim = c.head_dim;
  a.n_rot = static_cast<int32_t>(c.n_rot);
  a.mode = rope_mode_;
  a.freq_base = c.rope_freq_base;
  // Linear and YaRN scaling both interpolate positions by 1/factor; YaRN additionally mixes in
  // extrapolation for the high frequencies (ext_factor 1, as llama.cpp defaults for YaRN).
  a.freq_scale = c.rope_scaling == RopeScaling::kNone ? 1.f : 1.f / c.rope_scaling_factor;
  a.ext_factor = c.rope_scaling == RopeScaling::kYarn ? 1.f : 0.f;
  a.attn_factor = c.rope_attn_factor;  // 1 but for phi3's LongRoPE
  a.beta_fast = 32.f;
  a.beta_slow = 1.f;
  a.n_ctx_orig = static_cast<int32_t>(c.rope_orig_ctx > 0 ? c.rope_orig_ctx : c.n_ctx_train);
  if (sliding) {  // gemma3's local layers: their own base, never scaled (as llama.cpp)
    a.freq_base = c.rope_freq_base_swa;
    a.freq_scale = 1.f;
    a.ext_factor = 0.f;
  }
  return ops.Launch(a);
}

Status Transformer::HeadNorm(Launcher& ops, DevPtr x, DevPtr weight,
                             int64_t n_tokens, int64_t n_heads) const {
  // The rows of the norm are the heads: [n_tokens * n_heads, head_dim].
  runtime::RmsNormArgs a;
  a.x = x;
  a.weight = weight;
  a.out = x;
  a.n_rows = n_tokens * n_heads;
  a.dim = c_->head_dim;
  a.eps = c_->rms_eps;
  return ops.Launch(a);
}

Status Transformer::Layers(Launcher& ops, const StepInputs& in,
                           const StepBuffers& b, const KvCacheView& kv) const {
  const ModelConfig& c = *c_;
  const int64_t T = in.n_tokens;

  runtime::EmbeddingArgs emb;
  emb.table = w_->embd;
  emb.table_dtype = w_->embd_dtype;
  emb.table_layout = w_->embd_layout;
  emb.n_rows = c.n_vocab;
  emb.row_len = c.n_embd;
  emb.ids = in.tokens;
  emb.n_ids = T;
  emb.out = b.x;
  const bool vocab_parallel = tp_ != nullptr && tp_->size > 1;
  // A vocabulary shard's ids are local (VocabShard::LocalId): a token of another rank's range
  // reads a zero row, so the sum over the ranks is each token's own row.
  if (vocab_parallel) emb.n_rows = w_->vocab.rows;
  const bool pipeline = pp_ != nullptr && pp_->n_stages > 1;
  if (!pipeline || pp_->first()) {
    if (w_->embd_pieces.empty()) {
      PC_RETURN_IF_ERROR(ops.Launch(emb));
    } else {
      // A table split by rows (model_loader.h): each piece gathers with its own ids (a token
      // outside it reads its zero row), the first into x, the others through xn, added up.
      for (size_t i = 0; i < w_->embd_pieces.size(); ++i) {
        const TablePiece& piece = w_->embd_pieces[i];
        emb.table = piece.data;
        emb.n_rows = piece.count + 1;
        emb.ids = in.piece_tokens + i * uint64_t(in.piece_tokens_stride) * 4;
        emb.out = i == 0 ? b.x : b.xn;
        PC_RETURN_IF_ERROR(ops.Launch(emb));
        if (i == 0) continue;
        runtime::AddArgs add;
        add.a = b.x;
        add.b = b.xn;
        add.out = b.x;
        add.n = T * c.n_embd;
        PC_RETURN_IF_ERROR(ops.Launch(add));
      }
    }
    if (vocab_parallel) PC_RETURN_IF_ERROR(ops.AllReduce(*tp_, b.x, T));
    if (c.embd_scale != 1.0f) {  // gemma3: x *= sqrt(n_embd)
      runtime::ScaleArgs scale;
      scale.x = b.x;
      scale.out = b.x;
      scale.n = T * c.n_embd;
      scale.scale = c.embd_scale;
      PC_RETURN_IF_ERROR(ops.Launch(scale));
    }
  } else {
    PC_RETURN_IF_ERROR(ops.Recv(*pp_, b.x, T));  // the previous stage's hidden states
  }

  const LoraRuns lora{in.lora, b.lora, in.lora_base, in.lora_groups};
  const int64_t first_layer = pipeline ? pp_->first_layer : 0;
  const int64_t end_layer = pipeline ? pp_->end_layer : c.n_layer;
  for (int64_t l = first_layer; l < end_layer; ++l) {
    const LayerWeights& L = w_->layers[l];
    const bool sliding = c.IsSlidingLayer(l);

    // ---- attention ----
    runtime::RmsNormArgs norm;
    norm.x = b.x;
    norm.weight = L.attn_norm;
    norm.out = b.xn;
    norm.n_rows = T;
    norm.dim = c.n_embd;
    norm.eps = c.rms_eps;
    PC_RETURN_IF_ERROR(ops.Launch(norm));

    // [T, n_head*hd], [T, n_head_kv*hd], [T, n_head_kv*hd]. The adapters' terms after the three
    // base products, next to each other: a plugin that runs a LORA launch beside the next
    // independent one (the cpu plugin, launch_overlap.h) runs them two at a time.
    PC_RETURN_IF_ERROR(Matmul(ops, b.xn, L.wq, L.bq, b.q, T, false));
    PC_RETURN_IF_ERROR(Matmul(ops, b.xn, L.wk, L.bk, b.k, T, false));
    PC_RETURN_IF_ERROR(Matmul(ops, b.xn, L.wv, L.bv, b.v, T, false));
    if (!lora.segments.empty()) {
      PC_RETURN_IF_ERROR(ApplyLora(ops, b.xn, L.wq, b.q, T, lora, LoraSlot(l, kLoraQ)));
      PC_RETURN_IF_ERROR(ApplyLora(ops, b.xn, L.wk, b.k, T, lora, LoraSlot(l, kLoraK)));
      PC_RETURN_IF_ERROR(ApplyLora(ops, b.xn, L.wv, b.v, T, lora, LoraSlot(l, kLoraV)));
    }
    if (L.q_norm != 0) PC_RETURN_IF_ERROR(HeadNorm(ops, b.q, L.q_norm, T, c.n_head));
    if (L.k_norm != 0) PC_RETURN_IF_ERROR(HeadNorm(ops, b.k, L.k_norm, T, c.n_head_kv));
    PC_RETURN_IF_ERROR(Rope(ops, b.q, in.positions, T, c.n_head, sliding));
    PC_RETURN_IF_ERROR(Rope(ops, b.k, in.positions, T, c.n_head_kv, sliding));

    runtime::KvStoreArgs store;
    store.k = b.k;
    store.v = b.v;
    store.k_cache = kv.k[l][0];
    store.v_cache = kv.v[l][0];
    const bool own_pool = sliding && kv.window_pool;
    store.slots = own_pool ? in.window_slots : in.slots;
    store.cache_dtype = kv.dtypes.k;
    store.v_cache_dtype = kv.dtypes.v;
    store.n_tokens = T;
    store.n_kv_heads = c.n_head_kv;
    store.head_dim = c.head_dim;
    store.block_size = kv.block_size;
    const bool pooled = !own_pool && !in.pool_runs.empty();
    if (!pooled) PC_RETURN_IF_ERROR(ops.Launch(store));

    runtime::AttentionArgs att;
    att.q = b.q;
    att.k_cache = kv.k[l][0];
    att.v_cache = kv.v[l][0];
    att.out = b.attn;
    att.query_start = in.query_start;
    att.seq_lens = in.seq_lens;
    att.block_tables = own_pool ? in.window_block_tables : in.block_tables;
    att.cache_dtype = kv.dtypes.k;
    att.v_cache_dtype = kv.dtypes.v;
    att.n_tokens = T;
    att.n_seqs = in.n_seqs;
    att.n_heads = c.n_head;
    att.n_kv_heads = c.n_head_kv;
    att.head_dim = c.head_dim;
    att.block_size = kv.block_size;
    att.max_blocks_per_seq = in.max_blocks_per_seq;
    att.max_seq_len = in.max_seq_len;
    att.scale = c.attn_scale > 0 ? c.attn_scale
                                 : 1.f / std::sqrt(static_cast<float>(c.head_dim));
    att.window = sliding ? c.sliding_window : 0;
    if (!pooled) PC_RETURN_IF_ERROR(ops.Launch(att));
    // The KV cache in pools: each run of sequences stores into and attends over its pool's
    // buffers, on its own rows of k, v, q and attn.
    for (const KvPoolRun& run : pooled ? in.pool_runs : std::span<const KvPoolRun>()) {
      store.k = b.k + uint64_t(run.token_begin * c.kv_dim()) * 4;
      store.v = b.v + uint64_t(run.token_begin * c.kv_dim()) * 4;
      store.k_cache = att.k_cache = kv.k[l][run.pool];
      store.v_cache = att.v_cache = kv.v[l][run.pool];
      store.slots = run.slots;
      store.n_tokens = att.n_tokens = run.n_tokens;
      PC_RETURN_IF_ERROR(ops.Launch(store));
      att.q = b.q + uint64_t(run.token_begin * c.q_dim()) * 4;
      att.out = b.attn + uint64_t(run.token_begin * c.q_dim()) * 4;
      att.query_start = run.query_start;
      att.seq_lens = run.seq_lens;
      att.block_tables = run.block_tables;
      att.n_seqs = run.n_seqs;
      PC_RETURN_IF_ERROR(ops.Launch(att));
    }

    // x += (post_norm)(attn Wo^T (+ bo))
    PC_RETURN_IF_ERROR(Residual(ops, b.attn, L.wo, L.bo, L.post_attn_norm, b.xn, b.x, T, lora,
                                LoraSlot(l, kLoraO)));

    // ---- feed-forward ----
    norm.weight = L.ffn_norm;
    PC_RETURN_IF_ERROR(ops.Launch(norm));
    if (c.n_expert > 0) {
      PC_RETURN_IF_ERROR(Experts(ops, L, b, T, lora, l));
      continue;
    }
    // [T, n_ff] each; the adapters' terms after both, as for q, k and v.
    PC_RETURN_IF_ERROR(Matmul(ops, b.xn, L.w_gate, 0, b.gate, T, false));
    PC_RETURN_IF_ERROR(Matmul(ops, b.xn, L.w_up, 0, b.up, T, false));
    if (!lora.segments.empty()) {
      PC_RETURN_IF_ERROR(ApplyLora(ops, b.xn, L.w_gate, b.gate, T, lora, LoraSlot(l, kLoraGate)));
      PC_RETURN_IF_ERROR(ApplyLora(ops, b.xn, L.w_up, b.up, T, lora, LoraSlot(l, kLoraUp)));
    }
    // gate = act(gate) * up; GEGLU and SWIGLU take the same arguments.
    auto gated = [&](auto act) {
      act.gate = b.gate;
      act.up = b.up;
      act.out = b.gate;
      act.n = T * c.n_ff;
      return ops.Launch(act);
    };
    PC_RETURN_IF_ERROR(c.gelu_ffn ? gated(runtime::GegluArgs{}) : gated(runtime::SwigluArgs{}));
    PC_RETURN_IF_ERROR(Residual(ops, b.gate, L.w_down, 0, L.post_ffn_norm, b.xn, b.x, T, lora,
                                LoraSlot(l, kLoraDown)));
  }
  if (pipeline && !pp_->last()) PC_RETURN_IF_ERROR(ops.Send(*pp_, b.x, T));
  return Status::Ok();
}

Status Transformer::Experts(Launcher& ops, const LayerWeights& L, const StepBuffers& b,
                            int64_t T, const LoraRuns& lora, int64_t layer) const {
  const ModelConfig& c = *c_;
  // Router logits [T, n_expert] in the gate buffer; the op routes, runs the chosen experts and
  // adds their weighted sum into the residual stream.
  PC_RETURN_IF_ERROR(
      Matmul(ops, b.xn, L.router, 0, b.gate, T, false, lora, LoraSlot(layer, kLoraRouter)));
  // The runs of rows whose adapter adapts these experts. Where the adapter's pairs are on the
  // device as MOE's low-rank terms and the device (or its op fallback) takes them (ABI 1.7),
  // each such run is a MOE launch of its own with its terms, the other rows launches without.
  // Otherwise (a plugin older than 1.7 without a fallback, experts in pieces, pairs of mixed
  // types, POLYCHIP_LORA_HOST_EXPERTS=1) the run's feed-forward is computed on the host
  // (HostAdaptedExperts) from its residual stream, normed input and router logits as they are
  // before MOE, and replaces what MOE adds to its rows.
  struct HostRun {
    const LoraSegment* seg;
    std::vector<float> x, xn, logits;
  };
  std::vector<HostRun> host;
  std::vector<runtime::MoeArgs> term_runs;  // by first row
  for (const LoraSegment& seg : lora.segments) {
    if (!seg.lora->adapter->AdaptsExperts(layer)) continue;
    const DeviceLora::ExpertTerms* terms =
        L.gate_exps.pieces.empty() ? seg.lora->FindExperts(layer) : nullptr;
    if (terms != nullptr) {
      runtime::MoeArgs moe = MoeOf(L, b, seg.begin, seg.rows);
      moe.lora_a_dtype = terms->a_dtype;
      moe.lora_b_dtype = terms->b_dtype;
      const LoraAdapter& adapter = *seg.lora->adapter;
      auto factor = [&](int m) {
        return terms->a[m] != 0 ? adapter.Factor(terms->rank[m], seg.scale) : 0.0f;
      };
      moe.gate_lora_a = terms->a[0], moe.gate_lora_b = terms->b[0];
      moe.gate_lora_rank = terms->rank[0], moe.gate_lora_scale = factor(0);
      moe.up_lora_a = terms->a[1], moe.up_lora_b = terms->b[1];
      moe.up_lora_rank = terms->rank[1], moe.up_lora_scale = factor(1);
      moe.down_lora_a = terms->a[2], moe.down_lora_b = terms->b[2];
      moe.down_lora_rank = terms->rank[2], moe.down_lora_scale = factor(2);
      if (ops.CanLaunch(moe)) {
        term_runs.push_back(moe);
        continue;
      }
    }
    host.push_back({&seg, {}, {}, {}});
  }
  if (!host.empty() && lora.base == nullptr) {
    return Internal("an adapter of the experts without the base model's file");
  }
  const int64_t d = c.n_embd, E = c.n_expert;
  // Copies `n` floats at `p` to `dst` (the host reads them; the device keeps them as they were).
  auto read = [&ops](DevPtr p, int64_t n, std::vector<float>* dst) {
    return ops.HostCompute(p, n, p, n, [dst, n](const float* in, float* out) {
      dst->assign(in, in + n);
      std::copy(in, in + n, out);
    });
  };
  for (HostRun& h : host) {
    const int64_t at = h.seg->begin, rows = h.seg->rows;
    PC_RETURN_IF_ERROR(read(b.x + uint64_t(at * d) * 4, rows * d, &h.x));
    PC_RETURN_IF_ERROR(read(b.xn + uint64_t(at * d) * 4, rows * d, &h.xn));
    PC_RETURN_IF_ERROR(read(b.gate + uint64_t(at * E) * 4, rows * E, &h.logits));
  }
  if (term_runs.empty()) {
    PC_RETURN_IF_ERROR(DeviceExperts(ops, L, b, T));
  } else {
    // The rows between the runs with terms (base rows, other adapters) without terms.
    std::sort(term_runs.begin(), term_runs.end(),
              [](const runtime::MoeArgs& x, const runtime::MoeArgs& y) { return x.x < y.x; });
    const auto first_row = [&](const runtime::MoeArgs& m) {
      return int64_t((m.x - b.xn) / uint64_t(d * 4));
    };
    int64_t row = 0;
    for (const runtime::MoeArgs& run : term_runs) {
      const int64_t begin = first_row(run);
      if (begin > row) PC_RETURN_IF_ERROR(ops.Launch(MoeOf(L, b, row, begin - row)));
      PC_RETURN_IF_ERROR(ops.Launch(run));
      row = begin + run.n_tokens;
    }
    if (row < T) PC_RETURN_IF_ERROR(ops.Launch(MoeOf(L, b, row, T - row)));
  }
  for (HostRun& h : host) {
    const int64_t at = h.seg->begin, rows = h.seg->rows;
    Status computed = Status::Ok();
    PC_RETURN_IF_ERROR(ops.HostCompute(
        b.x + uint64_t(at * d) * 4, rows * d, b.x + uint64_t(at * d) * 4, rows * d,
        [&](const float*, float* out) {
          computed = HostAdaptedExperts(*lora.base, *h.seg->lora->adapter, h.seg->scale, c, layer,
                                        h.xn.data(), h.logits.data(), rows, out);
          for (int64_t i = 0; i < rows * d; ++i) out[i] += h.x[size_t(i)];
        }));
    PC_RETURN_IF_ERROR(computed);
  }
  return Status::Ok();
}

runtime::MoeArgs Transformer::MoeOf(const LayerWeights& L, const StepBuffers& b, int64_t begin,
                                    int64_t rows) const {
  const ModelConfig& c = *c_;
  runtime::MoeArgs moe;
  moe.x = b.xn + uint64_t(begin * c.n_embd) * 4;
  moe.logits = b.gate + uint64_t(begin * c.n_expert) * 4;
  moe.gate = L.gate_exps.data;
  moe.gate_dtype = L.gate_exps.dtype;
  moe.gate_layout = L.gate_exps.layout;
  moe.up = L.up_exps.data;
  moe.up_dtype = L.up_exps.dtype;
  moe.up_layout = L.up_exps.layout;
  moe.down = L.down_exps.data;
  moe.down_dtype = L.down_exps.dtype;
  moe.down_layout = L.down_exps.layout;
  moe.out = b.x + uint64_t(begin * c.n_embd) * 4;
  moe.n_tokens = rows;
  moe.n_embd = c.n_embd;
  moe.n_ff = c.n_ff_exp;
  moe.n_experts = c.n_expert;
  moe.n_used = c.n_expert_used;
  moe.norm_weights = c.moe_norm_weights ? 1 : 0;
  moe.accumulate = 1;
  return moe;
}

Status Transformer::DeviceExperts(Launcher& ops, const LayerWeights& L, const StepBuffers& b,
                                  int64_t T) const {
  const ModelConfig& c = *c_;
  runtime::MoeArgs moe = MoeOf(L, b, 0, T);
  if (L.gate_exps.pieces.empty()) return ops.Launch(moe);

  // Experts over the device's max single allocation, in pieces of whole experts, each followed
  // by a zero expert (model_loader.h). MOE routes over the experts of its launch, so the
  // routing over all of them is done here, on the host, as MOE defines it, and each piece's
  // launch gets logits whose softmax gives back the weights: log(w) for its chosen experts,
  // log(1 - their sum) for the zero expert (which adds nothing), and kNotChosen for the others.
  // With one more expert used than the model's, a launch runs every expert it has a weight
  // for. The price: the host waits for the router's logits once per layer and step.
  const auto& pieces = L.gate_exps.pieces;
  const int64_t n_expert = c.n_expert, n_used = c.n_expert_used, ff = c.n_ff_exp;
  const bool norm = c.moe_norm_weights;
  auto route = [&](const float* logits, float* out) {  // out: per piece [T, its experts + 1]
    std::vector<float> w(n_expert);
    for (int64_t t = 0; t < T; ++t) {
      RouteToken(logits + t * n_expert, n_expert, n_used, norm, w.data());
      float* piece_logits = out;
      for (const MatrixRef& piece : pieces) {
        const int64_t first = piece.begin / ff, count = piece.rows / ff;
        float* dst = piece_logits + t * (count + 1);
        float rest = 1;
        for (int64_t j = 0; j < count; ++j) {
          const float we = w[first + j];
          dst[j] = we > 0 ? std::log(we) : kNotChosen;
          rest -= we;
        }
        dst[count] = rest > 0 ? std::log(rest) : kNotChosen;
        piece_logits += T * (count + 1);
      }
    }
  };
  const int64_t cols = n_expert + int64_t(pieces.size());
  PC_RETURN_IF_ERROR(ops.HostCompute(b.gate, T * n_expert, b.up, T * cols, route));
  DevPtr logits = b.up;
  for (size_t p = 0; p < pieces.size(); ++p) {
    const int64_t count = pieces[p].rows / ff;
    moe.logits = logits;
    moe.gate = L.gate_exps.pieces[p].data;
    moe.up = L.up_exps.pieces[p].data;
    moe.down = L.down_exps.pieces[p].data;
    moe.gate_layout = moe.up_layout = moe.down_layout = runtime::kLayoutGguf;
    moe.n_experts = count + 1;
    moe.n_used = std::min(n_used + 1, count + 1);
    moe.norm_weights = 0;
    PC_RETURN_IF_ERROR(ops.Launch(moe));
    logits += uint64_t(T * (count + 1)) * 4;
  }
  return Status::Ok();
}

Status Transformer::Residual(Launcher& ops, DevPtr in, const MatrixRef& w,
                             DevPtr bias, DevPtr post_norm, DevPtr scratch, DevPtr x,
                             int64_t m, const LoraRuns& lora, int32_t slot) const {
  const bool reduce = tp_ != nullptr && tp_->size > 1;
  // The plain residual connection is fused into the matmul.
  if (!reduce && post_norm == 0) return Matmul(ops, in, w, bias, x, m, true, lora, slot);
  // [m, n_embd] (partial)
  PC_RETURN_IF_ERROR(Matmul(ops, in, w, bias, scratch, m, false, lora, slot));
  if (reduce) PC_RETURN_IF_ERROR(ops.AllReduce(*tp_, scratch, m));
  if (post_norm != 0) {
    runtime::RmsNormArgs norm;
    norm.x = scratch;
    norm.weight = post_norm;
    norm.out = scratch;
    norm.n_rows = m;
    norm.dim = c_->n_embd;
    norm.eps = c_->rms_eps;
    PC_RETURN_IF_ERROR(ops.Launch(norm));
  }
  runtime::AddArgs add;
  add.a = x;
  add.b = scratch;
  add.out = x;
  add.n = m * c_->n_embd;
  return ops.Launch(add);
}

Status Transformer::FinalHidden(Launcher& ops, DevPtr x, int64_t n_tokens,
                                DevPtr row_ids, int64_t n_rows, DevPtr h) const {
  const ModelConfig& c = *c_;
  // Gather the rows that need logits with the EMBEDDING op over the F32 hidden states.
  runtime::EmbeddingArgs gather;
  gather.table = x;
  gather.table_dtype = DType::kF32;
  gather.n_rows = n_tokens;
  gather.row_len = c.n_embd;
  gather.ids = row_ids;
  gather.n_ids = n_rows;
  gather.out = h;
  PC_RETURN_IF_ERROR(ops.Launch(gather));

  runtime::RmsNormArgs norm;
  norm.x = h;
  norm.weight = w_->output_norm;
  norm.out = h;
  norm.n_rows = n_rows;
  norm.dim = c.n_embd;
  norm.eps = c.rms_eps;
  return ops.Launch(norm);
}

Status Transformer::Logits(Launcher& ops, DevPtr x, int64_t n_tokens, DevPtr row_ids,
                           int64_t n_rows, DevPtr h, DevPtr logits, const LoraRuns& lora) const {
  PC_RETURN_IF_ERROR(FinalHidden(ops, x, n_tokens, row_ids, n_rows, h));
  return Matmul(ops, h, w_->output, w_->output_bias, logits, n_rows, false, lora,
                LoraOutputSlot(c_->n_layer));
}

}  // namespace polychip::model
