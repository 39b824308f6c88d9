// Tests of the SDK reference kernels against small hand-computed cases and independent loops.
#include "polychip/sdk/ref_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <utility>
#include <vector>

#include "polychip/sdk/quant.h"

namespace polychip::sdk {
namespace {

pc_devptr_t D(const void* p) { return reinterpret_cast<uintptr_t>(p); }

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(RefKernels, MatmulAllWeightTypesStridesBiasAccumulate) {
  const int64_t m = 3, n = 5, k = 256, xs = 260, os = 7;
  auto x = Random(m * xs, 1), wf = Random(n * k, 2), bias = Random(n, 3);
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16, PC_DTYPE_Q8_0, PC_DTYPE_Q4_0,
                       PC_DTYPE_Q4_K, PC_DTYPE_Q6_K, PC_DTYPE_Q2_K}) {
    const int64_t rb = RowBytes(t, k);
    std::vector<uint8_t> w(n * rb);
    std::vector<float> wd(n * k);  // what the kernel should see
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_TRUE(QuantizeRow(t, wf.data() + j * k, w.data() + j * rb, k));
      ASSERT_TRUE(DequantizeRow(t, w.data() + j * rb, wd.data() + j * k, k));
    }
    std::vector<float> out(m * os, 0.5f);
    pc_matmul_args_t a{sizeof(a), D(x.data()), D(w.data()), t, PC_LAYOUT_GGUF, D(bias.data()),
                       D(out.data()), m, n, k, xs, os, /*accumulate=*/1};
    ASSERT_EQ(RefLaunch(PC_OP_MATMUL, &a, IdentityMemory()), nullptr);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0.5 + bias[j];
        for (int64_t kk = 0; kk < k; ++kk) ref += x[i * xs + kk] * wd[j * k + kk];
        EXPECT_NEAR(out[i * os + j], ref, 1e-4) << GetDtypeInfo(t)->name;
      }
      EXPECT_EQ(out[i * os + n], 0.5f) << "padding between rows untouched";
    }
  }
}

TEST(RefKernels, MatmulRejectsBadArgs) {
  float x[32], w[32], out[1];
  pc_matmul_args_t a{sizeof(a), D(x), D(w), PC_DTYPE_Q4_0, PC_LAYOUT_GGUF, 0, D(out), 1, 1, 31, 31, 1, 0};
  EXPECT_NE(RefLaunch(PC_OP_MATMUL, &a, IdentityMemory()), nullptr);  // k not a block multiple
  a.k = a.x_stride = 32;
  a.w_layout = 77;
  EXPECT_NE(RefLaunch(PC_OP_MATMUL, &a, IdentityMemory()), nullptr);  // unknown layout
  a.w_layout = PC_LAYOUT_GGUF;
  a.struct_size = 8;
  EXPECT_NE(RefLaunch(PC_OP_MATMUL, &a, IdentityMemory()), nullptr);  // truncated struct
}

TEST(RefKernels, RmsNormInPlace) {
  std::vector<float> x = {3, 4, 0, 0, 1, 1, 1, 1};  // [2, 4]
  std::vector<float> w = {1, 2, 1, 1};
  pc_rms_norm_args_t a{sizeof(a), D(x.data()), D(w.data()), D(x.data()), 2, 4, 0.0f};
  ASSERT_EQ(RefLaunch(PC_OP_RMS_NORM, &a, IdentityMemory()), nullptr);
  // row 0: rms = sqrt(25/4) = 2.5
  EXPECT_NEAR(x[0], 3 / 2.5, 1e-6);
  EXPECT_NEAR(x[1], 2 * 4 / 2.5, 1e-6);
  EXPECT_NEAR(x[5], 2.0, 1e-6);
}

