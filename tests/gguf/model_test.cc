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

TEST(ModelConfigTest, Qwen3HeadSizeAndQkNorms) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-qwen2.gguf");
  auto preset = ShapePreset("qwen3-0.6b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->arch, Arch::kQwen3);
  EXPECT_TRUE(preset->tied_output);
  EXPECT_FALSE(preset->has_qkv_bias);
  EXPECT_EQ(preset->head_dim, 128);
  EXPECT_EQ(preset->q_dim(), 2048);  // wider than the hidden size
  std::string path = Synth("ggml-vocab-qwen2.gguf", "qwen3-tiny", DType::kF16, "qwen3.gguf", 3);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetI64("qwen3.attention.key_length", 0), 128);
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kQwen3);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 512);
  EXPECT_TRUE(c->has_qk_norm);
  EXPECT_FALSE(c->has_qkv_bias);
  EXPECT_FALSE(c->tied_output);
  EXPECT_EQ((*f)->tensors().size(), 3u + 2 * 11);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_q_norm.weight")->dims, (std::vector<int64_t>{128}));
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_k_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_output.weight")->dims,
            (std::vector<int64_t>{512, 256}));

  // A qwen3 file without the per-head norms is refused by name.
  c->has_qk_norm = false;
  GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata()) w.SetValue(key, value);
  for (const TensorSpec& spec : ArchTensors(*c)) {
    const GgufTensor* t = (*f)->FindTensor(spec.name);
    ASSERT_NE(t, nullptr) << spec.name;
    ASSERT_TRUE(w.AddTensor(spec.name, t->dims, t->dtype, t->data).ok());
  }
  const std::string broken = (TempDir() / "qwen3-no-norms.gguf").string();
  ASSERT_TRUE(w.Write(broken).ok());
  auto g = GgufFile::Open(broken);
  ASSERT_TRUE(g.ok());
  auto bad = ModelConfig::FromGguf(**g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("attn_q_norm"), std::string::npos)
      << bad.status().ToString();
}

// gemma3: the window and its layer pattern (five local layers of six: layer 5 of 7 global), the
// local RoPE base, sqrt(n_embd) embedding scale, 1/sqrt(head_dim) attention scale, the post
// norms, and the file's tokenizer copied from the gemma-4 vocabulary.
TEST(ModelConfigTest, Gemma3SlidingWindowAndPostNorms) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-gemma-4.gguf");
  const std::string path =
      Synth("ggml-vocab-gemma-4.gguf", "gemma3-tiny", DType::kF16, "gemma3.gguf", 3);
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetI64("gemma3.attention.sliding_window", 0), 16);
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kGemma3);
  EXPECT_EQ(c->n_layer, 7);
  EXPECT_EQ(c->sliding_window, 16);
  EXPECT_EQ(c->sliding_window_pattern, 6);
  for (int64_t l = 0; l < 7; ++l) EXPECT_EQ(c->IsSlidingLayer(l), l != 5) << l;
  EXPECT_EQ(c->NumSlidingLayers(), 6);
  EXPECT_FLOAT_EQ(c->rope_freq_base_swa, 10000.0f);
  EXPECT_FLOAT_EQ(c->rope_freq_base, 1e6f);
  EXPECT_FLOAT_EQ(c->embd_scale, 16.0f);
  EXPECT_FLOAT_EQ(c->attn_scale, 1.0f / std::sqrt(128.0f));
  EXPECT_TRUE(c->has_qk_norm && c->has_post_norms && c->gelu_ffn && c->tied_output);
  EXPECT_GT(c->n_vocab, 200000);  // the real Gemma vocabulary
  EXPECT_EQ((*f)->GetString("tokenizer.ggml.model", ""), "gemma4");
  EXPECT_NE((*f)->FindTensor("blk.6.post_ffw_norm.weight"), nullptr);
  EXPECT_EQ((*f)->FindTensor("blk.6.post_attention_norm.weight")->dims,
            (std::vector<int64_t>{256}));

  // Logit soft-capping (Gemma 2's, which some gemma3 conversions carry) is refused by name.
  GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata()) w.SetValue(key, value);
  w.SetF32("gemma3.final_logit_softcapping", 30.0f);
  for (const GgufTensor& t : (*f)->tensors()) {
    ASSERT_TRUE(w.AddTensor(t.name, t.dims, t.dtype, t.data).ok());
  }
  const std::string capped = (TempDir() / "gemma3-capped.gguf").string();
  ASSERT_TRUE(w.Write(capped).ok());
  auto g = GgufFile::Open(capped);
  ASSERT_TRUE(g.ok());
  auto bad = ModelConfig::FromGguf(**g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("final_logit_softcapping"), std::string::npos);
}

