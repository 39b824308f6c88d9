// Every kernel variant of the cpu plugin that this CPU can run (scalar, avx2, avx512), forced
// one by one, against the SDK reference kernels on odd shapes: n not a multiple of the 16-row
// interleave, m = 1, 3, 17 (tiles of 4 plus a tail), strides, bias and accumulate. Quantized
// activations make the packed matmul approximate, so it is held to a relative error bound;
// the variants must also agree with the scalar variant almost exactly (same integer math).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "kernels.h"
#include "launch_overlap.h"
#include "packed.h"
#include "panel.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"
#include "thread_pool.h"

namespace polychip::cpu {

// ctest shows the parameter beside the test name: the ISA variant's name, not its address.
void PrintTo(const KernelTable* t, std::ostream* os) { *os << t->name; }

namespace {

pc_devptr_t D(const void* p) { return reinterpret_cast<uintptr_t>(p); }

std::vector<float> Random(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// ||a - b|| / ||b||
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<const KernelTable*> Variants() {
  std::vector<const KernelTable*> v = {&ScalarKernels()};
  if (CpuHasAvx2()) v.push_back(&Avx2Kernels());
  if (CpuHasAvx512()) v.push_back(&Avx512Kernels());
  return v;
}

class CpuKernels : public ::testing::TestWithParam<const KernelTable*> {
 protected:
  ThreadPool pool_{3};
  OpContext Ctx() const { return {const_cast<ThreadPool*>(&pool_), GetParam()}; }
};

// An n x k matrix of random weights (seed), quantized to t and repacked into the plugin's
// packed layout.
void PackedRandomWeights(const OpContext& c, pc_dtype_t t, int64_t n, int64_t k, uint32_t seed,
                         std::vector<uint8_t>* packed) {
  const auto wf = Random(n * k, seed);
  const int64_t rb = sdk::RowBytes(t, k);
  std::vector<uint8_t> w(n * rb);
  for (int64_t j = 0; j < n; ++j)
    ASSERT_TRUE(sdk::QuantizeRow(t, wf.data() + j * k, w.data() + j * rb, k));
  PackedFormat f;
  ASSERT_TRUE(PackedFormatOf(t, &f));
  packed->assign(PackedBytes(f, n, k), 0);
  PackParallel(c, t, w.data(), n, k, packed->data());
}

struct MatmulCase {
  pc_dtype_t dtype;
  int64_t m, n, k;
};

// Runs the cpu matmul (packed when the dtype packs) and the SDK reference on the same GGUF
// weights; returns both outputs and, optionally, a per-output error bound for int8 activations:
// rounding x to int8 moves each element by at most amax(block)/254, and the f16 scales of the
// packed K-quants are relatively off by at most 2^-11 (bounded here by 1e-3 of the block max).
void RunMatmul(const OpContext& c, const MatmulCase& mc, bool pack, std::vector<float>* got,
               std::vector<float>* want, std::vector<float>* bound = nullptr) {
  const int64_t xs = mc.k + 3, os = mc.n + 2;
  auto x = Random(mc.m * xs, 11), wf = Random(mc.n * mc.k, 12), bias = Random(mc.n, 13);
  const int64_t rb = sdk::RowBytes(mc.dtype, mc.k);
  std::vector<uint8_t> w(mc.n * rb);
  for (int64_t j = 0; j < mc.n; ++j)
    ASSERT_TRUE(sdk::QuantizeRow(mc.dtype, wf.data() + j * mc.k, w.data() + j * rb, mc.k));
  if (bound) {
    std::vector<float> wd(mc.k);
    *bound = std::vector<float>(mc.m * os, 0.f);
    for (int64_t j = 0; j < mc.n; ++j) {
      ASSERT_TRUE(sdk::DequantizeRow(mc.dtype, w.data() + j * rb, wd.data(), mc.k));
      for (int64_t i = 0; i < mc.m; ++i) {
        double b = 1e-5;
        for (int64_t e0 = 0; e0 < mc.k; e0 += 32) {
          float amax = 0, wmax = 0;
          for (int e = 0; e < 32; ++e) {
            amax = std::max(amax, std::fabs(x[i * xs + e0 + e]));
            wmax = std::max(wmax, std::fabs(wd[e0 + e]));
          }
          for (int e = 0; e < 32; ++e)
            b += std::fabs(wd[e0 + e]) * amax / 254 + 1e-3 * wmax * std::fabs(x[i * xs + e0 + e]);
        }
        (*bound)[i * os + j] = static_cast<float>(b * 1.01);
      }
    }
  }
  pc_matmul_args_t a{sizeof(a), D(x.data()), D(w.data()), mc.dtype, PC_LAYOUT_GGUF,
                     D(bias.data()), 0, mc.m, mc.n, mc.k, xs, os, /*accumulate=*/1};
  *want = std::vector<float>(mc.m * os, 0.25f);
  a.out = D(want->data());
  ASSERT_EQ(sdk::RefLaunch(PC_OP_MATMUL, &a, sdk::IdentityMemory()), nullptr);

  std::vector<uint8_t> packed;
  if (pack && PanelDtype(mc.dtype)) {
    packed.assign(PanelBytes(mc.dtype, mc.n, mc.k), 0xAA);
    PackPanelsParallel(c, mc.dtype, w.data(), mc.n, mc.k, packed.data());
    a.w = D(packed.data());
    a.w_layout = kLayoutPanel;
  } else if (pack) {
    PackedFormat f;
    ASSERT_TRUE(PackedFormatOf(mc.dtype, &f));
    packed.assign(PackedBytes(f, mc.n, mc.k), 0xAA);
    PackParallel(c, mc.dtype, w.data(), mc.n, mc.k, packed.data());
    a.w = D(packed.data());
    a.w_layout = kLayoutPacked;
  }
  *got = std::vector<float>(mc.m * os, 0.25f);
  a.out = D(got->data());
  ASSERT_EQ(Matmul(c, a), nullptr);
  // Padding columns between rows are untouched.
  for (int64_t i = 0; i < mc.m; ++i)
    for (int64_t j = mc.n; j < os; ++j) ASSERT_EQ((*got)[i * os + j], 0.25f);
}

// Activations are rounded as GGUF's quantized dot products define them, so that the packed
// matmul rounds as llama.cpp does: against a 32-block type each block of 32 has its own scale
// (Q8_0: d = amax / 127, the quants those of sdk::QuantizeRow to Q8_0), against a super-block
// type (K-quants, IQ4_XS) 256 activations share one (Q8_K: id = 127 / amax, d = 1 / id). The
// blocks of the test row span magnitudes 1 to 1e4, so a scale taken over the wrong span
// gives other quants.
TEST_P(CpuKernels, QuantizeRowRoundsAsGgufActivationTypes) {
  const KernelTable* kt = GetParam();
  const int64_t k = 1024, kb = k / kBlock;
  auto x = Random(k, 41);
  for (int64_t e = 0; e < k; ++e) x[e] *= std::pow(10.f, float((e / kBlock) % 5));
  ASSERT_EQ(ActScaleBlock(PC_DTYPE_Q8_0), 32);
  ASSERT_EQ(ActScaleBlock(PC_DTYPE_Q4_K), 256);
  ASSERT_EQ(ActScaleBlock(PC_DTYPE_IQ4_XS), 256);
  for (int64_t scale_block : {32, 256}) {
    SCOPED_TRACE("scale block " + std::to_string(scale_block));
    std::vector<ActBlock> got(kb);
    kt->quantize_row(x.data(), k, scale_block, got.data());
    std::vector<uint8_t> q8(sdk::RowBytes(PC_DTYPE_Q8_0, k));
    ASSERT_TRUE(sdk::QuantizeRow(PC_DTYPE_Q8_0, x.data(), q8.data(), k));
    for (int64_t b = 0; b < kb; ++b) {
      const float* xg = x.data() + b / (scale_block / kBlock) * scale_block;
      float amax = 0;
      for (int64_t i = 0; i < scale_block; ++i) amax = std::max(amax, std::fabs(xg[i]));
      const float id = scale_block == 32 ? 1.f / (amax / 127.f) : 127.f / amax;
      const float d = scale_block == 32 ? amax / 127.f : 1.f / id;
      ASSERT_EQ(got[b].d, d) << "block " << b;
      int32_t sum[2] = {0, 0};
      for (int i = 0; i < kBlock; ++i) {
        const int want = static_cast<int>(std::nearbyint(x[b * kBlock + i] * id));
        ASSERT_EQ(got[b].q[i], want) << "block " << b << " element " << i;
        if (scale_block == 32)  // Q8_0 block: f16 d, then 32 int8
          ASSERT_EQ(got[b].q[i], static_cast<int8_t>(q8[b * 34 + 2 + i])) << "block " << b;
        sum[i / 16] += want;
      }
      ASSERT_EQ(got[b].sum[0], sum[0]);
      ASSERT_EQ(got[b].sum[1], sum[1]);
    }
  }
}

TEST_P(CpuKernels, PackedMatmulMatchesReference) {
  for (pc_dtype_t t : {PC_DTYPE_Q4_0, PC_DTYPE_Q8_0, PC_DTYPE_Q5_0, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K,
                       PC_DTYPE_Q4_1, PC_DTYPE_Q5_1, PC_DTYPE_IQ4_NL, PC_DTYPE_IQ4_XS,
                       PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q5_K}) {
    const bool kquant = sdk::GetDtypeInfo(t)->block_elems == 256;
    for (int64_t m : {1, 3, 17, 31}) {  // 31 = tiles of 16, 8, 4 and 3 rows
      for (int64_t n : {1, 17, 40}) {
        const int64_t k = kquant ? 512 : 96;
        SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " m=" + std::to_string(m) +
                     " n=" + std::to_string(n));
        std::vector<float> got, want, bound;
        RunMatmul(Ctx(), {t, m, n, k}, /*pack=*/true, &got, &want, &bound);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - want[i]), bound[i]) << "output " << i;
        if (n * m >= 17) EXPECT_LT(RelErr(got, want), 1.5e-2);
      }
    }
  }
}