TEST(RefKernels, RopeNormalAndNeox) {
  // head_dim 4, n_rot 4, base 10000: pair 0 has theta = p, pair 1 theta = p / 100.
  const float p = 3;
  int32_t pos[1] = {3};
  for (pc_rope_mode_t mode : {PC_ROPE_NORMAL, PC_ROPE_NEOX}) {
    std::vector<float> x = {1, 2, 3, 4};
    pc_rope_args_t a{sizeof(a), D(x.data()), D(pos), 0, 1, 1, 4, 4, mode,
                     10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 4096};
    ASSERT_EQ(RefLaunch(PC_OP_ROPE, &a, IdentityMemory()), nullptr);
    const float c0 = std::cos(p), s0 = std::sin(p), c1 = std::cos(p / 100), s1 = std::sin(p / 100);
    if (mode == PC_ROPE_NORMAL) {  // pairs (0,1) and (2,3)
      EXPECT_NEAR(x[0], 1 * c0 - 2 * s0, 1e-5);
      EXPECT_NEAR(x[1], 1 * s0 + 2 * c0, 1e-5);
      EXPECT_NEAR(x[2], 3 * c1 - 4 * s1, 1e-5);
      EXPECT_NEAR(x[3], 3 * s1 + 4 * c1, 1e-5);
    } else {  // pairs (0,2) and (1,3)
      EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, 1e-5);
      EXPECT_NEAR(x[2], 1 * s0 + 3 * c0, 1e-5);
      EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, 1e-5);
      EXPECT_NEAR(x[3], 2 * s1 + 4 * c1, 1e-5);
    }
  }
}

TEST(RefKernels, RopeFreqFactorsPassThroughAndYarn) {
  int32_t pos[1] = {5};
  float ff[2] = {2.0f, 1.0f};
  std::vector<float> x = {1, 0, 1, 0, 7, 8};  // head_dim 6, n_rot 4: last two pass through
  pc_rope_args_t a{sizeof(a), D(x.data()), D(pos), D(ff), 1, 1, 6, 4, PC_ROPE_NORMAL,
                   10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f, 4096};
  ASSERT_EQ(RefLaunch(PC_OP_ROPE, &a, IdentityMemory()), nullptr);
  EXPECT_NEAR(x[0], std::cos(2.5f), 1e-5);  // theta = 5 / ff[0]
  EXPECT_EQ(x[4], 7.0f);
  EXPECT_EQ(x[5], 8.0f);
  // YaRN with freq_scale 0.25: the magnitude grows by 1 + 0.1 ln 4, and the lowest pair (a
  // high-frequency one, below the correction range) keeps its unscaled angle.
  pc_rope_args_t y = a;
  y.freq_factors = 0;
  y.freq_scale = 0.25f;
  y.ext_factor = 1.0f;
  y.n_rot = 128;
  y.head_dim = 128;
  float c, s;
  RopeCosSin(y, 5, 0, 1.0f, &c, &s);
  const float mscale = 1.0f + 0.1f * std::log(4.0f);
  EXPECT_NEAR(c, std::cos(5.0f) * mscale, 1e-5);
  RopeCosSin(y, 5, 63, 1.0f, &c, &s);  // the lowest frequency: fully interpolated
  EXPECT_NEAR(s, std::sin(0.25f * 5 * std::pow(10000.0f, -126.0f / 128)) * mscale, 1e-6);
}

