// Tests of the SDK's GGUF block formats: exact encodings of simple inputs, round-trip error
// bounds per type, and row handling.
#include "polychip/sdk/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace polychip::sdk {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Dtype, TableMatchesGguf) {
  struct Row {
    pc_dtype_t t;
    const char* name;
    int64_t elems, bytes;
  } rows[] = {{PC_DTYPE_F32, "F32", 1, 4},      {PC_DTYPE_F16, "F16", 1, 2},
              {PC_DTYPE_BF16, "BF16", 1, 2},    {PC_DTYPE_Q4_0, "Q4_0", 32, 18},
              {PC_DTYPE_Q4_1, "Q4_1", 32, 20},  {PC_DTYPE_Q5_0, "Q5_0", 32, 22},
              {PC_DTYPE_Q5_1, "Q5_1", 32, 24},  {PC_DTYPE_Q8_0, "Q8_0", 32, 34},
              {PC_DTYPE_Q2_K, "Q2_K", 256, 84}, {PC_DTYPE_Q3_K, "Q3_K", 256, 110},
              {PC_DTYPE_Q4_K, "Q4_K", 256, 144}, {PC_DTYPE_Q5_K, "Q5_K", 256, 176},
              {PC_DTYPE_Q6_K, "Q6_K", 256, 210}, {PC_DTYPE_IQ4_NL, "IQ4_NL", 32, 18},
              {PC_DTYPE_IQ4_XS, "IQ4_XS", 256, 136}, {PC_DTYPE_I8, "I8", 1, 1},
              {PC_DTYPE_I64, "I64", 1, 8},      {PC_DTYPE_F64, "F64", 1, 8}};
  for (const Row& r : rows) {
    const DtypeInfo* info = GetDtypeInfo(r.t);
    ASSERT_NE(info, nullptr) << r.name;
    EXPECT_STREQ(info->name, r.name);
    EXPECT_EQ(info->block_elems, r.elems) << r.name;
    EXPECT_EQ(info->block_bytes, r.bytes) << r.name;
    pc_dtype_t found = PC_DTYPE_INVALID;
    EXPECT_EQ(FindDtypeByName(r.name, &found), info);
    EXPECT_EQ(found, r.t);
  }
  pc_dtype_t t;
  EXPECT_NE(FindDtypeByName("q4_k", &t), nullptr);
  EXPECT_EQ(t, PC_DTYPE_Q4_K);
  EXPECT_EQ(FindDtypeByName("Q4_", &t), nullptr);
  EXPECT_EQ(FindDtypeByName("Q4_KX", &t), nullptr);
  EXPECT_EQ(GetDtypeInfo(static_cast<pc_dtype_t>(4)), nullptr);  // removed Q4_2 slot
  EXPECT_EQ(RowBytes(PC_DTYPE_Q4_K, 512), 288);
  EXPECT_EQ(RowBytes(PC_DTYPE_Q4_K, 100), -1);
  EXPECT_EQ(RowBytes(PC_DTYPE_F16, 7), 14);
}

TEST(Half, KnownValues) {
  EXPECT_EQ(Fp32ToFp16(1.0f), 0x3C00);
  EXPECT_EQ(Fp32ToFp16(-2.0f), 0xC000);
  EXPECT_EQ(Fp32ToFp16(0.0f), 0x0000);
  EXPECT_EQ(Fp32ToFp16(-0.0f), 0x8000);
  EXPECT_EQ(Fp32ToFp16(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65519.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16(65520.0f), 0x7C00);  // rounds up to infinity
  EXPECT_EQ(Fp32ToFp16(INFINITY), 0x7C00);
  EXPECT_EQ(Fp32ToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even
  EXPECT_EQ(Fp32ToFp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -24)), 0x0001);             // smallest subnormal
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -25)), 0x0000);             // tie -> even (zero)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(3.0f, -25)), 0x0002);             // tie -> even (two)
  EXPECT_EQ(Fp32ToFp16(std::ldexp(1.0f, -14)), 0x0400);             // smallest normal
  EXPECT_TRUE(std::isnan(Fp16ToFp32(Fp32ToFp16(NAN))));
  EXPECT_EQ(Fp16ToFp32(0x3555), Bits(0x3EAAA000));  // 0.333251953125
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Fp16ToFp32(0xFC00), -INFINITY);
  // Every finite half survives the round trip.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;
    ASSERT_EQ(Fp32ToFp16(Fp16ToFp32(h)), h) << std::hex << h;
  }
}