TEST_P(CpuKernels, PackedVariantAgreesWithScalar) {
  ThreadPool pool(2);
  for (pc_dtype_t t : {PC_DTYPE_Q4_0, PC_DTYPE_Q8_0, PC_DTYPE_Q5_0, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K,
                       PC_DTYPE_Q4_1, PC_DTYPE_Q5_1, PC_DTYPE_IQ4_NL, PC_DTYPE_IQ4_XS,
                       PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q5_K}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    std::vector<float> got, scalar, want;
    RunMatmul(Ctx(), {t, 5, 33, 256}, true, &got, &want);
    RunMatmul({&pool, &ScalarKernels()}, {t, 5, 33, 256}, true, &scalar, &want);
    EXPECT_LT(RelErr(got, scalar), 1e-5);
  }
}

// Decode's lockstep kernel (KernelTable::gemm_packed_streams) reads n_streams groups at once;
// each group's sums are the ones gemm_packed (m = 1) computes. Equal up to f32 rounding: the
// kernel files may reassociate float sums (-fassociative-math), differently where inlined.
TEST_P(CpuKernels, PackedStreamsEqualOneGroupAtATime) {
  const KernelTable* kt = GetParam();
  if (!kt->gemm_packed_streams) GTEST_SKIP() << kt->name << " has no streams kernel";
  for (pc_dtype_t t : {PC_DTYPE_Q4_0, PC_DTYPE_Q8_0, PC_DTYPE_Q5_0, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K,
                       PC_DTYPE_Q4_1, PC_DTYPE_Q5_1, PC_DTYPE_IQ4_NL, PC_DTYPE_IQ4_XS,
                       PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q5_K}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    const int64_t k = 512, kb = k / kBlock, n = 16 * 12;
    const auto xf = Random(k, 32);
    std::vector<uint8_t> packed;
    ASSERT_NO_FATAL_FAILURE(PackedRandomWeights(Ctx(), t, n, k, 31, &packed));
    PackedFormat f;
    ASSERT_TRUE(PackedFormatOf(t, &f));
    std::vector<ActBlock> x(kb);
    kt->quantize_row(xf.data(), k, ActScaleBlock(t), x.data());
    const int64_t group_bytes = kb * f.block_bytes();
    for (int ns = 1; ns <= kMaxWeightStreams; ++ns) {
      for (int64_t groups_apart : {1, 3}) {
        const bool prefetch = groups_apart == 1;  // does not change the sums
        SCOPED_TRACE(std::to_string(ns) + " streams " + std::to_string(groups_apart) +
                     " groups apart");
        std::vector<float> got(kMaxWeightStreams * kPackRows, 7.f), want(kPackRows);
        kt->gemm_packed_streams(f, packed.data(), groups_apart * group_bytes, ns, kb, x.data(),
                                got.data(), prefetch);
        for (int s = 0; s < ns; ++s) {
          kt->gemm_packed(f, packed.data() + s * groups_apart * group_bytes, kb, x.data(), kb, 1,
                          want.data());
          for (int r = 0; r < kPackRows; ++r)
            ASSERT_NEAR(got[s * kPackRows + r], want[r], 1e-5f * std::max(1.f, std::fabs(want[r])))
                << "stream " << s << " row " << r;
        }
        for (int64_t i = ns * kPackRows; i < kMaxWeightStreams * kPackRows; ++i)
          ASSERT_EQ(got[i], 7.f) << "wrote past stream " << ns;
      }
    }
  }
}