// A paged cache: KV_STORE through slots, then ATTENTION, checked against a dense loop.
TEST(RefKernels, PagedAttentionGqaCausalAgainstDense) {
  const int64_t n_heads = 4, n_kv = 2, hd = 8, bs = 4, n_blocks = 8, max_blocks = 4;
  for (pc_dtype_t cache_t : {PC_DTYPE_F32, PC_DTYPE_F16}) {
    const int64_t es = cache_t == PC_DTYPE_F32 ? 4 : 2;
    std::vector<uint8_t> kc(n_blocks * bs * n_kv * hd * es), vc(kc.size());
    // Two sequences: seq 0 has 6 positions (prefill of all 6), seq 1 has 3 (decode 1 token,
    // the first 2 stored earlier). Blocks are scattered on purpose.
    std::vector<int32_t> table = {5, 2, -1, -1, 7, -1, -1, -1};  // [2, max_blocks]
    const int64_t lens[2] = {6, 3};
    auto k_all = Random(9 * n_kv * hd, 10), v_all = Random(9 * n_kv * hd, 11);
    std::vector<int32_t> slots;
    for (int s = 0; s < 2; ++s)
      for (int p = 0; p < lens[s]; ++p) slots.push_back(table[s * 4 + p / bs] * bs + p % bs);
    pc_kv_store_args_t st{sizeof(st), D(k_all.data()), D(v_all.data()), D(kc.data()),
                          D(vc.data()), D(slots.data()), cache_t, 9, n_kv, hd, bs};
    st.v_cache_dtype = cache_t;
    ASSERT_EQ(RefLaunch(PC_OP_KV_STORE, &st, IdentityMemory()), nullptr);
    // A skipped slot writes nothing.
    std::vector<uint8_t> before = kc;
    int32_t skip[1] = {-1};
    st.slots = D(skip);
    st.n_tokens = 1;
    ASSERT_EQ(RefLaunch(PC_OP_KV_STORE, &st, IdentityMemory()), nullptr);
    EXPECT_EQ(before, kc);

    const int64_t n_tok = 7;  // 6 query rows for seq 0, 1 for seq 1
    auto q = Random(n_tok * n_heads * hd, 12);
    std::vector<float> out(q.size(), -9);
    std::vector<int32_t> qstart = {0, 6, 7}, seq_lens = {6, 3};
    pc_attention_args_t a{sizeof(a), D(q.data()), D(kc.data()), D(vc.data()), D(out.data()),
                          D(qstart.data()), D(seq_lens.data()), D(table.data()), cache_t,
                          n_tok, 2, n_heads, n_kv, hd, bs, max_blocks, 6, 0.35f};
    a.v_cache_dtype = cache_t;
    ASSERT_EQ(RefLaunch(PC_OP_ATTENTION, &a, IdentityMemory()), nullptr);
    auto round = [&](float v) { return cache_t == PC_DTYPE_F16 ? Fp16ToFp32(Fp32ToFp16(v)) : v; };
    const int64_t tok_base[2] = {0, 6};  // row of each sequence's position 0 in k_all
    for (int s = 0; s < 2; ++s) {
      const int64_t n_q = qstart[s + 1] - qstart[s];
      for (int64_t j = 0; j < n_q; ++j) {
        const int64_t t = qstart[s] + j, last = lens[s] - n_q + j;
        for (int64_t h = 0; h < n_heads; ++h) {
          const int64_t kvh = h / (n_heads / n_kv);
          std::vector<double> w(last + 1);
          double mx = -1e30, den = 0;
          for (int64_t p = 0; p <= last; ++p) {
            double dot = 0;
            for (int64_t d = 0; d < hd; ++d)
              dot += q[(t * n_heads + h) * hd + d] *
                     round(k_all[((tok_base[s] + p) * n_kv + kvh) * hd + d]);
            w[p] = dot * 0.35;
            mx = std::max(mx, w[p]);
          }
          for (auto& v : w) den += (v = std::exp(v - mx));
          for (int64_t d = 0; d < hd; ++d) {
            double o = 0;
            for (int64_t p = 0; p <= last; ++p)
              o += w[p] / den * round(v_all[((tok_base[s] + p) * n_kv + kvh) * hd + d]);
            EXPECT_NEAR(out[(t * n_heads + h) * hd + d], o, 1e-5) << s << " " << j << " " << h;
          }
        }
      }
    }
  }
}

TEST(RefKernels, AttentionIsStableForHugeScores) {
  // A score of 2e4 overflows exp() unless the max is subtracted first: output is exactly v.
  float q[2] = {100, 100}, k[2] = {100, 100}, v[2] = {3, -4}, out[2];
  int32_t qs[2] = {0, 1}, lens[1] = {1}, table[1] = {0};
  pc_attention_args_t a{sizeof(a), D(q), D(k), D(v), D(out), D(qs), D(lens), D(table),
                        PC_DTYPE_F32, 1, 1, 1, 1, 2, 1, 1, 1, 1.0f};
  ASSERT_EQ(RefLaunch(PC_OP_ATTENTION, &a, IdentityMemory()), nullptr);
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], -4.0f);
}

