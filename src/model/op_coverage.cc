#include "model/op_coverage.h"

#include <algorithm>
#include <map>

#include "runtime/op_fallback.h"

namespace polychip::model {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string DeviceName(const runtime::Device& d) {
  return d.backend()->name() + ":" + std::to_string(d.logical_id() < 0 ? 0 : d.logical_id());
}

bool Supported(const runtime::Device& device, const OpUse& use) {
  if (device.backend()->abi_minor() < use.abi_minor) return false;
  switch (use.dtypes.size()) {
    case 0: return runtime::SupportsOp(device, use.op, {DType::kF32});
    case 1: return runtime::SupportsOp(device, use.op, {use.dtypes[0]});
    case 2: return runtime::SupportsOp(device, use.op, {use.dtypes[0], use.dtypes[1]});
    default:
      return runtime::SupportsOp(device, use.op, {use.dtypes[0], use.dtypes[1], use.dtypes[2]});
  }
}

}  // namespace

std::string OpUse::DtypeText() const {
  if (dtypes.empty()) return "f32";
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : "->") + Lower(DTypeName(d));
  return s;
}

std::vector<OpUse> RequiredOps(const GgufFile& file, const ModelConfig& c, DType kv_dtype,
                               bool tensor_parallel) {
  using runtime::Op;
  std::vector<OpUse> uses;
  // One row per (op, dtype), its users in order of first appearance.
  auto add = [&](Op op, std::vector<DType> dtypes, const std::string& user,
                 uint32_t abi_minor = 0) {
    for (OpUse& u : uses) {
      if (u.op == op && u.dtypes == dtypes && u.abi_minor == abi_minor) {
        if (std::find(u.users.begin(), u.users.end(), user) == u.users.end())
          u.users.push_back(user);
        return;
      }
    }
    uses.push_back(OpUse{op, std::move(dtypes), {user}, abi_minor});
  };
  auto dtype_of = [&](const std::string& name) {
    const GgufTensor* t = file.FindTensor(name);
    return t != nullptr ? t->dtype : DType::kF32;
  };
  const std::string layers = " (" + std::to_string(c.n_layer) + " layers)";

  add(Op::kEmbedding, {dtype_of("token_embd.weight")}, "token_embd.weight");
  add(Op::kRmsNorm, {}, "blk.*.attn_norm, blk.*.ffn_norm, output_norm");
  if (c.has_qk_norm) add(Op::kRmsNorm, {}, "blk.*.attn_q_norm, blk.*.attn_k_norm (per head)");
  if (c.has_post_norms) add(Op::kRmsNorm, {}, "blk.*.post_attention_norm, blk.*.post_ffw_norm");
  // Layer weights may mix dtypes (the _M quantization mixes keep some tensors at a higher
  // precision, and vary them between layers): one row per dtype actually present.
  // A fused matrix (phi3's attn_qkv; its ffn_up holds gate and up) is one row: the parts the
  // forward pass multiplies by are rows of it, of its dtype.
  static const char* kMatrices[] = {"attn_q", "attn_k",   "attn_v", "attn_qkv", "attn_output",
                                    "ffn_gate", "ffn_up", "ffn_down"};
  for (const char* m : kMatrices) {
    std::map<DType, int64_t> per_dtype;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string name = LayerTensorName(l, std::string(m) + ".weight");
      if (file.FindTensor(name) != nullptr) ++per_dtype[dtype_of(name)];
    }
    for (auto [dtype, count] : per_dtype) {
      const std::string n = count == c.n_layer ? layers : " (" + std::to_string(count) + " of " +
                                                              std::to_string(c.n_layer) + " layers)";
      add(Op::kMatmul, {dtype}, std::string("blk.*.") + m + ".weight" + n);
    }
  }
  if (c.n_expert > 0) {  // qwen3moe: the router's matmul, and MOE per dtype combination
    std::map<std::vector<DType>, int64_t> per_dtypes;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      add(Op::kMatmul, {dtype_of(LayerTensorName(l, "ffn_gate_inp.weight"))},
          "blk.*.ffn_gate_inp.weight (router)");
      ++per_dtypes[{dtype_of(LayerTensorName(l, "ffn_gate_exps.weight")),
                    dtype_of(LayerTensorName(l, "ffn_up_exps.weight")),
                    dtype_of(LayerTensorName(l, "ffn_down_exps.weight"))}];
    }
    for (const auto& [dtypes, count] : per_dtypes) {
      add(Op::kMoe, dtypes,
          "blk.*.ffn_{gate,up,down}_exps.weight (" + std::to_string(count) + " of " +
              std::to_string(c.n_layer) + " layers)");
    }
  }
  const std::string output = c.tied_output ? "token_embd.weight" : "output.weight";
  add(Op::kMatmul, {dtype_of(output)}, output + " (logits)");
  add(Op::kRope, {}, "q and k of every layer");
  add(Op::kKvStore, {kv_dtype}, "KV cache");
  const int64_t n_sliding = c.NumSlidingLayers();
  if (n_sliding < c.n_layer) add(Op::kAttention, {kv_dtype}, "KV cache");
  if (n_sliding > 0) {  // the window member came in ABI 1.4
    add(Op::kAttention, {kv_dtype},
        "sliding-window layers (" + std::to_string(n_sliding) + " of " +
            std::to_string(c.n_layer) + ", window " + std::to_string(c.sliding_window) + ")",
        4);
  }
  if (c.gelu_ffn) {
    add(Op::kGeglu, {}, "feed-forward of every layer");
    add(Op::kScale, {}, "token embeddings times sqrt(n_embd)");
    add(Op::kAdd, {}, "post-attention and post-feed-forward norms' residuals");
  } else if (c.n_expert == 0) {
    add(Op::kSwiglu, {}, "feed-forward of every layer");
  }
  add(Op::kEmbedding, {DType::kF32}, "logits rows of the hidden states");
  if (tensor_parallel) add(Op::kAdd, {}, "tensor-parallel residual");
  return uses;
}

