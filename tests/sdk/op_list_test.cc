// The op list (pc_ops.def) as the SDK exposes it: names, ids and args sizes agree with the ABI
// header, and the dispatch generated from it reaches every op.
#include "polychip/sdk/op_list.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "polychip/sdk/ref_kernels.h"

namespace polychip::sdk {
namespace {

TEST(OpList, NamesAndIdsRoundTripForEveryOp) {
  std::set<std::string> names;
  int count = 0;
  ForEachOp([&](auto t) {
    using T = decltype(t);
    pc_op_t op;
    ASSERT_TRUE(OpFromName(T::kName, &op)) << T::kName;
    EXPECT_EQ(op, T::kOp);
    EXPECT_STREQ(OpName(T::kOp), T::kName);
    EXPECT_TRUE(names.insert(T::kName).second) << "duplicate name " << T::kName;
    EXPECT_EQ(OpArgsSize(T::kOp), sizeof(typename T::Args));
    ++count;
  });
  EXPECT_EQ(count, PC_OP_COUNT - 1);  // ids 1..COUNT-1, none skipped
  pc_op_t op;
  EXPECT_FALSE(OpFromName("softmax", &op));
  EXPECT_STREQ(OpName(static_cast<pc_op_t>(999)), "unknown");
  EXPECT_EQ(OpArgsSize(static_cast<pc_op_t>(999)), 0u);
}

TEST(OpList, FirstVersionSizeComesFromTheMembersSinceColumn) {
  // EMBEDDING's table_layout was appended in 1.2: a 1.0 host's struct ends before it.
  EXPECT_EQ(OpArgsMinSize(PC_OP_EMBEDDING), offsetof(pc_embedding_args_t, table_layout));
  EXPECT_EQ(OpArgsMinSize(PC_OP_SWIGLU), sizeof(pc_swiglu_args_t));
  pc_embedding_args_t old{};
  old.struct_size = offsetof(pc_embedding_args_t, table_layout);
  old.table_dtype = PC_DTYPE_F32;
  old.row_len = 4;
  old.table_layout = 7;  // beyond struct_size: must not be read
  EXPECT_EQ(ValidateOpArgs(PC_OP_EMBEDDING, &old), nullptr);
  old.struct_size -= 1;
  EXPECT_STREQ(ValidateOpArgs(PC_OP_EMBEDDING, &old), "args struct_size too small");
}

TEST(OpList, ExtentsOfAddressMembersFollowTheArgs) {
  pc_matmul_args_t a{};
  a.m = 3, a.n = 5, a.k = 8, a.x_stride = 10, a.out_stride = 6;
  std::map<std::string, int64_t> bytes;
  std::map<std::string, Access> access;
  OpTraits<PC_OP_MATMUL>::Members(MemberVisitor{
      [](auto...) {},
      [&](auto, const char* name, Access acc, auto extent, uint32_t, size_t) {
        const Extent e = extent(a);
        bytes[name] = acc == Access::kWeight ? e.rows * e.cols : e.bytes;
        access[name] = acc;
      }});
  EXPECT_EQ(bytes["x"], (2 * 10 + 8) * 4);
  EXPECT_EQ(bytes["out"], (2 * 6 + 5) * 4);
  EXPECT_EQ(bytes["w"], 5 * 8);  // [n, k] elements
  EXPECT_EQ(bytes["bias"], 0);   // absent
  EXPECT_EQ(access["out"], Access::kInOut);
  EXPECT_EQ(access["w"], Access::kWeight);
}

TEST(OpList, ReferenceSupportFollowsTheDtypeKinds) {
  pc_op_query_t q{};
  q.struct_size = sizeof(q);
  for (auto& d : q.dtypes) d = PC_DTYPE_INVALID;
  q.op = PC_OP_MATMUL;
  q.dtypes[0] = PC_DTYPE_Q4_K;
  EXPECT_TRUE(RefSupports(q));
  q.op = PC_OP_ATTENTION;  // a cache is F32/F16/BF16 only
  EXPECT_FALSE(RefSupports(q));
  q.dtypes[0] = PC_DTYPE_BF16;
  EXPECT_TRUE(RefSupports(q));
  q.op = PC_OP_CONVERT;  // quantized -> F32 only
  q.dtypes[0] = PC_DTYPE_Q8_0;
  q.dtypes[1] = PC_DTYPE_F16;
  EXPECT_FALSE(RefSupports(q));
  q.dtypes[1] = PC_DTYPE_F32;
  EXPECT_TRUE(RefSupports(q));
  q.op = PC_OP_SWIGLU;  // activations only
  q.dtypes[0] = PC_DTYPE_F16;
  EXPECT_FALSE(RefSupports(q));
  q.dtypes[0] = PC_DTYPE_F32;
  EXPECT_TRUE(RefSupports(q));
}

}  // namespace
}  // namespace polychip::sdk