// Decode-shaped matmuls (m = 1) over enough groups for the streams path (cpu_ops.cc): every row
// of every run, the shorter last run included, against the reference.
TEST_P(CpuKernels, PackedDecodeMatmulMatchesReference) {
  for (pc_dtype_t t : {PC_DTYPE_Q8_0, PC_DTYPE_Q4_0, PC_DTYPE_Q5_0, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K}) {
    const bool kquant = sdk::GetDtypeInfo(t)->block_elems == 256;
    for (int64_t n : {16 * 4, 16 * 9 + 5, 16 * 14 + 1}) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " n=" + std::to_string(n));
      std::vector<float> got, want, bound;
      RunMatmul(Ctx(), {t, 1, n, kquant ? 256 : 96}, /*pack=*/true, &got, &want, &bound);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - want[i]), bound[i]) << "output " << i;
    }
  }
}

// The decode path splits the positions into one region per thread and lets a thread that is
// done take the others' last positions (ParallelRegions, cpu_ops.cc). Which thread runs what
// depends on timing, so the same accumulating matmul runs many times: a position run twice or
// never leaves an output off the reference (RunMatmul accumulates into 0.25).
// Batched decode (m = 4) takes regions of single groups the same way.
TEST_P(CpuKernels, PackedDecodeMatmulEveryPositionOnce) {
  for (int64_t m : {1, 4}) {
    for (int64_t n : {16 * 9 + 5, 16 * 40}) {
      for (int rep = 0; rep < 40; ++rep) {
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " rep " +
                     std::to_string(rep));
        std::vector<float> got, want, bound;
        RunMatmul(Ctx(), {PC_DTYPE_Q4_0, m, n, 64}, /*pack=*/true, &got, &want, &bound);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_LE(std::fabs(got[i] - want[i]), bound[i]) << "output " << i;
      }
    }
  }
}

// With the weight-read tuner (the plugin's default), successive launches of one decode matmul
// read it with 1, 2 and 3 streams, with and without prefetch, while exploring, then the chosen
// way: every launch gives the outputs of one stream (the streams kernel's sums are one group at
// a time's, up to f32 rounding in the K-quants' order of accumulation), and
// the tuner has decided after its exploration rounds wherever the ISA has a streams kernel.
TEST_P(CpuKernels, TunedDecodeMatmulGivesTheSameOutputsEveryLaunch) {
  const int64_t n = 16 * 14 + 1, k = 512;
  for (pc_dtype_t t : {PC_DTYPE_Q4_0, PC_DTYPE_Q4_K}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    const auto x = Random(k, 31);
    std::vector<uint8_t> packed;
    ASSERT_NO_FATAL_FAILURE(PackedRandomWeights(Ctx(), t, n, k, 32, &packed));
    pc_matmul_args_t a{sizeof(a), D(x.data()), D(packed.data()), t, kLayoutPacked, 0, 0, 1, n, k,
                       k, n, /*accumulate=*/0};
    std::vector<float> want(n), got(n);
    a.out = D(want.data());
    OpContext one = Ctx();
    one.weight_streams = 1;
    ASSERT_EQ(Matmul(one, a), nullptr);
    StreamsTuner tuner;
    OpContext tuned = Ctx();
    tuned.streams_tuner = &tuner;
    a.out = D(got.data());
    const int launches = StreamsTuner::kRoundsPerCandidate * StreamsTuner::kCandidates + 3;
    for (int i = 0; i < launches; ++i) {
      std::fill(got.begin(), got.end(), -1.f);
      ASSERT_EQ(Matmul(tuned, a), nullptr);
      for (int64_t r = 0; r < n; ++r)
        ASSERT_NEAR(got[r], want[r], 1e-5f * std::max(1.f, std::fabs(want[r])))
            << "launch " << i << " row " << r;
    }
    EXPECT_EQ(tuner.decisions(), GetParam()->gemm_packed_streams ? 1 : 0);
  }
}