TEST(Bf16, KnownValues) {
  EXPECT_EQ(Fp32ToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(Fp32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(Fp32ToBf16(-3.0f), 0xC040);
  EXPECT_EQ(Bf16ToFp32(0x4049), Bits(0x40490000));
  EXPECT_TRUE(std::isnan(Bf16ToFp32(Fp32ToBf16(NAN))));
}

TEST(Q8_0, ExactEncoding) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);  // amax 16 -> d = 16/127
  uint8_t b[34];
  ASSERT_TRUE(QuantizeRow(PC_DTYPE_Q8_0, x, b, 32));
  EXPECT_EQ(b[0] | (b[1] << 8), Fp32ToFp16(16.0f / 127));
  EXPECT_EQ(static_cast<int8_t>(b[2 + 0]), -127);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 16]), 0);
  EXPECT_EQ(static_cast<int8_t>(b[2 + 24]), 64);  // 8 * 127/16 = 63.5 -> 64 (f32 arithmetic)
  float y[32];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_Q8_0, b, y, 32));
  for (int j = 0; j < 32; ++j) EXPECT_NEAR(y[j], x[j], 16.0f / 127) << j;
}

TEST(Q4_0, ExactEncoding) {
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8);  // max |x| = 8 -> d = 1
  uint8_t b[18];
  ASSERT_TRUE(QuantizeRow(PC_DTYPE_Q4_0, x, b, 32));
  EXPECT_EQ(b[0] | (b[1] << 8), Fp32ToFp16(1.0f));
  for (int j = 0; j < 16; ++j) EXPECT_EQ(b[2 + j], j | (j << 4)) << j;
  float y[32];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_Q4_0, b, y, 32));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], x[j]);
}

TEST(Q5_0, KnownDecoding) {
  // d = 0.5, element 3 has its fifth bit set in qh bit 3, element 20 in qh bit 20.
  uint8_t b[22] = {};
  uint16_t d = Fp32ToFp16(0.5f);
  b[0] = d & 0xFF, b[1] = d >> 8;
  b[2 + 0] = 1u << 3;  // qh bit 3
  b[2 + 2] = 1u << 4;  // qh bit 20
  b[6 + 3] = 0x05;     // element 3 low nibble 5 -> code 21 -> (21 - 16) * 0.5
  b[6 + 4] = 0x70;     // element 20 high nibble 7 -> code 23
  float y[32];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_Q5_0, b, y, 32));
  EXPECT_EQ(y[3], 2.5f);
  EXPECT_EQ(y[20], 3.5f);
  EXPECT_EQ(y[0], -8.0f);   // code 0
  EXPECT_EQ(y[19], -8.0f);  // code 0
}

TEST(IQ4_NL, KnownDecoding) {
  // d = 0.5; element 2 has index 0 (-127), element 18 index 15 (113), element 5 index 9 (13).
  uint8_t b[18] = {};
  const uint16_t d = Fp32ToFp16(0.5f);
  b[0] = d & 0xFF, b[1] = d >> 8;
  for (int j = 0; j < 16; ++j) b[2 + j] = 0x88;  // index 8 (value 1) everywhere else
  b[2 + 2] = 0xF0;                                // element 2 low nibble 0, element 18 high 15
  b[2 + 5] = 0x89;                                // element 5 low nibble 9
  float y[32];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_IQ4_NL, b, y, 32));
  EXPECT_EQ(y[2], -63.5f);
  EXPECT_EQ(y[18], 56.5f);
  EXPECT_EQ(y[5], 6.5f);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[31], 0.5f);
}