// A sliding window (1.4) of w: a query sees its own position and the w - 1 before it. Four
// cached positions with values 1, 2, 4, 8 and equal scores: the output is the mean of the
// visible ones. A shorter (1.3) struct reads as no window.
TEST(RefKernels, AttentionWindowSeesTheLastPositions) {
  float q[1] = {0}, k[4] = {1, 1, 1, 1}, v[4] = {1, 2, 4, 8}, out[1];
  int32_t qs[2] = {0, 1}, lens[1] = {4}, table[1] = {0};
  pc_attention_args_t a{sizeof(a), D(q), D(k), D(v), D(out), D(qs), D(lens), D(table),
                        PC_DTYPE_F32, 1, 1, 1, 1, 1, 4, 1, 4, 1.0f};
  const float want[] = {15.f / 4, 8.f, 12.f / 2, 14.f / 3, 15.f / 4, 15.f / 4};
  for (int64_t w = 0; w <= 5; ++w) {
    a.window = w;
    ASSERT_EQ(RefLaunch(PC_OP_ATTENTION, &a, IdentityMemory()), nullptr);
    EXPECT_FLOAT_EQ(out[0], want[w]) << "window " << w;
  }
  pc_attention_args_t old = a;
  old.window = 1;  // beyond the old struct_size: ignored
  old.struct_size = offsetof(pc_attention_args_t, window);
  ASSERT_EQ(RefLaunch(PC_OP_ATTENTION, &old, IdentityMemory()), nullptr);
  EXPECT_FLOAT_EQ(out[0], 15.f / 4);
  a.window = -1;
  EXPECT_NE(RefLaunch(PC_OP_ATTENTION, &a, IdentityMemory()), nullptr);
}

TEST(RefKernels, GegluAndScale) {
  float g[4] = {0, 1, -2, 30}, u[4] = {5, 2, 3, 0.5f}, o[4];
  pc_geglu_args_t ge{sizeof(ge), D(g), D(u), D(o), 4};
  ASSERT_EQ(RefLaunch(PC_OP_GEGLU, &ge, IdentityMemory()), nullptr);
  // gelu_tanh(1) = 0.841192, gelu_tanh(-2) = -0.045402 (the tanh approximation's values).
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2 * 0.841192, 1e-5);
  EXPECT_NEAR(o[2], 3 * -0.045402, 1e-5);
  EXPECT_NEAR(o[3], 15.0, 1e-5);
  pc_scale_args_t sc{sizeof(sc), D(g), D(g), 4, -0.5f};  // in place
  ASSERT_EQ(RefLaunch(PC_OP_SCALE, &sc, IdentityMemory()), nullptr);
  EXPECT_EQ(g[1], -0.5f);
  EXPECT_EQ(g[3], -15.0f);
}

