// Model hyper-parameters read from GGUF metadata (key names as llama.cpp's llama-arch.cpp:
// "<arch>.embedding_length", "<arch>.attention.head_count_kv", ...), and the check that a file
// carries every tensor its architecture needs, with the right shape and a supported type.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/gguf.h"
#include "util/status.h"

namespace polychip::model {

// The architectures of archs.def, as Arch::k<Name>; each one's definition is in its own file
// (arch.h).
enum class Arch {
#define PC_ARCH(Name, name) k##Name,
#include "model/archs.def"
#undef PC_ARCH
};
// general.architecture: "llama", "qwen2", ...
const char* ArchName(Arch arch);
// Unimplemented "unsupported architecture X (supported: llama, qwen2, ...)" otherwise.
StatusOr<Arch> ArchFromName(std::string_view name);
std::string ArchNames(std::string_view separator);  // "llama, qwen2, ..."

enum class RopeScaling { kNone, kLinear, kYarn };
const char* RopeScalingName(RopeScaling s);

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string name;  // general.name, informational

  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_ff = 0;
  int64_t head_dim = 0;    // per-head size of q and k (attention.key_length or n_embd/n_head)
  int64_t head_dim_v = 0;  // per-head size of v (attention.value_length or head_dim)
  float rms_eps = 1e-5f;

  // RoPE (NeoX-style for qwen2 and qwen3, normal for llama; the architecture decides, not the
  // file).
  int64_t n_rot = 0;                // rotated dims per head (rope.dimension_count or head_dim)
  float rope_freq_base = 10000.0f;  // rope.freq_base
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 1.0f;  // positions are divided by this (linear / yarn)
  int64_t rope_orig_ctx = 0;         // rope.scaling.original_context_length (yarn)
  // Llama-3 style scaling: a "rope_freqs.weight" tensor [n_rot/2] of per-frequency divisors.
  bool has_rope_freqs = false;

  bool tied_output = false;    // no output.weight: the logits reuse token_embd.weight
  bool has_qkv_bias = false;   // blk.N.attn_{q,k,v}.bias present (qwen2)
  bool has_output_bias = false;  // output.bias present
  // blk.N.attn_{q,k}_norm.weight [head_dim]: every head of q and k is RMS-normed before RoPE
  // (qwen3; the architecture decides, not the file).
  bool has_qk_norm = false;
  // phi3: q, k and v in one matrix blk.N.attn_qkv [n_embd, q_dim + 2 kv_dim] (or separate), and
  // gate and up in one blk.N.ffn_up [n_embd, 2 n_ff] (gate the first half). The loader cuts
  // them by rows into the matrices the forward pass uses.
  bool fused_qkv = false;
  bool fused_gate_up = false;
  // phi3's LongRoPE: rope_factors_long.weight and rope_factors_short.weight [n_rot/2] of
  // per-frequency divisors; the long ones serve contexts beyond rope_orig_ctx (set by the runner
  // in rope_long_factors), and rope.scaling.attn_factor scales every rotation.
  bool has_rope_factors = false;
  bool rope_long_factors = false;
  float rope_attn_factor = 1.0f;

  // Mixture of experts (qwen3moe): every layer's feed-forward is n_expert experts of
  // n_ff_exp rows (blk.N.ffn_{gate,up,down}_exps, 3-D) behind a router blk.N.ffn_gate_inp
  // [n_embd -> n_expert]; each token runs the n_expert_used experts of largest softmax
  // probability, weighted by it (renormalised over the chosen ones when moe_norm_weights).
  // n_expert 0: a dense feed-forward of n_ff rows.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  bool moe_norm_weights = false;

  // gemma3: every layer's attention and feed-forward outputs are RMS-normed before their
  // residual add (blk.N.post_attention_norm, blk.N.post_ffw_norm), the feed-forward is
  // GELU-gated (tanh approximation), the token embeddings are scaled by embd_scale
  // (sqrt(n_embd)), and attention logits by attn_scale.
  bool has_post_norms = false;
  bool gelu_ffn = false;
  float embd_scale = 1.0f;
  float attn_scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  // Interleaved sliding-window attention (gemma3, llama.cpp's standard SWA): with
  // sliding_window > 0, layer l is a local layer (a query sees the last sliding_window
  // positions) unless l % sliding_window_pattern == pattern - 1 (every pattern-th layer global;
  // pattern 0: all local). Local layers rotate with rope_freq_base_swa and no scaling.
  int64_t sliding_window = 0;
  int64_t sliding_window_pattern = 0;
  float rope_freq_base_swa = 10000.0f;
  bool IsSlidingLayer(int64_t layer) const {
    if (sliding_window <= 0) return false;
    return sliding_window_pattern == 0 ||
           layer % sliding_window_pattern < sliding_window_pattern - 1;
  }
  int64_t NumSlidingLayers() const {
    int64_t n = 0;
    for (int64_t l = 0; l < n_layer; ++l) n += IsSlidingLayer(l) ? 1 : 0;
    return n;
  }

  int64_t q_dim() const { return n_head * head_dim; }      // rows of attn_q
  int64_t kv_dim() const { return n_head_kv * head_dim; }  // rows of attn_k
  int64_t v_dim() const { return n_head_kv * head_dim_v; }
  std::string Summary() const;  // one line for logs

  // Reads the hyper-parameters and validates them and the tensors (ValidateTensors).
  static StatusOr<ModelConfig> FromGguf(const GgufFile& file);
  // Every tensor the architecture needs exists with its expected shape and a supported type;
  // optional ones (biases, output, rope_freqs) are checked when present.
  Status ValidateTensors(const GgufFile& file) const;
};

// "blk.3.attn_q.weight"
std::string LayerTensorName(int64_t layer, std::string_view suffix);

}  // namespace polychip::model
