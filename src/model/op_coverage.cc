#include "model/op_coverage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "model/transformer.h"
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
    case 0:
      return runtime::SupportsOp(device, use.op, {DType::kF32});
    case 1:
      return runtime::SupportsOp(device, use.op, {use.dtypes[0]});
    case 2:
      return runtime::SupportsOp(device, use.op, {use.dtypes[0], use.dtypes[1]});
    default:
      return runtime::SupportsOp(device, use.op, {use.dtypes[0], use.dtypes[1], use.dtypes[2]});
  }
}

}  // namespace

std::string OpUse::DtypeText() const {
  if (dtypes.empty()) return "f32";
  // The KV ops' {K, V}: "q8_0" when they agree, else "k=q8_0 v=f16".
  if ((op == runtime::Op::kKvStore || op == runtime::Op::kAttention) && dtypes.size() == 2)
    return KvCacheDtypesText({dtypes[0], dtypes[1]});
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : "->") + Lower(DTypeName(d));
  return s;
}

namespace {

using runtime::DevPtr;

// A member appended after its op came (a launch that sets it needs a plugin that knows it).
constexpr bool Newer(uint32_t member_since, uint32_t op_since) { return member_since > op_since; }

// Runs the forward pass once without a device (Transformer over a Launcher that records): every
// launch becomes the (op, dtypes, ABI minor) op coverage asks a plugin about, with what it
// reads. Weights, KV cache and step buffers are placeholder addresses, each standing for a name.
class Recorder final : public Launcher {
 public:
  // A placeholder address for `name`: a tensor of the file, a layer's KV cache ("blk.3.k_cache",
  // `weight` true) or a step buffer.
  DevPtr Place(const std::string& name, bool weight) {
    const DevPtr ptr = (names_.size() + 1) * 4096;
    names_[ptr] = {name, weight};
    return ptr;
  }
  std::vector<OpUse> Uses(int64_t n_layer) const;

#define PC_DT(member, role, kind) \
  if (runtime::DtypeMeant(a, #role)) dtypes.push_back(a.member);
#define PC_LAYOUT(member)
#define PC_M(type, m, since)                                                          \
  if (Newer(since, kOpSince) && a.m != decltype(a.m){} && !runtime::ReadsAsAbsent(a, #m)) \
    minor = std::max<uint32_t>(minor, since);
#define PC_PTR(m, access, bytes, since) \
  PC_M(DevPtr, m, since)                \
  operands.push_back(a.m);
#define PC_OP(NAME, name, Camel, id, args_t, since, DTYPES, LAYOUT, MEMBERS) \
  Status Launch(const runtime::Camel##Args& a) override {                    \
    constexpr uint32_t kOpSince = since;                                     \
    std::vector<DType> dtypes;                                               \
    std::vector<DevPtr> operands;                                            \
    uint32_t minor = 0;                                                      \
    DTYPES                                                                   \
    MEMBERS                                                                  \
    Record(runtime::Op::k##Camel, std::move(dtypes), minor, operands);       \
    return Status::Ok();                                                     \
  }
#include "polychip_op_list.def"
#undef PC_OP
#undef PC_PTR
#undef PC_M
#undef PC_LAYOUT
#undef PC_DT

  Status AllReduce(const TensorParallel&, DevPtr, int64_t) override { return Status::Ok(); }
  Status Send(const PipelineStage&, DevPtr, int64_t) override { return Status::Ok(); }
  Status Recv(const PipelineStage&, DevPtr, int64_t) override { return Status::Ok(); }
  Status HostCompute(DevPtr, int64_t, DevPtr, int64_t, const HostFn&) override {
    return Status::Ok();
  }

 private:
  struct Name {
    std::string name;
    bool weight;
  };
  // One kind of launch and what launched it: the weight it reads (or, without one, the first
  // buffer), with the layers seen, "blk.3." folded into "blk.*.".
  struct User {
    std::string name;
    std::set<int64_t> layers;
  };
  struct Row {
    OpUse use;
    std::vector<User> users;
  };

  void Record(runtime::Op op, std::vector<DType> dtypes, uint32_t minor,
              const std::vector<DevPtr>& operands) {
    const Name* by = nullptr;
    for (DevPtr p : operands) {
      auto it = names_.find(p);
      if (it == names_.end()) continue;
      if (it->second.weight) {
        by = &it->second;
        break;
      }
      if (by == nullptr) by = &it->second;
    }
    std::string name = by != nullptr ? by->name : runtime::OpName(op);
    int64_t layer = -1;
    if (name.rfind("blk.", 0) == 0) {
      const size_t dot = name.find('.', 4);
      layer = std::stoll(name.substr(4, dot - 4));
      name = "blk.*" + name.substr(dot);
    }
    auto row = std::find_if(rows_.begin(), rows_.end(), [&](const Row& r) {
      return r.use.op == op && r.use.dtypes == dtypes && r.use.abi_minor == minor;
    });
    if (row == rows_.end()) row = rows_.insert(rows_.end(), Row{{op, dtypes, {}, minor}, {}});
    auto user = std::find_if(row->users.begin(), row->users.end(),
                             [&](const User& u) { return u.name == name; });
    if (user == row->users.end()) user = row->users.insert(row->users.end(), User{name, {}});
    if (layer >= 0) user->layers.insert(layer);
  }

  std::map<DevPtr, Name> names_;
  std::vector<Row> rows_;
};

std::vector<OpUse> Recorder::Uses(int64_t n_layer) const {
  std::vector<OpUse> uses;
  for (const Row& row : rows_) {
    OpUse use = row.use;
    for (const User& u : row.users) {
      const auto n = static_cast<int64_t>(u.layers.size());
      if (n == 0) {
        use.users.push_back(u.name);
      } else if (n == n_layer) {
        use.users.push_back(u.name + " (" + std::to_string(n) + " layers)");
      } else {
        use.users.push_back(u.name + " (" + std::to_string(n) + " of " + std::to_string(n_layer) +
                            " layers)");
      }
    }
    uses.push_back(std::move(use));
  }
  return uses;
}

// Placeholder weights: each tensor of the file that the loader puts in ModelWeights, at an
// address of its own, of its dtype in the file. A fused matrix (phi3's attn_qkv, and its
// ffn_up holding gate and up) stands for each of its parts: their launches are its rows.
ModelWeights PlaceWeights(const GgufFile& file, const ModelConfig& c, Recorder& rec) {
  ModelWeights w;
  auto dtype_of = [&](const std::string& name) {
    const GgufTensor* t = file.FindTensor(name);
    return t != nullptr ? t->dtype : DType::kF32;
  };
  auto vector = [&](const std::string& name) {
    return file.FindTensor(name) != nullptr ? rec.Place(name, true) : DevPtr{0};
  };
  auto matrix = [&](const std::string& name) {
    MatrixRef m;
    m.data = rec.Place(name, true);
    m.dtype = dtype_of(name);
    return m;
  };
  w.embd = rec.Place("token_embd.weight", true);
  w.embd_dtype = dtype_of("token_embd.weight");
  w.output = c.tied_output ? MatrixRef{w.embd, w.embd_dtype} : matrix("output.weight");
  w.output_norm = vector("output_norm.weight");
  w.output_bias = vector("output.bias");
  w.rope_freqs =
      c.has_rope_factors ? vector("rope_factors_short.weight") : vector("rope_freqs.weight");
  for (int64_t l = 0; l < c.n_layer; ++l) {
    auto n = [l](const char* suffix) { return LayerTensorName(l, suffix); };
    LayerWeights& L = w.layers.emplace_back();
    L.attn_norm = vector(n("attn_norm.weight"));
    L.ffn_norm = vector(n("ffn_norm.weight"));
    L.q_norm = vector(n("attn_q_norm.weight"));
    L.k_norm = vector(n("attn_k_norm.weight"));
    L.post_attn_norm = vector(n("post_attention_norm.weight"));
    L.post_ffn_norm = vector(n("post_ffw_norm.weight"));
    L.bq = vector(n("attn_q.bias"));
    L.bk = vector(n("attn_k.bias"));
    L.bv = vector(n("attn_v.bias"));
    L.bo = vector(n("attn_output.bias"));
    if (c.fused_qkv) {
      L.wq = L.wk = L.wv = matrix(n("attn_qkv.weight"));
    } else {
      L.wq = matrix(n("attn_q.weight"));
      L.wk = matrix(n("attn_k.weight"));
      L.wv = matrix(n("attn_v.weight"));
    }
    L.wo = matrix(n("attn_output.weight"));
    if (c.n_expert > 0) {
      L.router = matrix(n("ffn_gate_inp.weight"));
      L.gate_exps = matrix(n("ffn_gate_exps.weight"));
      L.up_exps = matrix(n("ffn_up_exps.weight"));
      L.down_exps = matrix(n("ffn_down_exps.weight"));
    } else if (c.fused_gate_up) {
      L.w_gate = L.w_up = matrix(n("ffn_up.weight"));
      L.w_down = matrix(n("ffn_down.weight"));
    } else {
      L.w_gate = matrix(n("ffn_gate.weight"));
      L.w_up = matrix(n("ffn_up.weight"));
      L.w_down = matrix(n("ffn_down.weight"));
    }
  }
  return w;
}

}  // namespace

std::vector<OpUse> RequiredOps(const GgufFile& file, const ModelConfig& c, KvCacheDtypes kv_dtypes,
                               bool tensor_parallel) {
  Recorder rec;
  const ModelWeights w = PlaceWeights(file, c, rec);
  StatusOr<Transformer> transformer = Transformer::Create(c, w);
  PC_CHECK(transformer.ok());  // FromGguf accepted the configuration
  TensorParallel tp;
  tp.size = 2;  // the all-reduces themselves are the comm plugin's, not the device's
  if (tensor_parallel) transformer->SetTensorParallel(&tp);

  StepInputs in;
  in.n_tokens = in.n_seqs = 1;
  in.tokens = rec.Place("tokens", false);
  in.positions = rec.Place("positions", false);
  StepBuffers b;
  b.x = rec.Place("hidden states", false);
  b.xn = rec.Place("normed hidden states", false);
  b.q = rec.Place("q", false);
  b.k = rec.Place("k", false);
  b.v = rec.Place("v", false);
  b.attn = rec.Place("attention output", false);
  b.gate = rec.Place("feed-forward gate", false);
  b.up = rec.Place("feed-forward up", false);
  KvCacheView kv;
  kv.dtypes = kv_dtypes;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    kv.k.push_back({rec.Place(LayerTensorName(l, "k_cache"), true)});
    kv.v.push_back({rec.Place(LayerTensorName(l, "v_cache"), true)});
  }
  const DevPtr rows = rec.Place("rows", false);
  const DevPtr h = rec.Place("final hidden states", false);
  const DevPtr logits = rec.Place("logits", false);
  // A recorder's launches cannot fail.
  PC_CHECK(transformer->Layers(rec, in, b, kv).ok());
  PC_CHECK(transformer->Logits(rec, b.x, in.n_tokens, rows, 1, h, logits).ok());
  return rec.Uses(c.n_layer);
}

const char* OpStateName(OpState state) {
  switch (state) {
    case OpState::kSupported:
      return "supported";
    case OpState::kFallback:
      return "fallback";
    case OpState::kMissing:
      return "missing";
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
  auto pad = [](std::string s, size_t w) {
    return s + std::string(w > s.size() ? w - s.size() : 0, ' ');
  };
  std::string out =
      pad("op", op_w) + "  " + pad("dtype", dt_w) + "  " + pad("state", 9) + "  used by\n";
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
    hint =
        "run them on another plugin with --op-fallback cpu (or op_fallback: cpu in the "
        "config), or implement them in the plugin (docs/adding-a-backend.md)";
  } else {
    hint = "the fallback device " + DeviceName(device.op_fallback()->device()) +
           " lacks them too: implement them in one of the two plugins";
  }
  return FailedPrecondition("device " + DeviceName(device) + " (" + device.backend()->path() +
                            ") does not support ops this model launches:" + missing + "\n" + hint);
}

}  // namespace polychip::model