// The K-quants' packed layout keeps d, dmin and the integer sub-block scales (kquant.h), so
// with activations that int8 holds exactly (integers, 127 in every block: scale 1) the packed
// matmul equals the double-precision product of the GGUF weights to f32 accumulation error.
// Folding d * sc into an f16 (the layout before) was off by up to 2^-11 per sub-block.
TEST_P(CpuKernels, PackedKQuantMatmulIsExact) {
  const int64_t m = 3, n = 33, k = 512;
  for (pc_dtype_t t : {PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q4_K, PC_DTYPE_Q5_K, PC_DTYPE_Q6_K}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    auto wf = Random(n * k, 21);
    const int64_t rb = sdk::RowBytes(t, k);
    std::vector<uint8_t> w(n * rb);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_TRUE(sdk::QuantizeRow(t, wf.data() + j * k, w.data() + j * rb, k));
    std::mt19937 rng(22);
    std::uniform_int_distribution<int> q(-127, 127);
    std::vector<float> x(m * k);
    for (int64_t e = 0; e < m * k; ++e) x[e] = e % 32 == 5 ? 127.f : static_cast<float>(q(rng));
    PackedFormat f;
    ASSERT_TRUE(PackedFormatOf(t, &f));
    std::vector<uint8_t> packed(PackedBytes(f, n, k));
    PackParallel(Ctx(), t, w.data(), n, k, packed.data());
    std::vector<float> got(m * n);
    pc_matmul_args_t a{sizeof(a), D(x.data()), D(packed.data()), t,     kLayoutPacked, 0,
                       D(got.data()), m,  n, k, k, n, /*accumulate=*/0};
    ASSERT_EQ(Matmul(Ctx(), a), nullptr);
    std::vector<float> wd(k);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_TRUE(sdk::DequantizeRow(t, w.data() + j * rb, wd.data(), k));
      for (int64_t i = 0; i < m; ++i) {
        double want = 0, mag = 0;
        for (int64_t e = 0; e < k; ++e) {
          want += double(wd[e]) * x[i * k + e];
          mag += std::fabs(double(wd[e]) * x[i * k + e]);
        }
        ASSERT_NEAR(got[i * n + j], want, 1e-6 * mag) << "row " << i << " col " << j;
      }
    }
  }
}

TEST_P(CpuKernels, GgufMatmulMatchesReference) {
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16, PC_DTYPE_Q4_K, PC_DTYPE_Q5_1}) {
    for (int64_t m : {1, 3, 17}) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " m=" + std::to_string(m));
      std::vector<float> got, want;
      RunMatmul(Ctx(), {t, m, 7, 256}, /*pack=*/false, &got, &want);
      EXPECT_LT(RelErr(got, want), 1e-5);
    }
  }
}

// Float weights with many activation rows: on AVX-512 the transposed-activation GEMM, with
// more than one 32-row column tile, K-blocks with a ragged last one, and partial 8-row and
// 32-row weight groups.
TEST_P(CpuKernels, FloatPrefillMatmulMatchesReference) {
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    for (int64_t m : {4, 37}) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " m=" + std::to_string(m));
      std::vector<float> got, want;
      RunMatmul(Ctx(), {t, m, 45, 601}, /*pack=*/false, &got, &want);
      EXPECT_LT(RelErr(got, want), 1e-5);
    }
  }
}

// Float weights in panels (the AVX-512 and AVX2 layout for F16/BF16/F32): decode (m = 1), tiles of 8
// activation rows with a ragged last one, n not a multiple of 32 (zero padding rows), and K
// longer than one 256-element K-block with a ragged tail. Panels and back give every row.
TEST_P(CpuKernels, PanelMatmulMatchesReference) {
  if (!GetParam()->gemm_panel) GTEST_SKIP() << GetParam()->name << " has no panel kernel";
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 21}) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " m=" + std::to_string(m));
      std::vector<float> got, want;
      RunMatmul(Ctx(), {t, m, 45, 601}, /*pack=*/true, &got, &want);
      EXPECT_LT(RelErr(got, want), 1e-5);
    }
    const int64_t n = 45, k = 37;
    auto wf = Random(n * k, 51);
    std::vector<uint8_t> w(n * sdk::RowBytes(t, k)), panels(PanelBytes(t, n, k));
    for (int64_t j = 0; j < n; ++j)
      ASSERT_TRUE(sdk::QuantizeRow(t, wf.data() + j * k, w.data() + j * sdk::RowBytes(t, k), k));
    PackPanels(t, w.data(), n, k, 0, (n + kPanelRows - 1) / kPanelRows, panels.data());
    std::vector<float> row(k), want(k);
    for (int64_t j = 0; j < n; ++j) {
      UnpackPanelRow(t, panels.data(), k, j, row.data());
      ASSERT_TRUE(sdk::DequantizeRow(t, w.data() + j * sdk::RowBytes(t, k), want.data(), k));
      ASSERT_EQ(row, want) << "row " << j;
    }
  }
}

