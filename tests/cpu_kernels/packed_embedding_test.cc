// EMBEDDING from the cpu plugin's packed layout (a tied model's output matrix serving as its
// embedding table) against the SDK reference on the GGUF bytes: rows in a partial last group
// of 16, repeated ids, both ends of the table. Q4_0, Q8_0, Q5_0 and the K-quants unpack to
// exactly the reference's values; IQ4_XS within the f16 rounding of its folded scales.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_ops.h"
#include "packed.h"
#include "panel.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"

namespace polychip::cpu {
namespace {

pc_devptr_t D(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A GGUF table of n random rows of k elements of dtype t.
std::vector<uint8_t> RandomGgufTable(pc_dtype_t t, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> row(k);
  const int64_t rb = sdk::RowBytes(t, k);
  std::vector<uint8_t> gguf(n * rb);
  for (int64_t r = 0; r < n; ++r) {
    for (float& x : row) x = u(rng);
    EXPECT_TRUE(sdk::QuantizeRow(t, row.data(), gguf.data() + r * rb, k));
  }
  return gguf;
}

// EMBEDDING of `ids` by the reference on the GGUF table (*want) and by the cpu plugin on the
// same table in `layout` (*got).
void RunEmbedding(pc_dtype_t t, int64_t n, int64_t k, const std::vector<uint8_t>& gguf,
                  const std::vector<uint8_t>& laid_out, uint32_t layout,
                  const std::vector<int32_t>& ids, std::vector<float>* want,
                  std::vector<float>* got) {
  const int64_t m = static_cast<int64_t>(ids.size());
  *want = std::vector<float>(m * k);
  *got = std::vector<float>(m * k, NAN);
  pc_embedding_args_t a{};
  a.struct_size = sizeof(a);
  a.table = D(gguf.data()), a.table_dtype = t, a.n_rows = n, a.row_len = k;
  a.ids = D(ids.data()), a.n_ids = m, a.out = D(want->data());
  ASSERT_EQ(sdk::RefLaunch(PC_OP_EMBEDDING, &a, sdk::IdentityMemory()), nullptr);
  a.table = D(laid_out.data()), a.out = D(got->data());
  ASSERT_EQ(EmbeddingPacked(a, layout), nullptr);
}

TEST(PackedEmbedding, MatchesReferenceOnGgufTable) {
  const int64_t n = 37;  // two full groups of 16 and a partial one
  const std::vector<int32_t> ids = {0, 36, 17, 5, 17, 32, 15, 16, 35};
  for (pc_dtype_t t : {PC_DTYPE_Q4_0, PC_DTYPE_Q8_0, PC_DTYPE_Q5_0, PC_DTYPE_Q4_K, PC_DTYPE_Q6_K,
                       PC_DTYPE_Q4_1, PC_DTYPE_Q5_1, PC_DTYPE_IQ4_NL, PC_DTYPE_IQ4_XS,
                       PC_DTYPE_Q2_K, PC_DTYPE_Q3_K, PC_DTYPE_Q5_K}) {
    // Types whose packed scales are folded products (rounded to f16) vs exact copies (the
    // K-quants keep their integer scales, kquant.h).
    const bool kquant = t == PC_DTYPE_IQ4_XS;
    const int64_t k = sdk::GetDtypeInfo(t)->block_elems == 256 ? 512 : 96;
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    const std::vector<uint8_t> gguf = RandomGgufTable(t, n, k, 7);
    PackedFormat f;
    ASSERT_TRUE(PackedFormatOf(t, &f));
    std::vector<uint8_t> packed(PackedBytes(f, n, k), 0xAA);
    PackGroups(t, gguf.data(), n, k, 0, (n + kPackRows - 1) / kPackRows, packed.data());
    const int64_t m = static_cast<int64_t>(ids.size());
    std::vector<float> want, got;
    RunEmbedding(t, n, k, gguf, packed, kLayoutPacked, ids, &want, &got);

    for (int64_t i = 0; i < m * k; i += 32) {
      float block_max = 0;
      for (int e = 0; e < 32; ++e) block_max = std::max(block_max, std::fabs(want[i + e]));
      for (int e = 0; e < 32; ++e) {
        if (kquant) {
          // f16 scale and min: each off by at most 2^-11 of a term no larger than ~2x the block
          // maximum. A wrong lane or block would be off by about the block maximum.
          ASSERT_NEAR(got[i + e], want[i + e], 4e-3 * block_max + 1e-7) << "element " << i + e;
        } else {
          ASSERT_EQ(got[i + e], want[i + e]) << "element " << i + e;
        }
      }
    }

    const int32_t bad = static_cast<int32_t>(n);
    pc_embedding_args_t a{};
    a.struct_size = sizeof(a);
    a.table = D(packed.data()), a.table_dtype = t, a.n_rows = n, a.row_len = k;
    a.ids = D(&bad), a.n_ids = 1, a.out = D(got.data());
    EXPECT_NE(EmbeddingPacked(a, kLayoutPacked), nullptr);  // id out of range
  }
}

// Float tables in panels (the AVX-512 and AVX2 layout of F16/BF16/F32 matrices): exactly the reference's
// values, rows from a partial last panel of 32 included.
TEST(PackedEmbedding, PanelTableMatchesReference) {
  const int64_t n = 70, k = 40;
  const std::vector<int32_t> ids = {0, 69, 31, 32, 64, 5, 31};
  for (pc_dtype_t t : {PC_DTYPE_F32, PC_DTYPE_F16, PC_DTYPE_BF16}) {
    SCOPED_TRACE(sdk::GetDtypeInfo(t)->name);
    const std::vector<uint8_t> gguf = RandomGgufTable(t, n, k, 9);
    std::vector<uint8_t> panels(PanelBytes(t, n, k), 0xAA);
    PackPanels(t, gguf.data(), n, k, 0, (n + kPanelRows - 1) / kPanelRows, panels.data());
    std::vector<float> want, got;
    RunEmbedding(t, n, k, gguf, panels, kLayoutPanel, ids, &want, &got);
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace polychip::cpu