TEST(IQ4_XS, KnownDecoding) {
  // d = 0.25; sub-block 0: ls = 33 (low nibble 1 in scales_l[0], high bits 2 in scales_h bits
  // 0-1) -> scale 0.25; sub-block 7: ls = 0 -> scale -8 (high nibble of scales_l[3]).
  uint8_t b[136] = {};
  const uint16_t d = Fp32ToFp16(0.25f);
  b[0] = d & 0xFF, b[1] = d >> 8;
  b[2] = 2;            // scales_h: sub-block 0's bits 4-5 = 2 (ls 32 + 1); others 0
  b[4] = 0x01;         // scales_l[0]: sub-block 0 low nibble 1, sub-block 1 low nibble 0
  b[4 + 3] = 0x00;     // sub-block 6 and 7: ls 0
  b[8] = 0xF0;         // sub-block 0, element 0 index 0 (-127), element 16 index 15 (113)
  b[8 + 16 * 7 + 1] = 0x09;  // sub-block 7, element 1 index 9 (13), element 17 index 0
  float y[256];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_IQ4_XS, b, y, 256));
  EXPECT_EQ(y[0], -31.75f);
  EXPECT_EQ(y[16], 28.25f);
  EXPECT_EQ(y[7 * 32 + 1], 13 * -8.0f);
  EXPECT_EQ(y[7 * 32 + 17], -127 * -8.0f);
  EXPECT_EQ(y[32], -127 * 0.25f * -32);  // sub-block 1: ls 0, index 0
}

// The non-linear codebook spends its levels where normally distributed weights are: at the
// same 4.5 bits per weight IQ4_NL beats Q4_0's uniform grid.
TEST(IQ4_NL, BeatsQ4_0OnGaussianWeights) {
  const int64_t n = 4096;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n), y(n);
  for (auto& v : x) v = dist(rng);
  auto rms = [&](pc_dtype_t t) {
    std::vector<uint8_t> q(RowBytes(t, n));
    EXPECT_TRUE(QuantizeRow(t, x.data(), q.data(), n));
    EXPECT_TRUE(DequantizeRow(t, q.data(), y.data(), n));
    double e = 0;
    for (int64_t i = 0; i < n; ++i) e += (y[i] - x[i]) * (y[i] - x[i]);
    return std::sqrt(e / n);
  };
  const double nl = rms(PC_DTYPE_IQ4_NL), q4 = rms(PC_DTYPE_Q4_0);
  EXPECT_LT(nl, 0.9 * q4) << "IQ4_NL " << nl << " vs Q4_0 " << q4;
}

TEST(Q4_K, KnownDecoding) {
  // One super-block: d = 1, dmin = 0.5; sub-block 0 scale 3 min 2; sub-block 5 (j >= 4 path)
  // scale 33 (needs the top bits) min 17.
  uint8_t b[144] = {};
  uint16_t d = Fp32ToFp16(1.0f), dmin = Fp32ToFp16(0.5f);
  b[0] = d & 0xFF, b[1] = d >> 8, b[2] = dmin & 0xFF, b[3] = dmin >> 8;
  uint8_t* sc = b + 4;
  sc[0] = 3;
  sc[4] = 2;
  sc[9] = (33 & 0xF) | ((17 & 0xF) << 4);
  sc[1] |= (33 >> 4) << 6;
  sc[5] |= (17 >> 4) << 6;
  uint8_t* qs = b + 16;
  qs[0] = 0x0A;   // element 0: code 10 in sub-block 0
  qs[64 + 1] = 0x90;  // element 64*2 + 32 + 1 = 161 (sub-block 5): code 9
  float y[256];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_Q4_K, b, y, 256));
  EXPECT_EQ(y[0], 3 * 10 - 0.5f * 2);
  EXPECT_EQ(y[1], -0.5f * 2);
  EXPECT_EQ(y[161], 33 * 9 - 0.5f * 17);
  EXPECT_EQ(y[160], -0.5f * 17);
}

TEST(Q6_K, KnownDecoding) {
  uint8_t b[210] = {};
  uint16_t d = Fp32ToFp16(0.25f);
  b[208] = d & 0xFF, b[209] = d >> 8;
  int8_t* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int s = 0; s < 16; ++s) sc[s] = static_cast<int8_t>(s - 8);
  // Element 128 + 96 + 17 = 241: half 1, r = 3, l = 17 -> ql[64 + 17 + 32] high nibble,
  // qh[128 + 32 + 17] bits 6-7, scale index 8 + 6 + 1 = 15.
  b[64 + 49] = 0xB0;             // low nibble of the code: 11
  b[128 + 32 + 17] = 2u << 6;    // top bits 2 -> code 32 + 11 = 43 -> 11 after offset
  float y[256];
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_Q6_K, b, y, 256));
  EXPECT_EQ(y[241], 0.25f * 7 * 11);
  EXPECT_EQ(y[0], 0.25f * -8 * -32);
}

struct RoundTrip {
  pc_dtype_t dtype;
  double max_rel_rms;  // RMS error / RMS of the data
};
// ctest shows the parameter beside the test name: its dtype, not its bytes.
void PrintTo(const RoundTrip& r, std::ostream* os) { *os << GetDtypeInfo(r.dtype)->name; }