TEST(RefKernels, SwigluAddEmbeddingConvert) {
  float g[3] = {0, 1, -2}, u[3] = {5, 2, 3}, o[3];
  pc_swiglu_args_t sw{sizeof(sw), D(g), D(u), D(o), 3};
  ASSERT_EQ(RefLaunch(PC_OP_SWIGLU, &sw, IdentityMemory()), nullptr);
  EXPECT_EQ(o[0], 0.0f);
  EXPECT_NEAR(o[1], 2 / (1 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(o[2], 3 * -2 / (1 + std::exp(2.0)), 1e-6);
  pc_add_args_t ad{sizeof(ad), D(g), D(u), D(g), 3};  // in place
  ASSERT_EQ(RefLaunch(PC_OP_ADD, &ad, IdentityMemory()), nullptr);
  EXPECT_EQ(g[2], 1.0f);

  auto table = Random(4 * 32, 7);
  std::vector<uint8_t> q8(4 * 34);
  for (int r = 0; r < 4; ++r) QuantizeRow(PC_DTYPE_Q8_0, &table[r * 32], &q8[r * 34], 32);
  int32_t ids[3] = {3, 0, 3};
  std::vector<float> emb(3 * 32);
  pc_embedding_args_t e{sizeof(e), D(q8.data()), PC_DTYPE_Q8_0, 4, 32, D(ids), 3, D(emb.data())};
  ASSERT_EQ(RefLaunch(PC_OP_EMBEDDING, &e, IdentityMemory()), nullptr);
  float row3[32];
  DequantizeRow(PC_DTYPE_Q8_0, &q8[3 * 34], row3, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(emb[i], row3[i]);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(emb[64 + i], row3[i]);
  // A 1.0/1.1 host's struct ends before table_layout: still valid, read as the GGUF layout.
  pc_embedding_args_t old = e;
  old.table_layout = 0x1234;  // beyond the old struct_size: must be ignored
  old.struct_size = offsetof(pc_embedding_args_t, table_layout);
  std::fill(emb.begin(), emb.end(), 0.f);
  ASSERT_EQ(RefLaunch(PC_OP_EMBEDDING, &old, IdentityMemory()), nullptr);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(emb[i], row3[i]);
  old.struct_size = offsetof(pc_embedding_args_t, out);
  EXPECT_NE(RefLaunch(PC_OP_EMBEDDING, &old, IdentityMemory()), nullptr);  // truncated struct
  e.table_layout = 0x1234;  // a plugin's private layout: not the reference's to read
  EXPECT_NE(RefLaunch(PC_OP_EMBEDDING, &e, IdentityMemory()), nullptr);
  e.table_layout = PC_LAYOUT_GGUF;
  ids[1] = 4;
  EXPECT_NE(RefLaunch(PC_OP_EMBEDDING, &e, IdentityMemory()), nullptr);  // id out of range

  float f[3] = {1.0f, 1.0f + std::ldexp(1.0f, -11), 65504.0f};
  uint16_t h[3];
  pc_convert_args_t c{sizeof(c), D(f), D(h), PC_DTYPE_F32, PC_DTYPE_F16, 3};
  ASSERT_EQ(RefLaunch(PC_OP_CONVERT, &c, IdentityMemory()), nullptr);
  EXPECT_EQ(h[1], 0x3C00);
  EXPECT_EQ(h[2], 0x7BFF);
  c.src_dtype = PC_DTYPE_Q8_0;
  c.dst_dtype = PC_DTYPE_F16;
  EXPECT_NE(RefLaunch(PC_OP_CONVERT, &c, IdentityMemory()), nullptr);  // quantized -> F32 only
}

TEST(RefKernels, BadAddressIsAnErrorNotACrash) {
  DeviceMemory none;
  none.to_host = [](void*, pc_devptr_t, uint64_t) -> void* { return nullptr; };
  pc_add_args_t ad{sizeof(ad), 0x1000, 0x2000, 0x3000, 4};
  EXPECT_NE(RefLaunch(PC_OP_ADD, &ad, none), nullptr);
}

TEST(RefKernels, Supports) {
  pc_op_query_t q{sizeof(q), PC_OP_MATMUL, {PC_DTYPE_Q5_K, PC_DTYPE_INVALID, PC_DTYPE_INVALID, PC_DTYPE_INVALID}, PC_SHAPE_ANY};
  EXPECT_TRUE(RefSupports(q));
  q.layout = 0x1234;  // a plugin's private layout
  EXPECT_FALSE(RefSupports(q));
  q.struct_size = offsetof(pc_op_query_t, layout);  // a 1.1 host: no layout member, GGUF
  EXPECT_TRUE(RefSupports(q));
  q.struct_size = sizeof(q);
  q.layout = PC_LAYOUT_GGUF;
  q.dtypes[0] = PC_DTYPE_I32;
  EXPECT_FALSE(RefSupports(q));
  q.op = PC_OP_ATTENTION;
  q.dtypes[0] = PC_DTYPE_Q5_K;  // not a KV cache type
  EXPECT_FALSE(RefSupports(q));
  q.dtypes[0] = PC_DTYPE_Q8_0;  // a KV cache type (1.6), K = V
  q.dtypes[1] = PC_DTYPE_Q8_0;
  EXPECT_TRUE(RefSupports(q));
  q.op = static_cast<pc_op_t>(99);
  EXPECT_FALSE(RefSupports(q));
}

// MOE's routing: the largest probabilities, ties to the lower index, renormalised on request.
TEST(RefKernels, MoeRoute) {
  const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  int32_t experts[3];
  float weights[3];
  MoeRoute(logits, 5, 3, /*norm_weights=*/false, experts, weights);
  EXPECT_EQ(experts[0], 1);  // the tie between 1 and 3 goes to 1
  EXPECT_EQ(experts[1], 3);
  EXPECT_EQ(experts[2], 4);
  double denom = 0;
  for (float l : logits) denom += std::exp(l);
  EXPECT_NEAR(weights[0], std::exp(2.0) / denom, 1e-6);
  EXPECT_NEAR(weights[2], std::exp(1.0) / denom, 1e-6);
  MoeRoute(logits, 5, 3, /*norm_weights=*/true, experts, weights);
  EXPECT_NEAR(weights[0] + weights[1] + weights[2], 1.0, 1e-6);
  EXPECT_NEAR(weights[2], std::exp(1.0) / (2 * std::exp(2.0) + std::exp(1.0)), 1e-6);
}

// MOE on one token and two experts of a 2-wide model, F32, worked by hand: expert e's gate and
// up are e+1 times the identity, its down the identity; router logits pick experts 1 and 0.
TEST(RefKernels, MoeByHand) {
  const int64_t n_embd = 2, n_ff = 2, n_exp = 2;
  std::vector<float> gate(n_exp * n_ff * n_embd, 0.f), up = gate, down = gate;
  for (int64_t e = 0; e < n_exp; ++e)
    for (int64_t i = 0; i < 2; ++i) {
      gate[(e * n_ff + i) * n_embd + i] = float(e + 1);
      up[(e * n_ff + i) * n_embd + i] = float(e + 1);
      down[(e * n_embd + i) * n_ff + i] = 1.f;
    }
  float x[2] = {1.f, -2.f}, logits[2] = {0.f, std::log(3.f)}, out[2] = {10.f, 20.f};
  pc_moe_args_t a{};
  a.struct_size = sizeof(a);
  a.x = reinterpret_cast<uintptr_t>(x), a.logits = reinterpret_cast<uintptr_t>(logits);
  a.gate = reinterpret_cast<uintptr_t>(gate.data()), a.gate_dtype = PC_DTYPE_F32;
  a.up = reinterpret_cast<uintptr_t>(up.data()), a.up_dtype = PC_DTYPE_F32;
  a.down = reinterpret_cast<uintptr_t>(down.data()), a.down_dtype = PC_DTYPE_F32;
  a.out = reinterpret_cast<uintptr_t>(out);
  a.n_tokens = 1, a.n_embd = n_embd, a.n_ff = n_ff, a.n_experts = n_exp, a.n_used = 2;
  a.norm_weights = 1, a.accumulate = 1;
  ASSERT_EQ(RefLaunch(PC_OP_MOE, &a, IdentityMemory()), nullptr);
  // p = {1/4, 3/4}; expert e gives silu((e+1) x) * (e+1) x per element.
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  for (int i = 0; i < 2; ++i) {
    const double want = (i == 0 ? 10 : 20) + 0.25 * silu(x[i]) * x[i] +
                        0.75 * silu(2 * x[i]) * 2 * x[i];
    EXPECT_NEAR(out[i], want, 1e-5) << i;
  }
  a.n_used = 3;  // more than the experts
  EXPECT_NE(RefLaunch(PC_OP_MOE, &a, IdentityMemory()), nullptr);
}

// MOE's low-rank terms (1.7) are the merged matrices' MOE: on 3 tokens of 4 experts (2 used), a
// launch with per-expert terms of rank 2 on gate and down (none on up) gives what a plain launch
// over W_e + s B_e A_e gives; all terms 0, or a struct of 1.6's size, are a plain launch; a term
// with an address but no rank is refused.
TEST(RefKernels, MoeLowRankIsTheMergedMatrices) {
  const int64_t T = 3, d = 4, ff = 6, E = 4, r = 2;
  uint32_t seed = 1;
  auto rnd = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return float(seed >> 8) / float(1 << 24) - 0.5f;
  };
  auto fill = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = rnd();
    return v;
  };
  std::vector<float> x = fill(T * d), logits = fill(T * E);
  std::vector<float> gate = fill(E * ff * d), up = fill(E * ff * d), down = fill(E * d * ff);
  // A [E * r, cols], B [E * rows, r] for gate (rows ff, cols d) and down (rows d, cols ff).
  std::vector<float> ga = fill(E * r * d), gb = fill(E * ff * r);
  std::vector<float> da = fill(E * r * ff), db = fill(E * d * r);
  const float gs = 0.7f, ds = -1.3f;
  auto merge = [&](std::vector<float> w, const std::vector<float>& a, const std::vector<float>& b,
                   int64_t rows, int64_t cols, float s) {
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t k = 0; k < cols; ++k) {
          float sum = 0;
          for (int64_t j = 0; j < r; ++j)
            sum += b[(e * rows + i) * r + j] * a[(e * r + j) * cols + k];
          w[(e * rows + i) * cols + k] += s * sum;
        }
    return w;
  };
  const std::vector<float> gate_m = merge(gate, ga, gb, ff, d, gs);
  const std::vector<float> down_m = merge(down, da, db, d, ff, ds);
  auto args = [&](const std::vector<float>& g, const std::vector<float>& dn, float* out) {
    pc_moe_args_t a{};
    a.struct_size = sizeof(a);
    a.x = reinterpret_cast<uintptr_t>(x.data());
    a.logits = reinterpret_cast<uintptr_t>(logits.data());
    a.gate = reinterpret_cast<uintptr_t>(g.data()), a.gate_dtype = PC_DTYPE_F32;
    a.up = reinterpret_cast<uintptr_t>(up.data()), a.up_dtype = PC_DTYPE_F32;
    a.down = reinterpret_cast<uintptr_t>(dn.data()), a.down_dtype = PC_DTYPE_F32;
    a.out = reinterpret_cast<uintptr_t>(out);
    a.n_tokens = T, a.n_embd = d, a.n_ff = ff, a.n_experts = E, a.n_used = 2;
    a.norm_weights = 1;
    return a;
  };
  std::vector<float> merged(T * d), low(T * d), plain(T * d), old_host(T * d);
  pc_moe_args_t m = args(gate_m, down_m, merged.data());
  ASSERT_EQ(RefLaunch(PC_OP_MOE, &m, IdentityMemory()), nullptr);
  pc_moe_args_t a = args(gate, down, low.data());
  EXPECT_FALSE(MoeHasLowRank(a));
  a.lora_a_dtype = a.lora_b_dtype = PC_DTYPE_F32;
  a.gate_lora_a = reinterpret_cast<uintptr_t>(ga.data());
  a.gate_lora_b = reinterpret_cast<uintptr_t>(gb.data());
  a.gate_lora_rank = r, a.gate_lora_scale = gs;
  a.down_lora_a = reinterpret_cast<uintptr_t>(da.data());
  a.down_lora_b = reinterpret_cast<uintptr_t>(db.data());
  a.down_lora_rank = r, a.down_lora_scale = ds;
  EXPECT_TRUE(MoeHasLowRank(a));
  ASSERT_EQ(RefLaunch(PC_OP_MOE, &a, IdentityMemory()), nullptr);
  for (int64_t i = 0; i < T * d; ++i) EXPECT_NEAR(low[i], merged[i], 1e-5) << i;
  // 1.6's struct ends before the terms: they are absent.
  pc_moe_args_t older = a;
  older.struct_size = offsetof(pc_moe_args_t, lora_a_dtype);
  older.out = reinterpret_cast<uintptr_t>(old_host.data());
  EXPECT_FALSE(MoeHasLowRank(older));
  ASSERT_EQ(RefLaunch(PC_OP_MOE, &older, IdentityMemory()), nullptr);
  pc_moe_args_t p = args(gate, down, plain.data());
  ASSERT_EQ(RefLaunch(PC_OP_MOE, &p, IdentityMemory()), nullptr);
  EXPECT_EQ(old_host, plain);
  bool differs = false;
  for (int64_t i = 0; i < T * d; ++i) differs = differs || std::fabs(plain[i] - low[i]) > 1e-3f;
  EXPECT_TRUE(differs) << "the terms changed nothing";
  a.up_lora_a = a.gate_lora_a;  // an address without B and rank
  EXPECT_NE(RefLaunch(PC_OP_MOE, &a, IdentityMemory()), nullptr);
  // The query: dtypes[3] is A's type, PC_DTYPE_INVALID without terms.
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  q.op = PC_OP_MOE;
  q.dtypes[0] = q.dtypes[1] = q.dtypes[2] = PC_DTYPE_Q4_K;
  q.dtypes[3] = PC_DTYPE_INVALID;
  EXPECT_TRUE(RefSupports(q));
  q.dtypes[3] = PC_DTYPE_Q8_0;
  EXPECT_TRUE(RefSupports(q));
  q.dtypes[3] = PC_DTYPE_Q4_K;  // not a low-rank type
  EXPECT_FALSE(RefSupports(q));
}

