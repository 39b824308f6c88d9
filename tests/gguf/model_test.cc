// ModelConfig, the synthesizer and the quantizer.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model_config.h"
#include "model/model_shapes.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "test_util.h"

namespace polychip::model {
namespace {

using testing::ReadAll;
using testing::TempDir;
using testing::VocabDir;

std::string Synth(const std::string& vocab, const std::string& shape, DType type,
                  const std::string& out_name, uint64_t seed = 1, int threads = 2,
                  Arch arch = Arch::kLlama) {
  SynthOptions o;
  o.vocab_path = (VocabDir() / vocab).string();
  auto c = ShapePreset(shape);
  EXPECT_TRUE(c.ok());
  o.config = *c;
  if (arch == Arch::kQwen2) {
    o.config.arch = arch;
    o.config.has_qkv_bias = true;
  }
  o.type = type;
  o.seed = seed;
  o.threads = threads;
  o.progress = false;
  std::string out = (TempDir() / out_name).string();
  Status s = SynthesizeModel(o, out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::vector<float> Dequant(const GgufTensor& t) {
  std::vector<float> out(t.n_elements);
  int64_t rb = RowBytes(t.dtype, t.row_len());
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    EXPECT_TRUE(DequantizeRow(t.dtype, t.data + r * rb, out.data() + r * t.row_len(), t.row_len()));
  }
  return out;
}

TEST(ModelConfigTest, SynthesizedTinyModelLoadsAndValidates) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-llama-spm.gguf");
  std::string path = Synth("ggml-vocab-llama-spm.gguf", "tiny", DType::kF32, "tiny-llama.gguf");
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->n_vocab, 32000);
  EXPECT_EQ(c->n_layer, 2);
  EXPECT_EQ(c->n_embd, 128);
  EXPECT_EQ(c->n_head, 4);
  EXPECT_EQ(c->n_head_kv, 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->n_ff, 256);
  EXPECT_FALSE(c->tied_output);
  EXPECT_FALSE(c->has_qkv_bias);
  EXPECT_EQ(c->rope_scaling, RopeScaling::kNone);
  EXPECT_EQ((*f)->tensors().size(), 3u + 2 * 9);
  // The tokenizer came along, every key of it.
  auto vocab = GgufFile::Open((VocabDir() / "ggml-vocab-llama-spm.gguf").string());
  ASSERT_TRUE(vocab.ok());
  for (const auto& [key, value] : (*vocab)->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) EXPECT_TRUE((*f)->Has(key)) << key;
  }
  EXPECT_EQ((*f)->GetStringArray("tokenizer.ggml.tokens")->at(1), "<s>");

  // Weights look like what was asked for: N(0, 0.02) matrices, norms around 1.
  std::vector<float> w = Dequant(*(*f)->FindTensor("blk.0.ffn_up.weight"));
  double sum = 0, sq = 0;
  for (float x : w) sum += x, sq += x * x;
  double mean = sum / w.size(), sd = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd, 0.02, 0.002);
  std::vector<float> norm = Dequant(*(*f)->FindTensor("output_norm.weight"));
  for (float x : norm) EXPECT_NEAR(x, 1.0f, 0.15f);
}

TEST(ModelConfigTest, Qwen2ShapeHasBiasesAndTiedOutput) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-qwen2.gguf");
  auto preset = ShapePreset("qwen2.5-0.5b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->arch, Arch::kQwen2);
  EXPECT_TRUE(preset->tied_output);
  EXPECT_TRUE(preset->has_qkv_bias);
  EXPECT_EQ(preset->head_dim, 64);
  // The real shape is large; the tiny one with arch qwen2 exercises the same tensors.
  std::string path =
      Synth("ggml-vocab-qwen2.gguf", "tiny", DType::kF16, "tiny-qwen2.gguf", 3, 2, Arch::kQwen2);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kQwen2);
  EXPECT_TRUE(c->has_qkv_bias);
  EXPECT_EQ(c->n_vocab, 151936);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_k.bias")->dims, (std::vector<int64_t>{64}));
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_k.bias")->dtype, DType::kF32);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_k.weight")->dtype, DType::kF16);
}