// A row's result does not depend on how many rows the launch has: speculative decoding's
// verification (the last token and k drafts, m = k + 1) must give decode's (m = 1) logits bit
// for bit, or greedy output would change with speculation (docs/speculative-decoding.md).
// RunMatmul's activations with the same seed are prefixes of each other, so row i of every
// launch is the same input.
TEST_P(CpuKernels, PanelMatmulRowsIndependentOfRowCount) {
  if (!GetParam()->gemm_panel) GTEST_SKIP() << GetParam()->name << " has no panel kernel";
  // Known exception: AVX-512's single-row tile sums even and odd elements in two chains (decode
  // latency), so its m = 1 rows differ from its multi-row tiles' in the last bits.
  if (GetParam()->isa == Isa::kAvx512)
    GTEST_SKIP() << "avx512's decode tile sums in two chains (not bit-identical to m > 1)";
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    const int64_t n = 70, k = 601, os = n + 2;
    std::vector<float> all, want;
    RunMatmul(Ctx(), {t, 12, n, k}, /*pack=*/true, &all, &want);
    for (int64_t m = 1; m <= 9; ++m) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(t)->name) + " m=" + std::to_string(m));
      std::vector<float> got;
      RunMatmul(Ctx(), {t, m, n, k}, /*pack=*/true, &got, &want);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(got[i * os + j], all[i * os + j]) << "row " << i << " column " << j;
    }
  }
}

// f32 values stored as a KV cache of `dtype` (F32, F16 or BF16), by the reference CONVERT.
std::vector<uint8_t> AsCache(const std::vector<float>& values, pc_dtype_t dtype) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<uint8_t> cache(n * (dtype == PC_DTYPE_F32 ? 4 : 2));
  pc_convert_args_t cv{sizeof(cv), D(values.data()), D(cache.data()), PC_DTYPE_F32, dtype, n};
  EXPECT_EQ(sdk::RefLaunch(PC_OP_CONVERT, &cv, sdk::IdentityMemory()), nullptr);
  return cache;
}

// Runs `a` (whose out is ignored) through the reference and through the cpu kernel.
void ExpectAttentionMatchesReference(const OpContext& c, pc_attention_args_t a, int64_t out_size) {
  std::vector<float> got(out_size), want(out_size);
  a.out = D(want.data());
  ASSERT_EQ(sdk::RefLaunch(PC_OP_ATTENTION, &a, sdk::IdentityMemory()), nullptr);
  a.out = D(got.data());
  ASSERT_EQ(Attention(c, a), nullptr);
  EXPECT_LT(RelErr(got, want), 1e-5);
}

TEST_P(CpuKernels, AttentionMatchesReference) {
  // Two sequences (a 3-token prefill chunk and a decode token), GQA 4:2, paged blocks of 4
  // slots given out of order.
  const int64_t n_heads = 4, n_kv = 2, hd = 40, bs = 4, n_blocks = 8, max_blocks = 4;
  const int64_t n_tokens = 4;
  for (pc_dtype_t cache : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(cache)->name);
    const int64_t cache_elems = n_blocks * bs * n_kv * hd;
    const auto kc = AsCache(Random(cache_elems, 21), cache);
    const auto vc = AsCache(Random(cache_elems, 22), cache);
    auto q = Random(n_tokens * n_heads * hd, 23);
    std::vector<int32_t> qstart = {0, 3, 4}, lens = {7, 13};
    std::vector<int32_t> tables = {5, 1, -1, -1, 2, 7, 0, 3};
    pc_attention_args_t a{sizeof(a), D(q.data()), D(kc.data()), D(vc.data()), 0,
                          D(qstart.data()), D(lens.data()), D(tables.data()), cache, n_tokens,
                          2, n_heads, n_kv, hd, bs, max_blocks, 13, 1.f / std::sqrt(40.f)};
    a.v_cache_dtype = cache;
    ExpectAttentionMatchesReference(Ctx(), a, n_tokens * n_heads * hd);
  }
}

// Long contexts: several 32-position chunks (the online softmax rescales), GQA 7:1 as in
// Qwen2.5-0.5B so one task's query vectors span more than one 32-wide column tile, a 19-token
// prefill chunk (several tasks per sequence) beside single decode tokens, head_dim 64.
TEST_P(CpuKernels, AttentionLongContextMatchesReference) {
  const int64_t n_heads = 14, n_kv = 2, hd = 64, bs = 16, max_blocks = 8;
  const int64_t n_blocks = 3 * max_blocks, n_tokens = 21;
  for (pc_dtype_t cache : {PC_DTYPE_F32, PC_DTYPE_F16}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(cache)->name);
    const int64_t cache_elems = n_blocks * bs * n_kv * hd;
    auto kf = Random(cache_elems, 41);
    for (auto& x : kf) x *= 4.f;  // peaked scores: a late chunk often raises the running max
    const auto kc = AsCache(kf, cache), vc = AsCache(Random(cache_elems, 42), cache);
    auto q = Random(n_tokens * n_heads * hd, 43);
    // Sequence 0: 19 new tokens ending at position 99; 1: decode at 127; 2: decode at 0.
    std::vector<int32_t> qstart = {0, 19, 20, 21}, lens = {100, 128, 1};
    std::vector<int32_t> tables(3 * max_blocks, -1);
    for (int64_t b = 0; b < max_blocks; ++b) {
      tables[b] = static_cast<int32_t>(2 * b + 1);  // out of order, interleaved
      tables[max_blocks + b] = static_cast<int32_t>(2 * b);
    }
    tables[2 * max_blocks] = static_cast<int32_t>(n_blocks - 1);
    pc_attention_args_t a{sizeof(a), D(q.data()), D(kc.data()), D(vc.data()), 0,
                          D(qstart.data()), D(lens.data()), D(tables.data()), cache, n_tokens,
                          3, n_heads, n_kv, hd, bs, max_blocks, 128, 1.f / std::sqrt(64.f)};
    a.v_cache_dtype = cache;
    // Sliding windows (1.4): one position, a part of a chunk, more than a chunk.
    for (int64_t window : {0, 1, 7, 40}) {
      SCOPED_TRACE("window " + std::to_string(window));
      a.window = window;
      ExpectAttentionMatchesReference(Ctx(), a, n_tokens * n_heads * hd);
    }
  }
}

