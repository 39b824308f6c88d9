// The architecture registry (archs.def and each architecture's file): names, shapes, the
// structure an architecture's reader derives from a file written from its shape, and the op
// coverage recorded by running the forward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "model/arch.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_shapes.h"
#include "model/op_coverage.h"
#include "model/synth.h"
#include "test_util.h"

namespace polychip::model {
namespace {

using runtime::Op;
using testing::TempDir;
using testing::VocabDir;

const char* kVocab = "ggml-vocab-llama-spm.gguf";

TEST(ArchRegistryTest, EveryArchitectureHasANameAndShapesOfItsOwn) {
  std::set<std::string> shape_names;
  for (Arch arch : AllArchs()) {
    auto back = ArchFromName(ArchName(arch));
    ASSERT_TRUE(back.ok()) << ArchName(arch);
    EXPECT_EQ(*back, arch);
    const ArchDef& def = GetArch(arch);
    EXPECT_FALSE(def.shapes.empty()) << ArchName(arch) << " has no shape for `gguf synth`";
    for (const ArchShape& shape : def.shapes) {
      EXPECT_TRUE(shape_names.insert(shape.name).second) << shape.name << " twice";
      auto c = ShapePreset(shape.name);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(c->arch, arch) << shape.name << " is in another architecture's file";
      EXPECT_EQ(c->name, shape.name);
    }
  }
  EXPECT_EQ(shape_names.size(), ShapePresetNames().size());
  auto unknown = ArchFromName("gpt2");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find(ArchNames(", ")), std::string::npos)
      << unknown.status().ToString();
}

// Synthesizes `shape` with the llama vocabulary; "" (after a failure) when it cannot.
std::string SynthShape(const std::string& shape, DType type = DType::kQ8_0) {
  SynthOptions o;
  o.vocab_path = (VocabDir() / kVocab).string();
  auto c = ShapePreset(shape);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return "";
  o.config = *c;
  o.type = type;
  o.threads = 2;
  o.progress = false;
  const std::string out = (TempDir() / ("arch-" + shape + ".gguf")).string();
  const Status s = SynthesizeModel(o, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return s.ok() ? out : "";
}

// Each architecture's reader finds in a file written from its test shape the structure the
// shape has: the shape (how its file is written) and the reader (how a file is read) live in
// the same architecture file and must agree.
TEST(ArchRegistryTest, EveryTinyShapeReadsBackAsItself) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / kVocab);
  int checked = 0;
  for (Arch arch : AllArchs()) {
    for (const ArchShape& shape : GetArch(arch).shapes) {
      const std::string name = shape.name;
      if (name.size() < 4 || name.substr(name.size() - 4) != "tiny") continue;
      SCOPED_TRACE(name);
      const std::string path = SynthShape(name);
      ASSERT_FALSE(path.empty());
      auto f = GgufFile::Open(path);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      auto got = ModelConfig::FromGguf(**f);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      const ModelConfig want = shape.make();
      EXPECT_EQ(got->arch, want.arch);
      EXPECT_EQ(got->head_dim, want.head_dim);
      EXPECT_EQ(got->n_rot, want.n_rot);
      EXPECT_EQ(got->rope_freq_base, want.rope_freq_base);
      EXPECT_EQ(got->tied_output, want.tied_output);
      EXPECT_EQ(got->has_qkv_bias, want.has_qkv_bias);
      EXPECT_EQ(got->has_qk_norm, want.has_qk_norm);
      EXPECT_EQ(got->fused_qkv, want.fused_qkv);
      EXPECT_EQ(got->fused_gate_up, want.fused_gate_up);
      EXPECT_EQ(got->has_rope_factors, want.has_rope_factors);
      EXPECT_EQ(got->rope_attn_factor, want.rope_attn_factor);
      EXPECT_EQ(got->n_expert, want.n_expert);
      EXPECT_EQ(got->n_expert_used, want.n_expert_used);
      EXPECT_EQ(got->n_ff_exp, want.n_ff_exp);
      EXPECT_EQ(got->moe_norm_weights, want.moe_norm_weights);
      EXPECT_EQ(got->has_post_norms, want.has_post_norms);
      EXPECT_EQ(got->gelu_ffn, want.gelu_ffn);
      EXPECT_EQ(got->embd_scale, want.embd_scale);
      EXPECT_EQ(got->attn_scale, want.attn_scale);
      EXPECT_EQ(got->sliding_window, want.sliding_window);
      EXPECT_EQ(got->sliding_window_pattern, want.sliding_window_pattern);
      ++checked;
    }
  }
  EXPECT_GE(checked, 5);
}