TEST(ModelConfigTest, Llama3RopeFreqs) {
  auto preset = ShapePreset("llama-3.2-1b");
  ASSERT_TRUE(preset.ok());
  EXPECT_TRUE(preset->has_rope_freqs);
  Llama3RopeScaling s;
  s.factor = 32;
  std::vector<float> f = Llama3RopeFreqs(64, 500000.0f, s);
  ASSERT_EQ(f.size(), 32u);
  EXPECT_EQ(f.front(), 1.0f);  // highest frequency untouched
  EXPECT_EQ(f.back(), 32.0f);  // lowest frequency fully scaled
  for (size_t i = 1; i < f.size(); ++i) EXPECT_GE(f[i], f[i - 1]);
  bool interpolated = false;
  for (float x : f) interpolated |= x > 1.0f && x < 32.0f;
  EXPECT_TRUE(interpolated);
}

TEST(ModelConfigTest, UnsupportedArchitectureAndBrokenModels) {
  GgufWriter w;
  w.SetString("general.architecture", "gpt2");
  std::string path = (TempDir() / "gpt2.gguf").string();
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c.status().message(), "unsupported architecture gpt2 (supported: llama, qwen2)");

  // A vocabulary-only file is not a model.
  auto vocab_path = VocabDir() / "ggml-vocab-qwen2.gguf";
  POLYCHIP_REQUIRE_VOCAB(vocab_path);
  auto vocab = GgufFile::Open(vocab_path.string());
  ASSERT_TRUE(vocab.ok());
  auto vc = ModelConfig::FromGguf(**vocab);
  ASSERT_FALSE(vc.ok());
  EXPECT_NE(vc.status().message().find("missing tensor 'token_embd.weight'"), std::string::npos)
      << vc.status().message();

  // A model with a tensor of the wrong shape, and one with a missing tensor.
  std::string good = Synth("ggml-vocab-qwen2.gguf", "tiny", DType::kF32, "tiny-for-edit.gguf");
  auto src = GgufFile::Open(good);
  ASSERT_TRUE(src.ok());
  auto rewrite = [&](const std::string& skip, const std::string& reshape) {
    GgufWriter out;
    for (const auto& [key, value] : (*src)->metadata()) out.SetValue(key, value);
    for (const GgufTensor& t : (*src)->tensors()) {
      if (t.name == skip) continue;
      std::vector<int64_t> dims = t.dims;
      if (t.name == reshape) std::swap(dims[0], dims[1]);
      EXPECT_TRUE(out.AddTensor(t.name, dims, t.dtype, t.data).ok());
    }
    std::string p = (TempDir() / "edited.gguf").string();
    EXPECT_TRUE(out.Write(p).ok());
    auto g = GgufFile::Open(p);
    EXPECT_TRUE(g.ok());
    return ModelConfig::FromGguf(**g).status();
  };
  Status missing = rewrite("blk.1.ffn_down.weight", "");
  EXPECT_EQ(missing.message(), "llama model is missing tensor 'blk.1.ffn_down.weight'");
  Status shape = rewrite("", "blk.0.attn_k.weight");
  EXPECT_EQ(shape.message(), "tensor 'blk.0.attn_k.weight' has shape [64, 128], expected [128, 64]");
  EXPECT_TRUE(rewrite("", "").ok());
}

TEST(SynthTest, DeterministicAcrossThreadCounts) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-llama-spm.gguf");
  std::string a = Synth("ggml-vocab-llama-spm.gguf", "tiny", DType::kQ8_0, "d1.gguf", 5, 1);
  std::string b = Synth("ggml-vocab-llama-spm.gguf", "tiny", DType::kQ8_0, "d2.gguf", 5, 3);
  std::string c = Synth("ggml-vocab-llama-spm.gguf", "tiny", DType::kQ8_0, "d3.gguf", 6, 2);
  EXPECT_EQ(ReadAll(a), ReadAll(b));
  EXPECT_NE(ReadAll(a), ReadAll(c));
}

