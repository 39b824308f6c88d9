#include "model/arch.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace polychip::model {

#define PC_ARCH(Name, name) const ArchDef& Name##Arch();
#include "model/archs.def"
#undef PC_ARCH

const ArchDef& GetArch(Arch arch) {
  switch (arch) {
#define PC_ARCH(Name, name) \
  case Arch::k##Name:       \
    return Name##Arch();
#include "model/archs.def"
#undef PC_ARCH
  }
  PC_CHECK(false && "an Arch value outside archs.def");
  return LlamaArch();
}

std::vector<Arch> AllArchs() {
  return {
#define PC_ARCH(Name, name) Arch::k##Name,
#include "model/archs.def"
#undef PC_ARCH
  };
}

std::string HParams::Key(std::string_view key) const { return fmt::format("{}.{}", arch_, key); }

StatusOr<int64_t> HParams::Count(std::string_view name, bool required, int64_t def) const {
  const std::string key = Key(name);
  const GgufValue* v = file_.Find(key);
  if (v == nullptr) {
    if (required) return InvalidArgument(fmt::format("missing hyper-parameter '{}'", key));
    return def;
  }
  int64_t x = 0;
  if (v->type == GgufType::kArray && v->raw != nullptr && IsGgufIntegerType(v->elem_type) &&
      v->count > 0) {
    x = v->IntAt(0);
    for (uint64_t k = 1; k < v->count; ++k) {
      if (v->IntAt(k) != x) {
        return Unimplemented(fmt::format("'{}' varies per layer, which is not supported", key));
      }
    }
  } else {
    PC_ASSIGN_OR_RETURN(x, file_.GetI64(key));
  }
  // No real model has a dimension or a count near 2^31, and the bound keeps the product of any
  // two of them (a tensor's element count, q_dim) inside int64 before the tensors are checked.
  if (x < 0 || x > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument(fmt::format("hyper-parameter '{}' = {} is out of range", key, x));
  }
  return x;
}

StatusOr<float> HParams::Positive(std::string_view name, float def) const {
  const float x = F32(name, def);
  if (!(x > 0) || !std::isfinite(x)) {
    return InvalidArgument(fmt::format("'{}' {} is invalid", Key(name), x));
  }
  return x;
}

ModelConfig BaseShape(Arch arch, int64_t layers, int64_t embd, int64_t heads, int64_t kv_heads,
                      int64_t ff, int64_t ctx, float rope_base, float rms_eps, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.n_layer = layers;
  c.n_embd = embd;
  c.n_head = heads;
  c.n_head_kv = kv_heads;
  c.n_ff = ff;
  c.n_ctx_train = ctx;
  c.head_dim = c.head_dim_v = c.n_rot = embd / heads;
  c.rope_freq_base = rope_base;
  c.rms_eps = rms_eps;
  c.tied_output = tied;
  return c;
}

Status AdoptArch(Arch arch, ModelConfig& c) {
  const ArchDef& def = GetArch(arch);
  if (c.arch != arch) {
    if (def.usual_rope_base > 0) c.rope_freq_base = def.usual_rope_base;
    if (def.usual_rms_eps > 0) c.rms_eps = def.usual_rms_eps;
  }
  c.has_qkv_bias = false;
  c.has_qk_norm = false;
  if (def.adopt != nullptr) PC_RETURN_IF_ERROR(def.adopt(c));
  c.arch = arch;
  return Status::Ok();
}

}  // namespace polychip::model