TEST(ArchRegistryTest, AdoptingAnotherArchitectureGivesItsStructure) {
  auto c = ShapePreset("tiny");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(AdoptArch(Arch::kQwen2, *c).ok());
  EXPECT_EQ(c->arch, Arch::kQwen2);
  EXPECT_TRUE(c->has_qkv_bias);
  EXPECT_EQ(c->rope_freq_base, 1e6f);  // the qwen family's usual base
  ASSERT_TRUE(AdoptArch(Arch::kQwen3, *c).ok());
  EXPECT_FALSE(c->has_qkv_bias);  // qwen2's biases are not qwen3's
  EXPECT_TRUE(c->has_qk_norm);
  // A mixture's experts and gemma3's window come from a shape of theirs.
  auto tiny = ShapePreset("tiny");
  EXPECT_FALSE(AdoptArch(Arch::kQwen3Moe, *tiny).ok());
  EXPECT_FALSE(AdoptArch(Arch::kGemma3, *tiny).ok());
}

// The rows op coverage finds by running a model's forward pass through the recorder.
struct Row {
  Op op;
  std::vector<DType> dtypes;
  uint32_t abi_minor;
  bool operator<(const Row& o) const {
    return std::tie(op, dtypes, abi_minor) < std::tie(o.op, o.dtypes, o.abi_minor);
  }
  bool operator==(const Row& o) const = default;
  // "attention f16,f16 1.4" in a failure message.
  friend void PrintTo(const Row& r, std::ostream* os) {
    *os << runtime::OpName(r.op);
    for (size_t i = 0; i < r.dtypes.size(); ++i)
      *os << (i == 0 ? " " : ",") << DTypeName(r.dtypes[i]);
    if (r.abi_minor != 0) *os << " 1." << r.abi_minor;
  }
};

std::vector<Row> Rows(const std::vector<OpUse>& uses) {
  std::vector<Row> rows;
  for (const OpUse& u : uses) rows.push_back({u.op, u.dtypes, u.abi_minor});
  std::sort(rows.begin(), rows.end());
  return rows;
}

std::vector<OpUse> Coverage(const std::string& path, bool tensor_parallel = false,
                            model::KvCacheDtypes kv = {}) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return {};
  auto c = ModelConfig::FromGguf(**f);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return {};
  return RequiredOps(**f, *c, kv, tensor_parallel);
}

std::string UsersOf(const std::vector<OpUse>& uses, Op op) {
  std::string all;
  for (const OpUse& u : uses) {
    for (const std::string& user : u.users) all += u.op == op ? user + "; " : "";
  }
  return all;
}