// qwen3moe: the expert hyper-parameters, the router kept F32 and the 3-D expert tensors in
// llama.cpp's shapes; in the Q4_K_M mixture the experts' down projections follow ffn_down's rule.
TEST(ModelConfigTest, Qwen3MoeExperts) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-qwen2.gguf");
  SynthOptions o;
  o.vocab_path = (VocabDir() / "ggml-vocab-qwen2.gguf").string();
  auto preset = ShapePreset("qwen3moe-tiny");
  ASSERT_TRUE(preset.ok());
  o.config = *preset;
  o.type = DType::kQ4_K;
  o.mix = QuantMix::kQ4_K_M;
  o.threads = 2;
  o.progress = false;
  const std::string path = (TempDir() / "qwen3moe.gguf").string();
  ASSERT_TRUE(SynthesizeModel(o, path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetI64("qwen3moe.expert_count", 0), 8);
  auto c = ModelConfig::FromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Arch::kQwen3Moe);
  EXPECT_EQ(c->n_expert, 8);
  EXPECT_EQ(c->n_expert_used, 2);
  EXPECT_EQ(c->n_ff_exp, 256);
  EXPECT_TRUE(c->moe_norm_weights);
  EXPECT_TRUE(c->has_qk_norm);
  const GgufTensor* router = (*f)->FindTensor("blk.0.ffn_gate_inp.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->dims, (std::vector<int64_t>{256, 8}));
  EXPECT_EQ(router->dtype, DType::kF32);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_gate_exps.weight")->dims,
            (std::vector<int64_t>{256, 256, 8}));
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down_exps.weight")->dims,
            (std::vector<int64_t>{256, 256, 8}));
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_up_exps.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down_exps.weight")->dtype, DType::kQ6_K);  // last layer
  EXPECT_EQ((*f)->FindTensor("blk.0.ffn_gate.weight"), nullptr);

  // Without expert_used_count the file is refused by its key.
  GgufWriter w;
  for (const auto& [key, value] : (*f)->metadata()) {
    if (key != "qwen3moe.expert_used_count") w.SetValue(key, value);
  }
  for (const GgufTensor& t : (*f)->tensors()) {
    ASSERT_TRUE(w.AddTensor(t.name, t.dims, t.dtype, t.data).ok());
  }
  const std::string broken = (TempDir() / "qwen3moe-no-used.gguf").string();
  ASSERT_TRUE(w.Write(broken).ok());
  auto g = GgufFile::Open(broken);
  ASSERT_TRUE(g.ok());
  auto bad = ModelConfig::FromGguf(**g);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("expert_used_count"), std::string::npos)
      << bad.status().ToString();
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
  // The list is archs.def's.
  EXPECT_EQ(c.status().message(),
            "unsupported architecture gpt2 (supported: " + ArchNames(", ") + ")");
  EXPECT_EQ(ArchNames(", ").rfind("llama, qwen2, qwen3, phi3, qwen3moe, gemma3", 0), 0u);

  // A vocabulary-only file is not a model.
  auto vocab_path = VocabDir() / "ggml-vocab-qwen2.gguf";
  POLYCHIP_REQUIRE_VOCAB(vocab_path);
  auto vocab = GgufFile::Open(vocab_path.string());
  ASSERT_TRUE(vocab.ok());
  auto vc = ModelConfig::FromGguf(**vocab);
  ASSERT_FALSE(vc.ok());
  // Refused for its missing embedding, or for a block count its (zero) tensors cannot cover.
  const std::string& why = vc.status().message();
  EXPECT_TRUE(why.find("missing tensor 'token_embd.weight'") != std::string::npos ||
              why.find("'qwen2.block_count' = ") != std::string::npos)
      << why;

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

