#include "model/synth.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <string_view>

#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/quantize.h"

namespace polychip::model {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashName(std::string_view s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Fills out[n] with N(mean, std) draws (Box-Muller) from a generator seeded by `key`.
void FillNormal(uint64_t key, float mean, float std, float* out, int64_t n) {
  uint64_t state = key;
  for (int64_t i = 0; i < n; i += 2) {
    // 53-bit uniforms in (0, 1]
    double u1 = ((SplitMix64(state) >> 11) + 1) * 0x1.0p-53;
    double u2 = (SplitMix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(mean + std * r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(mean + std * r * std::sin(2 * M_PI * u2));
  }
}

void SetHyperParameters(const ModelConfig& c, const QuantScheme& scheme, GgufWriter& w) {
  const DType type = scheme.type;
  const std::string a = ArchName(c.arch);
  auto key = [&a](std::string_view k) { return fmt::format("{}.{}", a, k); };
  w.SetString("general.architecture", a);
  w.SetString("general.name", c.name.empty() ? "polychip synthetic " + a : "synthetic " + c.name);
  w.SetU32("general.file_type", LlamaFileType(scheme));
  if (IsQuantized(type)) w.SetU32("general.quantization_version", 2);
  w.SetU32(key("vocab_size"), static_cast<uint32_t>(c.n_vocab));
  w.SetU32(key("context_length"), static_cast<uint32_t>(c.n_ctx_train));
  w.SetU32(key("embedding_length"), static_cast<uint32_t>(c.n_embd));
  w.SetU32(key("block_count"), static_cast<uint32_t>(c.n_layer));
  w.SetU32(key("feed_forward_length"), static_cast<uint32_t>(c.n_ff));
  w.SetU32(key("attention.head_count"), static_cast<uint32_t>(c.n_head));
  w.SetU32(key("attention.head_count_kv"), static_cast<uint32_t>(c.n_head_kv));
  if (c.head_dim != c.n_embd / c.n_head) {
    w.SetU32(key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
    w.SetU32(key("attention.value_length"), static_cast<uint32_t>(c.head_dim_v));
  }
  w.SetU32(key("rope.dimension_count"), static_cast<uint32_t>(c.n_rot));
  w.SetF32(key("rope.freq_base"), c.rope_freq_base);
  if (c.rope_scaling != RopeScaling::kNone) {
    w.SetString(key("rope.scaling.type"), RopeScalingName(c.rope_scaling));
    w.SetF32(key("rope.scaling.factor"), c.rope_scaling_factor);
    w.SetU32(key("rope.scaling.original_context_length"), static_cast<uint32_t>(c.rope_orig_ctx));
  }
  w.SetF32(key("attention.layer_norm_rms_epsilon"), c.rms_eps);
  if (c.n_expert > 0) {
    w.SetU32(key("expert_count"), static_cast<uint32_t>(c.n_expert));
    w.SetU32(key("expert_used_count"), static_cast<uint32_t>(c.n_expert_used));
    w.SetU32(key("expert_feed_forward_length"), static_cast<uint32_t>(c.n_ff_exp));
  }
  if (c.sliding_window > 0) {  // as llama.cpp's converter: the pattern and local base implied
    w.SetU32(key("attention.sliding_window"), static_cast<uint32_t>(c.sliding_window));
  }
  if (c.has_rope_factors) {
    w.SetU32(key("rope.scaling.original_context_length"), static_cast<uint32_t>(c.rope_orig_ctx));
    w.SetF32(key("rope.scaling.attn_factor"), c.rope_attn_factor);
  }
}

}  // namespace

Status SynthesizeModel(const SynthOptions& opts, const std::string& out) {
  if (!IsQuantizeTarget(opts.type)) {
    return InvalidArgument(fmt::format("unsupported type {} (supported: {})",
                                       DTypeName(opts.type), QuantizeTargetNames()));
  }
  PC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> vocab, GgufFile::Open(opts.vocab_path));
  const GgufValue* tokens = vocab->Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->type != GgufType::kArray || tokens->count == 0) {
    return InvalidArgument(fmt::format("{}: no tokenizer.ggml.tokens (not a vocabulary GGUF)",
                                       opts.vocab_path));
  }
  ModelConfig c = opts.config;
  c.n_vocab = static_cast<int64_t>(tokens->count);
  if (c.n_layer <= 0 || c.n_embd <= 0 || c.n_head <= 0 || c.n_head_kv <= 0 || c.n_ff <= 0 ||
      c.n_embd % c.n_head != 0 || c.n_head % c.n_head_kv != 0) {
    return InvalidArgument(fmt::format("invalid shape: layers={} embd={} heads={} kv_heads={} "
                                       "ff={} (embd must divide by heads, heads by kv_heads)",
                                       c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.n_ff));
  }
  if (c.head_dim <= 0) c.head_dim = c.n_embd / c.n_head;
  if (c.head_dim_v <= 0) c.head_dim_v = c.head_dim;
  if (c.n_rot <= 0) c.n_rot = c.head_dim;
  if (c.n_ctx_train <= 0) c.n_ctx_train = 2048;

  GgufWriter w;
  const QuantScheme scheme{opts.type, opts.mix};
  const MixModel mix_model{c.n_layer, c.n_head / c.n_head_kv, c.tied_output};
  SetHyperParameters(c, scheme, w);
  for (const auto& [key, value] : vocab->metadata()) {
    if (key.rfind("tokenizer.", 0) == 0) w.SetValue(key, value);
  }
  if (!opts.chat_template.empty()) w.SetString("tokenizer.chat_template", opts.chat_template);

  const int threads = ResolveThreads(opts.threads);
  const std::vector<TensorSpec> specs = ArchTensors(c);
  std::vector<float> rope_freqs;
  if (c.has_rope_freqs) rope_freqs = Llama3RopeFreqs(c.n_rot, c.rope_freq_base, opts.llama3);
  // LongRoPE factors of the shape Phi-3 ships: 1 for the high frequencies, rising towards the
  // low ones (up to 2 for the short set, 8 for the long).
  std::vector<float> factors_short, factors_long;
  for (int64_t i = 0; c.has_rope_factors && i < c.n_rot / 2; ++i) {
    const float t = static_cast<float>(i) / static_cast<float>(std::max<int64_t>(1, c.n_rot / 2 - 1));
    factors_short.push_back(1.0f + t * t);
    factors_long.push_back(1.0f + 7.0f * t * t);
  }
  std::vector<DType> types(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& spec = specs[i];
    std::string warning;
    types[i] = ChooseTensorType(spec.name, spec.dims, scheme, mix_model, &warning);
    if (!warning.empty() && opts.progress) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    int64_t row_len = spec.dims[0];
    int64_t n_rows = 1;
    for (size_t d = 1; d < spec.dims.size(); ++d) n_rows *= spec.dims[d];
    uint64_t tensor_key = opts.seed * 0x9E3779B97F4A7C15ull ^ HashName(spec.name);
    float mean = spec.role == TensorRole::kNorm ? 1.0f : 0.0f;
    float std = opts.weight_std;
    const std::vector<float>& freqs = spec.name == "rope_factors_short.weight" ? factors_short
                                      : spec.name == "rope_factors_long.weight"  ? factors_long
                                                                                 : rope_freqs;
    auto gen = [&spec, &freqs, tensor_key, mean, std, row_len](int64_t row, float* dst) {
      if (spec.role == TensorRole::kRopeFreqs) {
        std::copy(freqs.begin(), freqs.end(), dst);
        return;
      }
      FillNormal(tensor_key + static_cast<uint64_t>(row) * 0xD1B54A32D192ED03ull, mean, std, dst,
                 row_len);
    };
    PC_RETURN_IF_ERROR(w.AddTensor(
        spec.name, spec.dims, types[i],
        [gen, type = types[i], row_len, n_rows, threads](uint8_t* dst, uint64_t) {
          return QuantizeGeneratedRows(gen, type, dst, row_len, n_rows, threads);
        }));
  }

  if (opts.progress) {
    std::fprintf(stderr, "synthesizing %s (%s) -> %s\n", c.Summary().c_str(),
                 QuantSchemeName(scheme).c_str(), out.c_str());
  }
  GgufWriter::Progress progress;
  if (opts.progress) {
    progress = [&](size_t i, size_t n, const std::string& name) {
      GgufTensor shape;
      shape.dims = specs[i].dims;
      std::fprintf(stderr, "[%4zu/%zu] %-28s %-5s %s\n", i + 1, n, name.c_str(),
                   DTypeName(types[i]), shape.ShapeString().c_str());
    };
  }
  return w.Write(out, progress);
}

}  // namespace polychip::model