// LORA is the MATMUL (x A^T), SCALE, MATMUL (+= t B^T) it stands for, run on each listed row
// alone: the same numbers to the bit, the rows not listed untouched; rows 0 is the first rows.
TEST(RefKernels, LoraIsMatmulScaleMatmulOverTheListedRows) {
  const int64_t m = 6, k = 64, n = 40, rank = 32;
  const float scale = 0.625f;
  auto x = Random(m * k, 11), af = Random(rank * k, 12), bf = Random(n * rank, 13);
  auto out0 = Random(m * n, 14);
  for (auto [at, bt] :
       {std::pair{PC_DTYPE_F16, PC_DTYPE_F16}, std::pair{PC_DTYPE_Q8_0, PC_DTYPE_Q8_0},
        std::pair{PC_DTYPE_Q8_0, PC_DTYPE_F32}}) {
    std::vector<uint8_t> a(rank * RowBytes(at, k)), b(n * RowBytes(bt, rank));
    for (int64_t j = 0; j < rank; ++j)
      ASSERT_TRUE(QuantizeRow(at, af.data() + j * k, a.data() + j * RowBytes(at, k), k));
    for (int64_t j = 0; j < n; ++j)
      ASSERT_TRUE(QuantizeRow(bt, bf.data() + j * rank, b.data() + j * RowBytes(bt, rank), rank));
    const std::vector<int32_t> rows = {4, 1, 5};
    std::vector<float> expected = out0, t(rank);
    for (int32_t r : rows) {
      pc_matmul_args_t mm{sizeof(mm)};  // t [rank] = x[r] A^T
      mm.x = D(x.data() + r * k), mm.w = D(a.data()), mm.w_dtype = at, mm.out = D(t.data());
      mm.m = 1, mm.n = rank, mm.k = k, mm.x_stride = k, mm.out_stride = rank;
      ASSERT_EQ(RefLaunch(PC_OP_MATMUL, &mm, IdentityMemory()), nullptr);
      pc_scale_args_t sc{sizeof(sc), D(t.data()), D(t.data()), rank, scale};
      ASSERT_EQ(RefLaunch(PC_OP_SCALE, &sc, IdentityMemory()), nullptr);
      mm.x = D(t.data()), mm.w = D(b.data()), mm.w_dtype = bt;  // out[r] += t B^T
      mm.out = D(expected.data() + r * n), mm.n = n, mm.k = rank, mm.x_stride = rank;
      mm.out_stride = n, mm.accumulate = 1;
      ASSERT_EQ(RefLaunch(PC_OP_MATMUL, &mm, IdentityMemory()), nullptr);
    }
    std::vector<float> out = out0;
    pc_lora_args_t l{sizeof(l)};
    l.x = D(x.data()), l.out = D(out.data()), l.m = m, l.rows = D(rows.data()), l.n_rows = 3;
    l.k = k, l.n = n, l.a = D(a.data()), l.b = D(b.data()), l.a_dtype = at, l.b_dtype = bt;
    l.rank = rank, l.scale = scale;
    ASSERT_EQ(RefLaunch(PC_OP_LORA, &l, IdentityMemory()), nullptr);
    EXPECT_EQ(out, expected);
    // The first two rows, without a list: rows 0 and 1 move, the others keep their values.
    std::vector<float> first = out0;
    l.out = D(first.data()), l.rows = 0, l.n_rows = 2;
    ASSERT_EQ(RefLaunch(PC_OP_LORA, &l, IdentityMemory()), nullptr);
    EXPECT_NE(std::vector<float>(first.begin(), first.begin() + 2 * n),
              std::vector<float>(out0.begin(), out0.begin() + 2 * n));
    EXPECT_EQ(std::vector<float>(first.begin() + 2 * n, first.end()),
              std::vector<float>(out0.begin() + 2 * n, out0.end()));
    // A listed row outside x and out is an error, not a write.
    const int32_t outside = int32_t(m);
    l.rows = D(&outside), l.n_rows = 1;
    EXPECT_NE(RefLaunch(PC_OP_LORA, &l, IdentityMemory()), nullptr);
  }
}

}  // namespace
}  // namespace polychip::sdk