TEST(QuantizeTest, MixturesGiveTheTensorsThatMatterMoreBits) {
  // The qwen3-0.6b shape: 28 layers, GQA 2, tied embeddings; its rows are multiples of 256.
  const MixModel qwen3{28, 2, true};
  auto type = [&](const char* scheme, const std::string& name, int64_t row = 1024) {
    auto s = ParseQuantScheme(scheme);
    EXPECT_TRUE(s.ok()) << scheme;
    return ChooseTensorType(name, {row, 2048}, *s, qwen3, nullptr);
  };
  // Q4_K_M: the tied embedding is the output (Q6_K); attn_v and ffn_down Q6_K on the layers
  // that get more bits (the first and last eighth, every third between), Q4_K elsewhere.
  EXPECT_EQ(type("Q4_K_M", "token_embd.weight"), DType::kQ6_K);
  EXPECT_EQ(type("Q4_K_M", "blk.0.attn_v.weight"), DType::kQ6_K);
  EXPECT_EQ(type("Q4_K_M", "blk.3.attn_v.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q4_K_M", "blk.5.ffn_down.weight"), DType::kQ6_K);
  EXPECT_EQ(type("Q4_K_M", "blk.6.ffn_down.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q4_K_M", "blk.27.ffn_down.weight"), DType::kQ6_K);
  EXPECT_EQ(type("Q4_K_M", "blk.5.attn_q.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q4_K_M", "blk.5.ffn_gate.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q5_K_M", "blk.0.attn_v.weight"), DType::kQ6_K);
  EXPECT_EQ(type("Q5_K_M", "blk.4.attn_k.weight"), DType::kQ5_K);
  // Q3_K_M: attn_v Q5_K on the first two layers then Q4_K, ffn_down Q5_K on the first
  // sixteenth then Q4_K, attn_output Q4_K, the rest Q3_K.
  EXPECT_EQ(type("Q3_K_M", "blk.1.attn_v.weight"), DType::kQ5_K);
  EXPECT_EQ(type("Q3_K_M", "blk.2.attn_v.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q3_K_M", "blk.0.ffn_down.weight"), DType::kQ5_K);
  EXPECT_EQ(type("Q3_K_M", "blk.1.ffn_down.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q3_K_M", "blk.9.attn_output.weight"), DType::kQ4_K);
  EXPECT_EQ(type("Q3_K_M", "blk.9.ffn_up.weight"), DType::kQ3_K);
  EXPECT_EQ(type("Q3_K_S", "blk.0.attn_v.weight"), DType::kQ3_K);
  EXPECT_EQ(type("Q3_K_S", "token_embd.weight"), DType::kQ6_K);
  // An untied model's embedding keeps the base type; its output matrix is Q6_K.
  const MixModel untied{28, 2, false};
  auto q4km = *ParseQuantScheme("q4_k_m");  // names are case-insensitive
  EXPECT_EQ(ChooseTensorType("token_embd.weight", {1024, 9}, q4km, untied, nullptr), DType::kQ4_K);
  EXPECT_EQ(ChooseTensorType("output.weight", {1024, 9}, q4km, untied, nullptr), DType::kQ6_K);
  // Rows that do not fit a super-block: the output takes Q8_0, the others fall back as usual.
  EXPECT_EQ(type("Q4_K_M", "token_embd.weight", 896), DType::kQ8_0);
  EXPECT_EQ(type("Q4_K_M", "blk.0.attn_v.weight", 896), DType::kQ8_0);  // Q6_K's fallback
  EXPECT_EQ(type("Q4_K_M", "blk.3.attn_v.weight", 896), DType::kQ5_0);  // Q4_K's
  // Plain type names stay uniform; the mixtures carry llama.cpp's file types.
  auto q4k = ParseQuantScheme("Q4_K");
  ASSERT_TRUE(q4k.ok());
  EXPECT_EQ(q4k->mix, QuantMix::kUniform);
  EXPECT_EQ(ChooseTensorType("token_embd.weight", {1024, 9}, *q4k, qwen3, nullptr), DType::kQ4_K);
  EXPECT_EQ(LlamaFileType(q4km), 15u);
  EXPECT_EQ(LlamaFileType(*ParseQuantScheme("Q5_K_M")), 17u);
  EXPECT_EQ(LlamaFileType(*ParseQuantScheme("Q3_K_M")), 12u);
  EXPECT_EQ(QuantSchemeName(q4km), "Q4_K_M");
  // And back (what `polychip bench` names a file by): every scheme polychip writes.
  for (const char* name : {"Q4_K_M", "Q5_K_M", "Q3_K_M", "Q3_K_S", "Q4_K_S", "Q5_K_S", "Q8_0",
                           "Q4_0", "Q5_1", "Q2_K", "Q6_K", "IQ4_XS", "IQ4_NL", "F16", "BF16"})
    EXPECT_EQ(LlamaFileTypeName(LlamaFileType(*ParseQuantScheme(name))), name);
  EXPECT_EQ(LlamaFileTypeName(19), "");  // IQ2_XXS: not one of ours
  auto bad = ParseQuantScheme("Q7_K_M");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Q4_K_M"), std::string::npos) << bad.status().message();
}

TEST(QuantizeTest, QuantizesAFileToAMixture) {
  POLYCHIP_REQUIRE_VOCAB(VocabDir() / "ggml-vocab-qwen2.gguf");
  const std::string f16 =
      Synth("ggml-vocab-qwen2.gguf", "qwen3-tiny", DType::kF16, "mix-src.gguf", 4);
  const std::string out = (TempDir() / "mix-q4km.gguf").string();
  QuantizeOptions o;
  o.type = DType::kQ4_K;
  o.mix = QuantMix::kQ4_K_M;
  o.threads = 2;
  o.progress = false;
  ASSERT_TRUE(QuantizeFile(f16, out, o).ok());
  auto f = GgufFile::Open(out);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->GetU32("general.file_type", 0), 15u);
  // Two layers: layer 1 is in the last eighth (more bits), layer 0 is not.
  EXPECT_EQ((*f)->FindTensor("output.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("token_embd.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ((*f)->FindTensor("blk.0.attn_v.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_v.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.ffn_down.weight")->dtype, DType::kQ6_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_q.weight")->dtype, DType::kQ4_K);
  EXPECT_EQ((*f)->FindTensor("blk.1.attn_q_norm.weight")->dtype, DType::kF32);
  EXPECT_TRUE(ModelConfig::FromGguf(**f).ok());
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