const char* OpStateName(OpState state) {
  switch (state) {
    case OpState::kSupported: return "supported";
    case OpState::kFallback: return "fallback";
    case OpState::kMissing: return "missing";
  }
  return "?";
}

std::vector<CoverageRow> CheckCoverage(const runtime::Device& device,
                                       const std::vector<OpUse>& uses) {
  std::vector<CoverageRow> rows;
  runtime::OpFallback* fallback = device.op_fallback();
  for (const OpUse& use : uses) {
    OpState state = OpState::kMissing;
    if (Supported(device, use)) {
      state = OpState::kSupported;
    } else if (fallback != nullptr && Supported(fallback->device(), use)) {
      state = OpState::kFallback;
    }
    rows.push_back(CoverageRow{use, state});
  }
  return rows;
}

std::string FormatCoverage(const std::vector<CoverageRow>& rows) {
  size_t op_w = 2, dt_w = 5;
  for (const CoverageRow& r : rows) {
    op_w = std::max(op_w, std::string(runtime::OpName(r.use.op)).size());
    dt_w = std::max(dt_w, r.use.DtypeText().size());
  }
  auto pad = [](std::string s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  std::string out = pad("op", op_w) + "  " + pad("dtype", dt_w) + "  " + pad("state", 9) +
                    "  used by\n";
  for (const CoverageRow& r : rows) {
    std::string users;
    for (const std::string& u : r.use.users) users += (users.empty() ? "" : "; ") + u;
    out += pad(runtime::OpName(r.use.op), op_w) + "  " + pad(r.use.DtypeText(), dt_w) + "  " +
           pad(OpStateName(r.state), 9) + "  " + users + "\n";
  }
  return out;
}

Status CoverageStatus(const runtime::Device& device, const std::vector<CoverageRow>& rows) {
  std::string missing;
  for (const CoverageRow& r : rows) {
    if (r.state != OpState::kMissing) continue;
    std::string users;
    for (const std::string& u : r.use.users) users += (users.empty() ? "" : "; ") + u;
    missing += "\n  " + std::string(runtime::OpName(r.use.op)) + " (" + r.use.DtypeText() +
               "), needed by " + users;
  }
  if (missing.empty()) return Status::Ok();
  std::string hint;
  if (device.op_fallback() == nullptr) {
    hint = "run them on another plugin with --op-fallback cpu (or op_fallback: cpu in the "
           "config), or implement them in the plugin (docs/adding-a-backend.md)";
  } else {
    hint = "the fallback device " + DeviceName(device.op_fallback()->device()) +
           " lacks them too: implement them in one of the two plugins";
  }
  return FailedPrecondition("device " + DeviceName(device) + " (" + device.backend()->path() +
                            ") does not support ops this model launches:" + missing + "\n" +
                            hint);
}

}  // namespace polychip::model