TEST(OpCoverageTest, RecordedFromTheForwardPass) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / kVocab);
  const auto F16 = DType::kF16, F32 = DType::kF32, Q8 = DType::kQ8_0;
  {
    SCOPED_TRACE("tiny llama");
    const std::vector<OpUse> uses = Coverage(SynthShape("tiny", F16));
    std::vector<Row> want = {{Op::kEmbedding, {F16}, 0}, {Op::kRmsNorm, {}, 0},
                             {Op::kMatmul, {F16}, 0},    {Op::kRope, {}, 0},
                             {Op::kKvStore, {F16, F16}, 0}, {Op::kAttention, {F16, F16}, 0},
                             {Op::kSwiglu, {}, 0},       {Op::kEmbedding, {F32}, 0}};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Rows(uses), want);
    EXPECT_NE(UsersOf(uses, Op::kMatmul).find("blk.*.attn_q.weight (2 layers)"),
              std::string::npos)
        << UsersOf(uses, Op::kMatmul);
    EXPECT_NE(UsersOf(uses, Op::kEmbedding).find("token_embd.weight"), std::string::npos);
    // Tensor parallel: the all-reduced residual is added by ADD.
    std::vector<Row> tp = Rows(Coverage(SynthShape("tiny", F16), /*tensor_parallel=*/true));
    EXPECT_EQ(tp.size(), want.size() + 1);
    EXPECT_TRUE(std::find(tp.begin(), tp.end(), Row{Op::kAdd, {}, 0}) != tp.end());
    // A quantized K beside an F16 V: the KV ops carry both, and V apart needs ABI 1.6.
    std::vector<Row> kq = Rows(Coverage(SynthShape("tiny", F16), false, {Q8, F16}));
    EXPECT_TRUE(std::find(kq.begin(), kq.end(), Row{Op::kKvStore, {Q8, F16}, 6}) != kq.end());
    EXPECT_TRUE(std::find(kq.begin(), kq.end(), Row{Op::kAttention, {Q8, F16}, 6}) != kq.end());
    // Both quantized alike: a 1.5 plugin reads V's type from K's.
    std::vector<Row> kk = Rows(Coverage(SynthShape("tiny", F16), false, {Q8, Q8}));
    EXPECT_TRUE(std::find(kk.begin(), kk.end(), Row{Op::kAttention, {Q8, Q8}, 0}) != kk.end());
  }
  {
    SCOPED_TRACE("gemma3-tiny");
    const std::vector<OpUse> uses = Coverage(SynthShape("gemma3-tiny"));
    std::vector<Row> want = {
        {Op::kEmbedding, {Q8}, 0}, {Op::kScale, {}, 0},        {Op::kRmsNorm, {}, 0},
        {Op::kMatmul, {Q8}, 0},    {Op::kRope, {}, 0},         {Op::kKvStore, {F16, F16}, 0},
        {Op::kAttention, {F16, F16}, 4}, {Op::kAttention, {F16, F16}, 0}, {Op::kAdd, {}, 0},
        {Op::kGeglu, {}, 0},       {Op::kEmbedding, {F32}, 0}};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Rows(uses), want);
    // The windowed ATTENTION (ABI 1.4) on the six local layers of seven.
    EXPECT_NE(UsersOf(uses, Op::kAttention).find("(6 of 7 layers)"), std::string::npos)
        << UsersOf(uses, Op::kAttention);
  }
  {
    SCOPED_TRACE("qwen3moe-tiny");
    const std::vector<OpUse> uses = Coverage(SynthShape("qwen3moe-tiny"));
    // The router stays F32 in a quantized file; the experts run inside MOE (no SWIGLU).
    std::vector<Row> want = {{Op::kEmbedding, {Q8}, 0}, {Op::kRmsNorm, {}, 0},
                             {Op::kMatmul, {Q8}, 0},    {Op::kMatmul, {F32}, 0},
                             {Op::kRope, {}, 0},        {Op::kKvStore, {F16, F16}, 0},
                             {Op::kAttention, {F16, F16}, 0}, {Op::kMoe, {Q8, Q8, Q8}, 0},
                             {Op::kEmbedding, {F32}, 0}};
    std::sort(want.begin(), want.end());
    EXPECT_EQ(Rows(uses), want);
  }
  {
    SCOPED_TRACE("phi3-tiny");
    const std::vector<OpUse> uses = Coverage(SynthShape("phi3-tiny"));
    // The fused matrices are one row each: their parts are rows of them.
    EXPECT_NE(UsersOf(uses, Op::kMatmul).find("blk.*.attn_qkv.weight (2 layers)"),
              std::string::npos)
        << UsersOf(uses, Op::kMatmul);
    EXPECT_EQ(UsersOf(uses, Op::kMatmul).find("ffn_gate"), std::string::npos);
  }
}

}  // namespace
}  // namespace polychip::model