TEST(QuantizeTest, Policy) {
  std::string warning;
  EXPECT_EQ(ChooseTensorType("blk.0.attn_norm.weight", {256}, DType::kQ4_K, &warning), DType::kF32);
  EXPECT_EQ(ChooseTensorType("x", {256, 1}, DType::kQ8_0, &warning), DType::kF32);
  EXPECT_EQ(ChooseTensorType("rope_freqs.weight", {32}, DType::kQ8_0, &warning), DType::kF32);
  EXPECT_TRUE(warning.empty());
  EXPECT_EQ(ChooseTensorType("w", {256, 8}, DType::kQ4_K, &warning), DType::kQ4_K);
  EXPECT_EQ(ChooseTensorType("token_embd.weight", {512, 8}, DType::kQ6_K, &warning), DType::kQ6_K);
  EXPECT_TRUE(warning.empty());
  EXPECT_EQ(ChooseTensorType("w", {128, 8}, DType::kQ4_K, &warning), DType::kQ5_0);
  EXPECT_NE(warning.find("w: row length 128 is not a multiple of Q4_K's block 256"),
            std::string::npos)
      << warning;
  EXPECT_EQ(ChooseTensorType("w", {128, 8}, DType::kQ6_K, nullptr), DType::kQ8_0);
  EXPECT_EQ(ChooseTensorType("w", {128, 8}, DType::kQ2_K, nullptr), DType::kQ4_0);
  EXPECT_EQ(ChooseTensorType("w", {48, 8}, DType::kQ8_0, nullptr), DType::kF16);
  EXPECT_EQ(ChooseTensorType("w", {48, 8}, DType::kBF16, nullptr), DType::kBF16);
  EXPECT_TRUE(IsQuantizeTarget(DType::kQ5_1));
  EXPECT_FALSE(IsQuantizeTarget(DType::kI32));
}

TEST(QuantizeTest, ConvertRowsAcrossThreads) {
  const int64_t row = 256, rows = 37;
  std::vector<float> src(row * rows);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37f * i) * 0.1f;
  std::vector<uint8_t> q1(RowBytes(DType::kQ4_K, row) * rows), q4(q1.size());
  ASSERT_TRUE(ConvertRows(DType::kF32, reinterpret_cast<uint8_t*>(src.data()), DType::kQ4_K,
                          q1.data(), row, rows, 1)
                  .ok());
  ASSERT_TRUE(ConvertRows(DType::kF32, reinterpret_cast<uint8_t*>(src.data()), DType::kQ4_K,
                          q4.data(), row, rows, 4)
                  .ok());
  EXPECT_EQ(q1, q4);
  std::vector<float> back(src.size());
  ASSERT_TRUE(ConvertRows(DType::kQ4_K, q1.data(), DType::kF32,
                          reinterpret_cast<uint8_t*>(back.data()), row, rows, 3)
                  .ok());
  double err = 0;
  for (size_t i = 0; i < src.size(); ++i) err = std::max<double>(err, std::fabs(src[i] - back[i]));
  EXPECT_LT(err, 0.02);
  EXPECT_GT(err, 0.0);  // it really was quantized
}

TEST(QuantizeTest, QuantizesAFileByPolicy) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-qwen2.gguf");
  std::string f32 =
      Synth("ggml-vocab-qwen2.gguf", "tiny", DType::kF32, "q-src.gguf", 9, 2, Arch::kQwen2);
  for (DType target : {DType::kQ8_0, DType::kQ4_K, DType::kF16}) {
    std::string out = (TempDir() / (std::string("q-") + DTypeName(target) + ".gguf")).string();
    QuantizeOptions o;
    o.type = target;
    o.threads = 2;
    o.progress = false;
    Status s = QuantizeFile(f32, out, o);
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto a = GgufFile::Open(f32);
    auto b = GgufFile::Open(out);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ((*b)->GetU32("general.file_type", 99), LlamaFileType(target));
    EXPECT_EQ((*b)->GetString("tokenizer.ggml.pre", ""), "qwen2");
    ASSERT_TRUE(ModelConfig::FromGguf(**b).ok());
    ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
    for (const GgufTensor& ta : (*a)->tensors()) {
      const GgufTensor* tb = (*b)->FindTensor(ta.name);
      ASSERT_NE(tb, nullptr);
      EXPECT_EQ(tb->dtype, ChooseTensorType(ta.name, ta.dims, target, nullptr)) << ta.name;
      std::vector<float> x = Dequant(ta), y = Dequant(*tb);
      double err = 0;
      for (size_t i = 0; i < x.size(); ++i) err = std::max<double>(err, std::fabs(x[i] - y[i]));
      EXPECT_LT(err, 0.02) << ta.name;  // weights have std 0.02, up to ~0.1 in magnitude
    }
    // In the tiny shape the 128-wide rows of a K-quant fall back (Q4_K -> Q5_0).
    if (target == DType::kQ4_K) {
      EXPECT_EQ((*b)->FindTensor("blk.0.attn_q.weight")->dtype, DType::kQ5_0);
      EXPECT_EQ((*b)->FindTensor("blk.0.ffn_down.weight")->dtype, DType::kQ4_K);
    }
  }
  QuantizeOptions bad;
  bad.type = DType::kI32;
  EXPECT_FALSE(QuantizeFile(f32, (TempDir() / "bad.gguf").string(), bad).ok());
}

}  // namespace
}  // namespace polychip::model