// The transposing gather against the plain one, with ragged tiles (37 rows of 40 elements).
TEST_P(CpuKernels, CacheRowsTransposedMatchRows) {
  const KernelTable* kt = GetParam();
  const int64_t n_rows = 37, n = 40, ld = 48, slots = 64;
  for (pc_dtype_t cache : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(cache)->name);
    const auto c = AsCache(Random(slots * n, 61), cache);
    const int64_t row_bytes = n * (cache == PC_DTYPE_F32 ? 4 : 2);
    std::vector<int64_t> offsets(n_rows);
    for (int64_t r = 0; r < n_rows; ++r) offsets[r] = ((r * 7 + 3) % slots) * row_bytes;
    std::vector<float> rows(n_rows * n), t(n * ld, -9.f);
    kt->cache_rows_to_f32(cache, c.data(), offsets.data(), n_rows, n, rows.data());
    kt->cache_rows_to_f32_t(cache, c.data(), offsets.data(), n_rows, n, t.data(), ld);
    for (int64_t e = 0; e < n; ++e) {
      for (int64_t r = 0; r < n_rows; ++r)
        ASSERT_EQ(t[e * ld + r], rows[r * n + e]) << "row " << r << " element " << e;
      for (int64_t r = n_rows; r < ld; ++r) ASSERT_EQ(t[e * ld + r], -9.f) << "past the rows";
    }
  }
}

// A decode-only batch (AttentionDecode): GQA groups of 7 (scores as one GEMM per chunk) and of 2
// (a dot per query vector), positions over several chunks and a partial last chunk, windows.
TEST_P(CpuKernels, AttentionDecodeMatchesReference) {
  const int64_t hd = 64, bs = 16, max_blocks = 8, n_blocks = 3 * max_blocks, n_tokens = 3;
  for (int64_t n_heads : {14, 4}) {
    const int64_t n_kv = 2;
    for (pc_dtype_t cache : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
      SCOPED_TRACE(std::string(sdk::GetDtypeInfo(cache)->name) + " heads " +
                   std::to_string(n_heads));
      const int64_t cache_elems = n_blocks * bs * n_kv * hd;
      auto kf = Random(cache_elems, 51);
      for (auto& x : kf) x *= 4.f;
      const auto kc = AsCache(kf, cache), vc = AsCache(Random(cache_elems, 52), cache);
      auto q = Random(n_tokens * n_heads * hd, 53);
      // Decode at positions 127 (four chunks), 70 (a partial third chunk) and 0.
      std::vector<int32_t> qstart = {0, 1, 2, 3}, lens = {128, 71, 1};
      std::vector<int32_t> tables(3 * max_blocks, -1);
      for (int64_t b = 0; b < max_blocks; ++b) {
        tables[b] = static_cast<int32_t>(2 * b + 1);
        tables[max_blocks + b] = static_cast<int32_t>(2 * b);
      }
      tables[2 * max_blocks] = static_cast<int32_t>(n_blocks - 1);
      pc_attention_args_t a{sizeof(a), D(q.data()), D(kc.data()), D(vc.data()), 0,
                            D(qstart.data()), D(lens.data()), D(tables.data()), cache, n_tokens,
                            3, n_heads, n_kv, hd, bs, max_blocks, 128, 1.f / std::sqrt(64.f)};
      a.v_cache_dtype = cache;
      for (int64_t window : {0, 5, 40}) {
        SCOPED_TRACE("window " + std::to_string(window));
        a.window = window;
        ExpectAttentionMatchesReference(Ctx(), a, n_tokens * n_heads * hd);
      }
    }
  }
}

TEST_P(CpuKernels, RopeNormSwigluMatchReference) {
  for (pc_rope_mode_t mode : {PC_ROPE_NORMAL, PC_ROPE_NEOX}) {
    const int64_t T = 9, H = 3, hd = 64;
    auto x = Random(T * H * hd, 31);
    auto ref = x;
    std::vector<int32_t> pos = {0, 1, 2, 5, 8, 100, 1000, 3, 4};
    pc_rope_args_t a{sizeof(a), D(ref.data()), D(pos.data()), 0, T, H, hd, 48, mode,
                     10000.f, 1.f, 0.f, 1.f, 32.f, 1.f, 4096};
    ASSERT_EQ(sdk::RefLaunch(PC_OP_ROPE, &a, sdk::IdentityMemory()), nullptr);
    a.x = D(x.data());
    ASSERT_EQ(Rope(Ctx(), a), nullptr);
    EXPECT_LT(RelErr(x, ref), 1e-6);
  }
  {
    const int64_t rows = 11, dim = 77;
    auto x = Random(rows * dim, 41), w = Random(dim, 42);
    std::vector<float> got(x.size()), want(x.size());
    pc_rms_norm_args_t a{sizeof(a), D(x.data()), D(w.data()), D(want.data()), rows, dim, 1e-6f};
    ASSERT_EQ(sdk::RefLaunch(PC_OP_RMS_NORM, &a, sdk::IdentityMemory()), nullptr);
    a.out = D(got.data());
    ASSERT_EQ(RmsNorm(Ctx(), a), nullptr);
    EXPECT_LT(RelErr(got, want), 1e-6);
  }
  {
    const int64_t n = 70001;  // several parallel chunks and a ragged tail
    auto g = Random(n, 51, -30, 30), u = Random(n, 52);
    g[0] = -100.f;  // exp argument clamp
    g[1] = 90.f;
    std::vector<float> got(n), want(n);
    pc_swiglu_args_t a{sizeof(a), D(g.data()), D(u.data()), D(want.data()), n};
    ASSERT_EQ(sdk::RefLaunch(PC_OP_SWIGLU, &a, sdk::IdentityMemory()), nullptr);
    a.out = D(got.data());
    ASSERT_EQ(Swiglu(Ctx(), a), nullptr);
    EXPECT_LT(RelErr(got, want), 1e-6);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(got[i])) << i;
  }
  {
    const int64_t n = 70001;
    auto g = Random(n, 53, -12, 12), u = Random(n, 54);
    g[0] = -100.f;  // the cube overflows the exp argument: gelu -> 0 and x
    g[1] = 100.f;
    std::vector<float> got(n), want(n);
    pc_geglu_args_t a{sizeof(a), D(g.data()), D(u.data()), D(want.data()), n};
    ASSERT_EQ(sdk::RefLaunch(PC_OP_GEGLU, &a, sdk::IdentityMemory()), nullptr);
    a.out = D(got.data());
    ASSERT_EQ(Geglu(Ctx(), a), nullptr);
    EXPECT_LT(RelErr(got, want), 1e-6);
    for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(got[i])) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, CpuKernels, ::testing::ValuesIn(Variants()),
                         [](const auto& info) { return std::string(info.param->name); });

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 300; ++rep) {
      const int64_t n = 1 + rep % 37;
      std::vector<std::atomic<int>> hits(n);
      pool.Run(n, [&](int64_t t) { hits[t].fetch_add(1); });
      for (int64_t t = 0; t < n; ++t) ASSERT_EQ(hits[t].load(), 1);
    }
  }
}

