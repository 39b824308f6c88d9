// Op coverage: every (op, dtype, layout) a model will launch, derived from its configuration and
// its file before anything is allocated, and checked against a device's op_supports. A gap is
// one clear error naming the ops, the tensors that need them and what to do; with a fallback
// device (--op-fallback) the gaps it covers run there instead. `polychip doctor --model-path`
// prints the table.
#pragma once

#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/kv_cache_dtypes.h"
#include "model/model_config.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/ops.h"
#include "util/status.h"

namespace polychip::model {

// One kind of launch: an op with the dtypes its query carries (pc_op_query_t.dtypes).
struct OpUse {
  runtime::Op op;
  std::vector<DType> dtypes;       // empty: F32 activations only
  std::vector<std::string> users;  // what launches it, e.g. "blk.*.attn_q.weight (24 layers)"
  // The ABI minor of the newest member its launches set (ATTENTION's window: 4); a plugin older
  // than that cannot run them (runtime::Launch refuses, the fallback takes them).
  uint32_t abi_minor = 0;
  std::string DtypeText() const;   // "q4_0", "f16", "f32", "k=q8_0 v=f16"
};

// The launches of the transformer (transformer.cc) for this model: `tensor_parallel` adds the
// ADD of the reduced residual.
std::vector<OpUse> RequiredOps(const GgufFile& file, const ModelConfig& config,
                               KvCacheDtypes kv_dtypes,
                               bool tensor_parallel = false);

enum class OpState { kSupported, kFallback, kMissing };
const char* OpStateName(OpState state);  // "supported", "fallback", "missing"

struct CoverageRow {
  OpUse use;
  OpState state = OpState::kMissing;
};
// Each use asked of `device` (GGUF layout), then of its fallback device, if any.
std::vector<CoverageRow> CheckCoverage(const runtime::Device& device,
                                       const std::vector<OpUse>& uses);

// op | dtype | state | used by, aligned, one line per row.
std::string FormatCoverage(const std::vector<CoverageRow>& rows);

// OK when nothing is missing; else FAILED_PRECONDITION naming every missing op and dtype, the
// tensors that need them, and the two ways out (--op-fallback cpu, or implement them).
Status CoverageStatus(const runtime::Device& device, const std::vector<CoverageRow>& rows);

}  // namespace polychip::model