class RoundTripTest : public testing::TestWithParam<RoundTrip> {};

TEST_P(RoundTripTest, ErrorBoundedOverOddRowCount) {
  const RoundTrip p = GetParam();
  const int64_t n = 512, rows = 3;
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n * rows);
  for (auto& v : x) v = dist(rng);
  for (int64_t j = 0; j < n; ++j) x[n + j] += 3.0f;  // a row with a strong offset
  const int64_t rb = RowBytes(p.dtype, n);
  ASSERT_GT(rb, 0);
  std::vector<uint8_t> q(rb * rows, 0xCD);
  std::vector<float> y(n * rows);
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(QuantizeRow(p.dtype, x.data() + r * n, q.data() + r * rb, n));
  }
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_TRUE(DequantizeRow(p.dtype, q.data() + r * rb, y.data() + r * n, n));
    double err = 0, ref = 0;
    for (int64_t j = 0; j < n; ++j) {
      err += (y[r * n + j] - x[r * n + j]) * (y[r * n + j] - x[r * n + j]);
      ref += x[r * n + j] * x[r * n + j];
    }
    const double rel = std::sqrt(err / ref);
    EXPECT_LT(rel, p.max_rel_rms) << GetDtypeInfo(p.dtype)->name << " row " << r;
    EXPECT_GT(rel, 0.0) << "a lossy format cannot be exact on random data";
  }
  // A second quantization of the same data gives the same bytes (deterministic).
  std::vector<uint8_t> q2(rb);
  ASSERT_TRUE(QuantizeRow(p.dtype, x.data(), q2.data(), n));
  EXPECT_EQ(0, std::memcmp(q2.data(), q.data(), rb));
  // A row length that is not a whole number of blocks is refused.
  if (GetDtypeInfo(p.dtype)->block_elems > 1) {
    EXPECT_FALSE(QuantizeRow(p.dtype, x.data(), q2.data(), n - 1));
    EXPECT_FALSE(DequantizeRow(p.dtype, q.data(), y.data(), n - 1));
  }
}

TEST_P(RoundTripTest, ZerosStayZero) {
  const RoundTrip p = GetParam();
  const int64_t n = 256;
  std::vector<float> x(n, 0.0f), y(n, 1.0f);
  std::vector<uint8_t> q(RowBytes(p.dtype, n));
  ASSERT_TRUE(QuantizeRow(p.dtype, x.data(), q.data(), n));
  ASSERT_TRUE(DequantizeRow(p.dtype, q.data(), y.data(), n));
  for (float v : y) ASSERT_EQ(v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, RoundTripTest,
    testing::Values(RoundTrip{PC_DTYPE_F16, 1e-3}, RoundTrip{PC_DTYPE_BF16, 5e-3},
                    RoundTrip{PC_DTYPE_Q8_0, 0.01}, RoundTrip{PC_DTYPE_Q5_0, 0.05},
                    RoundTrip{PC_DTYPE_Q5_1, 0.05}, RoundTrip{PC_DTYPE_Q4_0, 0.1},
                    RoundTrip{PC_DTYPE_Q4_1, 0.1}, RoundTrip{PC_DTYPE_Q6_K, 0.03},
                    RoundTrip{PC_DTYPE_Q5_K, 0.05}, RoundTrip{PC_DTYPE_Q4_K, 0.1},
                    RoundTrip{PC_DTYPE_Q3_K, 0.25}, RoundTrip{PC_DTYPE_Q2_K, 0.45},
                    RoundTrip{PC_DTYPE_IQ4_NL, 0.1}, RoundTrip{PC_DTYPE_IQ4_XS, 0.1}),
    [](const testing::TestParamInfo<RoundTrip>& info) {
      return std::string(GetDtypeInfo(info.param.dtype)->name);
    });

TEST(IntegerTypes, RoundTrip) {
  const float x[4] = {-3, 0, 7, 100};
  int32_t i32[4];
  float y[4];
  ASSERT_TRUE(QuantizeRow(PC_DTYPE_I32, x, i32, 4));
  EXPECT_EQ(i32[3], 100);
  ASSERT_TRUE(DequantizeRow(PC_DTYPE_I32, i32, y, 4));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], x[i]);
}

}  // namespace
}  // namespace polychip::sdk