// LORA through the cpu plugin's few-rows pass (up to 8 rows: A's GGUF rows below rank 32, A's
// panels from 32; on the calling thread under 256 KB, as one region of the pool above) and its
// two-step pass (9 rows), against the definition in doubles: out[rows] += s (x A^T) B^T over
// scattered rows, the rows not listed untouched.
TEST_P(CpuKernels, LoraMatchesDefinition) {
  struct Case {
    int64_t rank, k, n;
  };
  // Small (one thread) and large (> 256 KB: the region) launches, A in each layout.
  for (const Case cs : {Case{16, 96, 80}, Case{6, 96, 80}, Case{48, 96, 80}, Case{16, 4864, 4864},
                        Case{48, 2048, 1536}}) {
    for (const int64_t n_rows : {1, 3, 8, 9, 20}) {
      SCOPED_TRACE("rank " + std::to_string(cs.rank) + " k " + std::to_string(cs.k) + " n " +
                   std::to_string(cs.n) + " rows " + std::to_string(n_rows));
      const int64_t m = n_rows + 4;
      // Weights in the layouts weight_upload gives them: panels from 32 rows where the ISA
      // has the panel kernel, else as they are.
      struct Weight {
        std::vector<float> values;  // [rows, cols], F16-exact
        std::vector<uint8_t> bytes;
        uint32_t layout;
      };
      const auto weight = [&](int64_t rows, int64_t cols, uint32_t seed) {
        Weight w{Random(rows * cols, seed, -0.5f, 0.5f), {}, PC_LAYOUT_GGUF};
        std::vector<uint16_t> f16(w.values.size());
        for (size_t i = 0; i < f16.size(); ++i) {
          f16[i] = sdk::Fp32ToFp16(w.values[i]);
          w.values[i] = sdk::Fp16ToFp32(f16[i]);
        }
        const auto* src = reinterpret_cast<const uint8_t*>(f16.data());
        if (GetParam()->gemm_panel && rows >= kPanelRows) {
          w.bytes.resize(PanelBytes(PC_DTYPE_F16, rows, cols));
          PackPanels(PC_DTYPE_F16, src, rows, cols, 0, (rows + kPanelRows - 1) / kPanelRows,
                     w.bytes.data());
          w.layout = kLayoutPanel;
        } else {
          w.bytes.assign(src, src + f16.size() * 2);
        }
        return w;
      };
      const Weight a = weight(cs.rank, cs.k, 11), b = weight(cs.n, cs.rank, 12);
      const std::vector<float> x = Random(m * cs.k, 13), before = Random(m * cs.n, 14);
      std::vector<int32_t> rows;
      for (int64_t i = 0; i < n_rows; ++i) rows.push_back(int32_t((i * 5 + 3) % m));
      std::sort(rows.begin(), rows.end());
      rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
      ASSERT_EQ(int64_t(rows.size()), n_rows);
      std::reverse(rows.begin(), rows.end());  // unordered, as an adapter's rows in a batch
      const float scale = 0.75f;
      std::vector<double> want(before.begin(), before.end());
      for (const int32_t r : rows) {
        std::vector<double> t(cs.rank);
        for (int64_t q = 0; q < cs.rank; ++q)
          for (int64_t e = 0; e < cs.k; ++e)
            t[q] += double(x[r * cs.k + e]) * a.values[q * cs.k + e];
        for (int64_t j = 0; j < cs.n; ++j)
          for (int64_t q = 0; q < cs.rank; ++q)
            want[r * cs.n + j] += scale * t[q] * b.values[j * cs.rank + q];
      }
      std::vector<float> out = before;
      pc_lora_args_t l{};
      l.struct_size = sizeof(l);
      l.x = D(x.data()), l.out = D(out.data()), l.m = m, l.rows = D(rows.data());
      l.n_rows = n_rows, l.k = cs.k, l.n = cs.n, l.rank = cs.rank, l.scale = scale;
      l.a = D(a.bytes.data()), l.a_dtype = PC_DTYPE_F16, l.a_layout = a.layout;
      l.b = D(b.bytes.data()), l.b_dtype = PC_DTYPE_F16, l.b_layout = b.layout;
      ASSERT_EQ(Lora(Ctx(), l), nullptr);
      double err = 0, norm = 0;
      for (int64_t i = 0; i < m * cs.n; ++i) {
        const double term = want[i] - before[i];
        err += (out[i] - want[i]) * (out[i] - want[i]);
        norm += term * term;
      }
      ASSERT_GT(norm, 0);
      EXPECT_LT(std::sqrt(err / norm), 1e-5);
      for (int64_t i = 0; i < m; ++i) {
        if (std::find(rows.begin(), rows.end(), i) != rows.end()) continue;
        for (int64_t j = 0; j < cs.n; ++j)
          ASSERT_EQ(out[i * cs.n + j], before[i * cs.n + j]) << "row " << i << " not listed";
      }
      // More rows than the few-rows pass takes: each thread's share of the rows (RowShares)
      // gives what the two-step path of a one-thread pool gives, value for value.
      if (n_rows > 8) {
        ThreadPool one(1);
        std::vector<float> alone = before;
        pc_lora_args_t l1 = l;
        l1.out = D(alone.data());
        ASSERT_EQ(Lora(OpContext{&one, GetParam()}, l1), nullptr);
        for (int64_t i = 0; i < m * cs.n; ++i) ASSERT_EQ(out[i], alone[i]) << "element " << i;
      }
    }
  }
}

// Work handed to a pool whose workers may be late must still run exactly once per task, and
// Run must not return before tasks claimed by workers are finished.
TEST(ThreadPool, SlowTasksFinishBeforeRunReturns) {
  ThreadPool pool(3);
  for (int rep = 0; rep < 50; ++rep) {
    std::atomic<int> finished{0};
    pool.Run(6, [&](int64_t t) {
      if (t % 2) std::this_thread::sleep_for(std::chrono::microseconds(200));
      finished.fetch_add(1);
    });
    ASSERT_EQ(finished.load(), 6);
  }
}

// A posted job runs once, on a worker while the caller runs other jobs, or on the caller when
// it joins first; Join returns only after it finished.
TEST(ThreadPool, PostedJobRunsOnceBesideRuns) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 200; ++rep) {
      std::atomic<int> posted{0}, tasks{0};
      pool.Post([&] {
        if (rep % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
        posted.fetch_add(1);
      });
      if (rep % 2) pool.Run(5, [&](int64_t) { tasks.fetch_add(1); });  // beside it
      pool.Join();
      ASSERT_EQ(posted.load(), 1);
      ASSERT_FALSE(pool.Busy());
      if (rep % 2) ASSERT_EQ(tasks.load(), 5);
    }
  }
}

// A job posted while the worker sleeps (past its spin) is run: by the woken worker, or by Join.
TEST(ThreadPool, PostWakesASleepingWorker) {
  ThreadPool pool(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the worker goes to sleep
  std::atomic<std::thread::id> ran_on{};
  pool.Post([&] { ran_on = std::this_thread::get_id(); });
  // Up to 10 s: a loaded machine (the suite runs tests in parallel) may schedule it late.
  for (int i = 0; i < 100000 && pool.Busy(); ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_FALSE(pool.Busy());  // the worker woke up and ran it without a Join
  EXPECT_NE(ran_on.load(), std::this_thread::get_id());
  pool.Join();
}

// Which launches may run beside a LORA launch on a worker: those touching none of its buffers.
TEST(LaunchOverlap, OrderedByWhatTheyTouch) {
  std::vector<float> x(4 * 64), out(4 * 32), other(4 * 32), y(4 * 32);
  const auto p = [](const std::vector<float>& v, int64_t at = 0) {
    return static_cast<pc_devptr_t>(reinterpret_cast<uintptr_t>(v.data() + at));
  };
  pc_lora_args_t lora{};
  lora.struct_size = sizeof(lora);
  lora.x = p(x), lora.out = p(out), lora.m = 4, lora.n_rows = 4, lora.k = 64, lora.n = 32;
  LaunchAccess earlier;
  ASSERT_TRUE(AccessOf(PC_OP_LORA, &lora, &earlier));
  const auto later_matmul = [&](pc_devptr_t in, int64_t k, pc_devptr_t to) {
    pc_matmul_args_t mm{};
    mm.struct_size = sizeof(mm);
    mm.x = in, mm.out = to, mm.m = 4, mm.n = 32, mm.k = k, mm.x_stride = k, mm.out_stride = 32;
    LaunchAccess a;
    EXPECT_TRUE(AccessOf(PC_OP_MATMUL, &mm, &a));
    return earlier.OrderedBefore(a);
  };
  EXPECT_FALSE(later_matmul(p(x), 64, p(other)));  // reads what it reads: independent
  EXPECT_TRUE(later_matmul(p(out), 32, p(y)));     // reads what it writes
  EXPECT_TRUE(later_matmul(p(y), 32, p(x, 100)));  // writes inside what it reads
  EXPECT_TRUE(later_matmul(p(y), 32, p(out, 127)));  // writes its last element
  EXPECT_FALSE(later_matmul(p(y), 32, p(other)));
  pc_lora_args_t next = lora;  // the next adapter term: same input, another output
  next.out = p(other);
  LaunchAccess a;
  ASSERT_TRUE(AccessOf(PC_OP_LORA, &next, &a));
  EXPECT_FALSE(earlier.OrderedBefore(a));
  next.out = p(out, 64);
  ASSERT_TRUE(AccessOf(PC_OP_LORA, &next, &a));
  EXPECT_TRUE(earlier.OrderedBefore(a));
  pc_rms_norm_args_t norm{};  // any other op: its access is unknown
  EXPECT_FALSE(AccessOf(PC_OP_RMS_NORM, &norm, &a));
}

TEST(KernelSelection, NamesAndFallback) {
  ASSERT_NE(SelectKernels("auto"), nullptr);
  EXPECT_EQ(SelectKernels("scalar"), &ScalarKernels());
  EXPECT_EQ(SelectKernels("bogus"), nullptr);
  EXPECT_EQ(SelectKernels("avx512") != nullptr, CpuHasAvx512());
  EXPECT_EQ(SelectKernels("avx2") != nullptr, CpuHasAvx2());
}

}  // namespace
}  // namespace polychip::cpu
