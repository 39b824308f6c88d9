// The Vulkan plugin's compute domain: one compute pipeline per kernel variant (built on first
// use from the SPIR-V embedded at build time), operands bound as storage-buffer windows that
// never exceed maxStorageBufferRange (a larger operand is split over several dispatches), paged
// KV caches reached by buffer device address.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "polychip/sdk/op_list.h"
#include "polychip/sdk/plugin_util.h"
#include "polychip/sdk/quant.h"
#include "polychip/sdk/ref_kernels.h"
#include "vk_context.h"

namespace polychip::vulkan {

struct ShaderBlob {
  const char* name;
  const uint32_t* code;
  size_t bytes;
};
#include "shader_table.inc"

namespace {

using sdk::MakeError;
constexpr uint32_t kPushBytes = 128;  // the minimum every device guarantees

pc_error_t* BadArg(const std::string& m) { return MakeError(PC_CODE_INVALID_ARGUMENT, m); }
pc_error_t* VkFail(const char* what, VkResult r) {
  const bool oom = r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY;
  return MakeError(oom ? PC_CODE_RESOURCE_EXHAUSTED : PC_CODE_INTERNAL,
                   std::string(what) + ": " + VkResultName(r));
}

const char* WeightSuffix(pc_dtype_t t) {
  switch (t) {
    case PC_DTYPE_F32: return "F32";
    case PC_DTYPE_F16: return "F16";
    case PC_DTYPE_BF16: return "BF16";
    case PC_DTYPE_Q8_0: return "Q8_0";
    case PC_DTYPE_Q4_0: return "Q4_0";
    case PC_DTYPE_Q4_1: return "Q4_1";
    case PC_DTYPE_Q5_0: return "Q5_0";
    case PC_DTYPE_Q5_1: return "Q5_1";
    case PC_DTYPE_Q4_K: return "Q4_K";
    case PC_DTYPE_Q6_K: return "Q6_K";
    case PC_DTYPE_IQ4_NL: return "IQ4_NL";
    case PC_DTYPE_IQ4_XS: return "IQ4_XS";
    default: return nullptr;
  }
}
bool FloatType(pc_dtype_t t) {
  return t == PC_DTYPE_F32 || t == PC_DTYPE_F16 || t == PC_DTYPE_BF16;
}

// The kernel named `name` with n_bindings buffers, built on first use: the first n_texel of
// them uniform texel buffers, the rest storage buffers.
pc_error_t* GetKernel(Device& d, const std::string& name, uint32_t n_bindings, Kernel** out,
                      uint32_t n_texel = 0) {
  std::lock_guard<std::mutex> lock(d.kernels_mu);
  for (auto& k : d.kernels) {
    if (k->name == name) {
      *out = k.get();
      return nullptr;
    }
  }
  const ShaderBlob* blob = nullptr;
  for (const ShaderBlob& b : kShaders) {
    if (name == b.name) blob = &b;
  }
  if (!blob) return MakeError(PC_CODE_INTERNAL, "no shader " + name + " in the plugin");
  const Vk& vk = *d.vk;
  auto k = std::make_unique<Kernel>();
  k->name = name;
  k->n_bindings = n_bindings;
  k->n_texel_bindings = n_texel;
  std::vector<VkDescriptorSetLayoutBinding> bindings(n_bindings);
  for (uint32_t i = 0; i < n_bindings; ++i) {
    bindings[i] = {i,
                   i < n_texel ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
                               : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                   1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  }
  VkDescriptorSetLayoutCreateInfo sli{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  sli.bindingCount = n_bindings;
  sli.pBindings = bindings.data();
  VkResult r = vk.vkCreateDescriptorSetLayout(d.device, &sli, nullptr, &k->set_layout);
  VkPushConstantRange pcr{VK_SHADER_STAGE_COMPUTE_BIT, 0, kPushBytes};
  VkPipelineLayoutCreateInfo pli{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pli.setLayoutCount = 1;
  pli.pSetLayouts = &k->set_layout;
  pli.pushConstantRangeCount = 1;
  pli.pPushConstantRanges = &pcr;
  if (r == VK_SUCCESS) r = vk.vkCreatePipelineLayout(d.device, &pli, nullptr, &k->layout);
  VkShaderModule module = VK_NULL_HANDLE;
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = blob->bytes;
  mi.pCode = blob->code;
  if (r == VK_SUCCESS) r = vk.vkCreateShaderModule(d.device, &mi, nullptr, &module);
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = module;
  ci.stage.pName = "main";
  ci.layout = k->layout;
  if (r == VK_SUCCESS)
    r = vk.vkCreateComputePipelines(d.device, VK_NULL_HANDLE, 1, &ci, nullptr, &k->pipeline);
  if (module) vk.vkDestroyShaderModule(d.device, module, nullptr);
  if (r != VK_SUCCESS) {
    if (k->layout) vk.vkDestroyPipelineLayout(d.device, k->layout, nullptr);
    if (k->set_layout) vk.vkDestroyDescriptorSetLayout(d.device, k->set_layout, nullptr);
    return VkFail(("building kernel " + name).c_str(), r);
  }
  *out = k.get();
  d.kernels.push_back(std::move(k));
  return nullptr;
}

// A storage-buffer window onto [ptr, ptr + bytes): the binding starts at the offset rounded down
// to minStorageBufferOffsetAlignment and `first` is where the operand starts inside it, in bytes.
// A texel window (BindTexels) is the texel view of the operand's whole block, `first` the
// operand's byte offset in the block.
struct Window {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint64_t offset = 0, range = 0;
  uint32_t first = 0;
  VkBufferView view = VK_NULL_HANDLE;
};

class Launcher {
 public:
  explicit Launcher(StreamState& s) : s_(s), d_(*s.device) {
    max_range_ = d_.info.props.limits.maxStorageBufferRange;
    align_ = std::max<uint64_t>(d_.info.props.limits.minStorageBufferOffsetAlignment, 4);
  }
  // Largest operand one window can carry.
  uint64_t MaxBytes() const { return max_range_ - align_; }

  // `unit`: the operand's element size; its start must be a multiple of it.
  pc_error_t* Bind(pc_devptr_t ptr, uint64_t bytes, uint32_t unit, const char* what, Window* w) {
    if (ptr == 0) ptr = d_.dummy, bytes = 4;
    uint64_t off = 0;
    Block* b = d_.Resolve(ptr, std::max<uint64_t>(bytes, 1), &off);
    if (!b) {
      return BadArg(std::string(what) + " is not valid memory of vulkan device " +
                    std::to_string(d_.ordinal));
    }
    const uint64_t base = off / align_ * align_;
    w->buffer = b->buffer;
    w->offset = base;
    w->first = static_cast<uint32_t>(off - base);
    // Whole 8-byte words, so that a kernel reading 64-bit components reaches the operand's end
    // (an allocation is rounded to far more than that).
    w->range = std::min<uint64_t>((w->first + bytes + 7) / 8 * 8, b->size - base);
    if (w->first % unit != 0) {
      return BadArg(std::string(what) + " is not aligned to its element size");
    }
    if (w->range > max_range_) {
      return MakeError(PC_CODE_INTERNAL, std::string(what) + ": window of " +
                                             std::to_string(w->range) + " bytes exceeds " +
                                             "maxStorageBufferRange");
    }
    return nullptr;
  }
  // The texel view of the block holding [ptr, ptr + bytes); false where it has none (no view,
  // or an offset past 32 bits), and then the caller takes a storage-buffer kernel.
  bool BindTexels(pc_devptr_t ptr, uint64_t bytes, Window* w) {
    uint64_t off = 0;
    Block* b = ptr ? d_.Resolve(ptr, std::max<uint64_t>(bytes, 1), &off) : nullptr;
    if (!b || !b->texels || off + bytes > UINT32_MAX) return false;
    *w = Window{};
    w->view = b->texels;
    w->first = static_cast<uint32_t>(off);
    return true;
  }
  // The device address of a paged cache (a layer's cache may exceed one window).
  pc_error_t* Address(pc_devptr_t ptr, const char* what, uint64_t* address) {
    uint64_t off = 0;
    Block* b = d_.Resolve(ptr, 4, &off);
    if (!b) {
      return BadArg(std::string(what) + " is not valid memory of vulkan device " +
                    std::to_string(d_.ordinal));
    }
    if (off % 4 != 0) return BadArg(std::string(what) + " is not 4-byte aligned");
    *address = b->address + off;
    return nullptr;
  }

  // Records one dispatch of `groups` workgroups (folded into x/y) with its windows and push
  // constants. The stream's mutex is held by the caller.
  pc_error_t* Dispatch(Kernel& k, const std::vector<Window>& windows, const void* push,
                       uint32_t push_bytes, uint64_t groups) {
    if (groups == 0) return nullptr;
    const Vk& vk = *d_.vk;
    VkResult r = s_.Begin();
    VkDescriptorSet set = VK_NULL_HANDLE;
    if (r == VK_SUCCESS) r = s_.AllocateSet(k.set_layout, &set);
    if (r != VK_SUCCESS) return VkFail("recording a dispatch", r);
    std::vector<VkDescriptorBufferInfo> infos(windows.size());
    std::vector<VkWriteDescriptorSet> writes(windows.size());
    for (size_t i = 0; i < windows.size(); ++i) {
      infos[i] = {windows[i].buffer, windows[i].offset, windows[i].range};
      writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
      writes[i].dstSet = set;
      writes[i].dstBinding = static_cast<uint32_t>(i);
      writes[i].descriptorCount = 1;
      if (i < k.n_texel_bindings) {
        writes[i].descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
        writes[i].pTexelBufferView = &windows[i].view;
      } else {
        writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        writes[i].pBufferInfo = &infos[i];
      }
    }
    vk.vkUpdateDescriptorSets(d_.device, static_cast<uint32_t>(writes.size()), writes.data(), 0,
                              nullptr);
    s_.Barrier();
    VkCommandBuffer cb = s_.open->cb;
    vk.vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k.pipeline);
    vk.vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, k.layout, 0, 1, &set, 0,
                               nullptr);
    vk.vkCmdPushConstants(cb, k.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    const uint64_t max_x = d_.info.props.limits.maxComputeWorkGroupCount[0];
    const uint64_t gx = std::min(groups, max_x), gy = (groups + gx - 1) / gx;
    if (gy > d_.info.props.limits.maxComputeWorkGroupCount[1])
      return MakeError(PC_CODE_UNIMPLEMENTED, "grid of " + std::to_string(groups) + " too large");
    vk.vkCmdDispatch(cb, static_cast<uint32_t>(gx), static_cast<uint32_t>(gy), 1);
    return nullptr;
  }

  Device& device() { return d_; }

 private:
  StreamState& s_;
  Device& d_;
  uint64_t max_range_ = 0, align_ = 4;
};

#define PCV_TRY(expr)                   \
  do {                                  \
    if (pc_error_t* e_ = (expr)) return e_; \
  } while (0)

uint32_t U32(int64_t v) { return static_cast<uint32_t>(v); }
uint64_t Ceil(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// ---- element-wise -----------------------------------------------------------------------------

pc_error_t* Binary(Launcher& L, const char* name, pc_devptr_t a, pc_devptr_t b, pc_devptr_t out,
                   int64_t n) {
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), name, 3, &k));
  const uint64_t chunk = L.MaxBytes() / 4 / 256 * 256;
  for (uint64_t i0 = 0; i0 < static_cast<uint64_t>(n); i0 += chunk) {
    const uint64_t c = std::min<uint64_t>(chunk, n - i0);
    std::vector<Window> w(3);
    PCV_TRY(L.Bind(a + i0 * 4, c * 4, 4, "a", &w[0]));
    PCV_TRY(L.Bind(b + i0 * 4, c * 4, 4, "b", &w[1]));
    PCV_TRY(L.Bind(out + i0 * 4, c * 4, 4, "out", &w[2]));
    uint32_t push[4] = {w[0].first / 4, w[1].first / 4, w[2].first / 4, U32(c)};
    PCV_TRY(L.Dispatch(*k, w, push, sizeof(push), Ceil(c, 256)));
  }
  return nullptr;
}

pc_error_t* Scale(Launcher& L, const pc_scale_args_t& a) {
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), "scale", 2, &k));
  const uint64_t chunk = L.MaxBytes() / 4 / 256 * 256;
  for (uint64_t i0 = 0; i0 < static_cast<uint64_t>(a.n); i0 += chunk) {
    const uint64_t c = std::min<uint64_t>(chunk, a.n - i0);
    std::vector<Window> w(2);
    PCV_TRY(L.Bind(a.x + i0 * 4, c * 4, 4, "x", &w[0]));
    PCV_TRY(L.Bind(a.out + i0 * 4, c * 4, 4, "out", &w[1]));
    struct {
      uint32_t x_off, o_off, n;
      float scale;
    } push{w[0].first / 4, w[1].first / 4, U32(c), a.scale};
    PCV_TRY(L.Dispatch(*k, w, &push, sizeof(push), Ceil(c, 256)));
  }
  return nullptr;
}

pc_error_t* RmsNorm(Launcher& L, const pc_rms_norm_args_t& a) {
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), "rms_norm", 3, &k));
  const uint64_t row = a.dim * 4, rows = std::max<uint64_t>(1, L.MaxBytes() / row);
  for (uint64_t r0 = 0; r0 < static_cast<uint64_t>(a.n_rows); r0 += rows) {
    const uint64_t nr = std::min<uint64_t>(rows, a.n_rows - r0);
    std::vector<Window> w(3);
    PCV_TRY(L.Bind(a.x + r0 * row, nr * row, 4, "x", &w[0]));
    PCV_TRY(L.Bind(a.weight, a.weight ? row : 0, 4, "weight", &w[1]));
    PCV_TRY(L.Bind(a.out + r0 * row, nr * row, 4, "out", &w[2]));
    struct {
      uint32_t x_off, w_off, o_off, n_rows, dim, has_weight;
      float eps;
    } push{w[0].first / 4, w[1].first / 4, w[2].first / 4, U32(nr), U32(a.dim),
           a.weight != 0 ? 1u : 0u, a.eps};
    PCV_TRY(L.Dispatch(*k, w, &push, sizeof(push), nr));
  }
  return nullptr;
}

pc_error_t* Matmul(Launcher& L, const pc_matmul_args_t& a) {
  const char* suffix = WeightSuffix(a.w_dtype);
  if (!suffix || a.w_layout != PC_LAYOUT_GGUF)
    return MakeError(PC_CODE_UNIMPLEMENTED, "matmul: weight dtype/layout not supported");
  // A CPU device (lavapipe) gets matrow.comp: each invocation walks all of k for 16 columns
  // (decode) or 8 columns x 8 rows (tiles), so that its x loads are the same for every SIMD lane
  // and serve that many weights each; it reads x as vec4s (k, the x stride and the x offset
  // multiples of 4; otherwise the GPU kernels), and F16 and quantized weights as 64-bit
  // components where the device has shaderInt64 (matrow64_*). A GPU gets tiles of 8 columns x 8 rows
  // reduced by shuffles (matvec.comp) where the subgroups allow, else one column x 8 rows
  // reduced through shared memory (matmul.comp).
  const Device& dev = L.device();
  const bool cpu = dev.info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU && a.k % 4 == 0 &&
                   a.x_stride % 4 == 0;
  const bool matvec = dev.info.subgroup_shuffle;
  const char* gpu_kind = !matvec ? "matmul_" : a.m == 1 ? "matvec_" : "mattile_";
  const bool wide = dev.info.int64 && a.w_dtype != PC_DTYPE_F32 && a.w_dtype != PC_DTYPE_BF16;
  const char* cpu_kind = a.m != 1 ? "matrowtile_" : wide ? "matrow64_" : "matrow_";
  // A CPU device reads x and W through texel views of their blocks where both have one (see
  // matrow.comp): tiles always (matrowtiletex_*), decode where the subgroups are 8 wide
  // (matrowtex_*, F16 and the quantized formats).
  const bool texel =
      cpu && dev.info.texel_blocks &&
      (a.m != 1 || (dev.info.subgroup_size == 8 && dev.info.subgroup_broadcast &&
                    a.w_dtype != PC_DTYPE_F32 && a.w_dtype != PC_DTYPE_BF16));
  const char* texel_kind = a.m != 1 ? "matrowtiletex_" : "matrowtex_";
  // Columns of a matrow.comp workgroup: 64 invocations of COLS (16 to decode, 8 in tiles).
  const uint64_t row_cols = a.m == 1 ? 16 * 64 : 8 * 64;
  const uint64_t row_bytes = sdk::RowBytes(a.w_dtype, a.k);
  const uint64_t max = L.MaxBytes();
  // Tiles of [mc rows of x/out] x [nc rows of W] whose windows each fit one binding.
  const uint64_t nc = std::min<uint64_t>(a.n, std::max<uint64_t>(1, max / row_bytes));
  const uint64_t mc = std::min<uint64_t>(
      a.m, std::max<uint64_t>(1, max / (std::max(a.x_stride, a.out_stride) * 4)));
  for (uint64_t m0 = 0; m0 < static_cast<uint64_t>(a.m); m0 += mc) {
    const uint64_t mm = std::min<uint64_t>(mc, a.m - m0);
    for (uint64_t n0 = 0; n0 < static_cast<uint64_t>(a.n); n0 += nc) {
      const uint64_t nn = std::min<uint64_t>(nc, a.n - n0);
      std::vector<Window> w(4);
      PCV_TRY(L.Bind(a.x + m0 * a.x_stride * 4, ((mm - 1) * a.x_stride + a.k) * 4, 4, "x", &w[0]));
      PCV_TRY(L.Bind(a.w + n0 * row_bytes, nn * row_bytes, FloatType(a.w_dtype) ? 4 : 2, "w",
                     &w[1]));
      PCV_TRY(L.Bind(a.bias ? a.bias + n0 * 4 : 0, nn * 4, 4, "bias", &w[2]));
      PCV_TRY(L.Bind(a.out + (m0 * a.out_stride + n0) * 4, ((mm - 1) * a.out_stride + nn) * 4, 4,
                     "out", &w[3]));
      struct {
        uint32_t x_off, w_off, b_off, o_off, m, n, k, x_stride, o_stride, row_bytes, has_bias,
            accumulate;
      } push{w[0].first / 4, w[1].first, w[2].first / 4, w[3].first / 4, U32(mm), U32(nn),
             U32(a.k), U32(a.x_stride), U32(a.out_stride), U32(row_bytes), a.bias ? 1u : 0u,
             a.accumulate ? 1u : 0u};
      const bool row = cpu && push.x_off % 4 == 0;
      Kernel* k = nullptr;
      Window xt, wt;
      if (row && texel &&
          L.BindTexels(a.x + m0 * a.x_stride * 4, ((mm - 1) * a.x_stride + a.k) * 4, &xt) &&
          xt.first % 16 == 0 && L.BindTexels(a.w + n0 * row_bytes, nn * row_bytes, &wt)) {
        w[0] = xt;
        w[1] = wt;
        push.x_off = xt.first / 4;
        push.w_off = wt.first;
        PCV_TRY(GetKernel(L.device(), std::string(texel_kind) + suffix, 4, &k, 2));
      } else {
        PCV_TRY(GetKernel(L.device(), std::string(row ? cpu_kind : gpu_kind) + suffix, 4, &k));
      }
      const uint64_t col_groups = row ? Ceil(nn, row_cols) : matvec ? Ceil(nn, 8) : nn;
      const uint64_t row_groups = a.m == 1 && (row || matvec) ? mm : Ceil(mm, 8);
      PCV_TRY(L.Dispatch(*k, w, &push, sizeof(push), col_groups * row_groups));
    }
  }
  return nullptr;
}

pc_error_t* Embedding(Launcher& L, const pc_embedding_args_t& a) {
  const char* suffix = WeightSuffix(a.table_dtype);
  if (!suffix || a.table_layout != PC_LAYOUT_GGUF)
    return MakeError(PC_CODE_UNIMPLEMENTED, "embedding: table dtype/layout not supported");
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), std::string("embedding_") + suffix, 3, &k));
  const uint64_t row_bytes = sdk::RowBytes(a.table_dtype, a.row_len), max = L.MaxBytes();
  // The table in windows of rows (a 0.5B model's table is larger than one binding on lavapipe),
  // the ids in chunks whose output fits one binding.
  const uint64_t rows = std::max<uint64_t>(1, max / row_bytes);
  const uint64_t ids = std::max<uint64_t>(1, max / (a.row_len * 4));
  for (uint64_t i0 = 0; i0 < static_cast<uint64_t>(a.n_ids); i0 += ids) {
    const uint64_t ni = std::min<uint64_t>(ids, a.n_ids - i0);
    for (uint64_t r0 = 0; r0 < static_cast<uint64_t>(a.n_rows); r0 += rows) {
      const uint64_t nr = std::min<uint64_t>(rows, a.n_rows - r0);
      std::vector<Window> w(3);
      PCV_TRY(L.Bind(a.table + r0 * row_bytes, nr * row_bytes, FloatType(a.table_dtype) ? 4 : 2,
                     "table", &w[0]));
      PCV_TRY(L.Bind(a.ids + i0 * 4, ni * 4, 4, "ids", &w[1]));
      PCV_TRY(L.Bind(a.out + i0 * a.row_len * 4, ni * a.row_len * 4, 4, "out", &w[2]));
      uint32_t push[8] = {w[0].first, w[1].first / 4, w[2].first / 4, U32(ni), U32(a.row_len),
                          U32(row_bytes), U32(r0), U32(r0 + nr)};
      PCV_TRY(L.Dispatch(*k, w, push, sizeof(push), ni));
    }
  }
  return nullptr;
}

pc_error_t* Rope(Launcher& L, const pc_rope_args_t& a) {
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), "rope", 3, &k));
  std::vector<Window> w(3);
  PCV_TRY(L.Bind(a.x, a.n_tokens * a.n_heads * a.head_dim * 4, 4, "x", &w[0]));
  PCV_TRY(L.Bind(a.positions, a.n_tokens * 4, 4, "positions", &w[1]));
  PCV_TRY(L.Bind(a.freq_factors, a.freq_factors ? (a.n_rot / 2) * 4 : 0, 4, "freq_factors",
                 &w[2]));
  struct {
    uint32_t x_off, pos_off, ff_off, has_ff, n_tokens, n_heads, head_dim, n_rot, neox;
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow, n_ctx_orig;
  } push{w[0].first / 4, w[1].first / 4, w[2].first / 4, a.freq_factors ? 1u : 0u,
         U32(a.n_tokens), U32(a.n_heads), U32(a.head_dim), U32(a.n_rot),
         a.mode == PC_ROPE_NEOX ? 1u : 0u, a.freq_base, a.freq_scale, a.ext_factor,
         a.attn_factor, a.beta_fast, a.beta_slow, static_cast<float>(a.n_ctx_orig)};
  return L.Dispatch(*k, w, &push, sizeof(push), Ceil(a.n_tokens * a.n_heads * (a.n_rot / 2), 64));
}

uint32_t CacheCode(pc_dtype_t t) { return t == PC_DTYPE_F32 ? 0u : t == PC_DTYPE_F16 ? 1u : 30u; }
// The float KV cache types, K and V of one type: the shaders read neither the block types (Q8_0,
// Q4_0, FP8_E4M3) nor a V of another type yet, and op_supports says so (the host then runs
// those ops on its --op-fallback device).
bool CacheType(pc_dtype_t t) { return FloatType(t); }
bool CacheTypes(pc_dtype_t k, pc_dtype_t v) {
  return CacheType(k) && (v == k || v == PC_DTYPE_INVALID);
}

pc_error_t* KvStore(Launcher& L, const pc_kv_store_args_t& a) {
  if (!CacheTypes(a.cache_dtype, polychip::sdk::KvStoreVDtype(a)))
    return MakeError(PC_CODE_UNIMPLEMENTED, "kv_store: cache dtype");
  const int64_t row = a.n_kv_heads * a.head_dim;
  if (a.cache_dtype != PC_DTYPE_F32 && row % 2 != 0)
    return MakeError(PC_CODE_UNIMPLEMENTED, "kv_store: odd row length for a 16-bit cache");
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), "kv_store", 3, &k));
  std::vector<Window> w(3);
  PCV_TRY(L.Bind(a.k, a.n_tokens * row * 4, 4, "k", &w[0]));
  PCV_TRY(L.Bind(a.v, a.n_tokens * row * 4, 4, "v", &w[1]));
  PCV_TRY(L.Bind(a.slots, a.n_tokens * 4, 4, "slots", &w[2]));
  uint64_t kc = 0, vc = 0;
  PCV_TRY(L.Address(a.k_cache, "k_cache", &kc));
  PCV_TRY(L.Address(a.v_cache, "v_cache", &vc));
  struct {
    uint32_t kc_lo, kc_hi, vc_lo, vc_hi, k_off, v_off, slots_off, n_tokens, row, dtype;
  } push{U32(kc), U32(kc >> 32), U32(vc), U32(vc >> 32), w[0].first / 4, w[1].first / 4,
         w[2].first / 4, U32(a.n_tokens), U32(row), CacheCode(a.cache_dtype)};
  return L.Dispatch(*k, w, &push, sizeof(push), a.n_tokens);
}

pc_error_t* Attention(Launcher& L, const pc_attention_args_t& a) {
  if (!CacheTypes(a.cache_dtype, polychip::sdk::AttentionVDtype(a)))
    return MakeError(PC_CODE_UNIMPLEMENTED, "attention: cache dtype");
  if (a.head_dim > 256)
    return MakeError(PC_CODE_UNIMPLEMENTED, "attention: head_dim above 256");
  // On a CPU device whose blocks have texel views, K and V are read through them
  // (attention_tex: bindings 0 and 1, the cache offsets in place of the addresses).
  Window kt, vt;
  const bool texel = L.device().info.props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU &&
                     L.BindTexels(a.k_cache, 4, &kt) && L.BindTexels(a.v_cache, 4, &vt);
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), texel ? "attention_tex" : "attention", texel ? 7 : 5, &k,
                    texel ? 2 : 0));
  const uint64_t q_bytes = a.n_tokens * a.n_heads * a.head_dim * 4;
  std::vector<Window> w(5);
  PCV_TRY(L.Bind(a.q, q_bytes, 4, "q", &w[0]));
  PCV_TRY(L.Bind(a.out, q_bytes, 4, "out", &w[1]));
  PCV_TRY(L.Bind(a.query_start, (a.n_seqs + 1) * 4, 4, "query_start", &w[2]));
  PCV_TRY(L.Bind(a.seq_lens, a.n_seqs * 4, 4, "seq_lens", &w[3]));
  PCV_TRY(L.Bind(a.block_tables, a.n_seqs * a.max_blocks_per_seq * 4, 4, "block_tables", &w[4]));
  uint64_t kc = 0, vc = 0;
  if (texel) {
    kc = kt.first, vc = vt.first;
  } else {
    PCV_TRY(L.Address(a.k_cache, "k_cache", &kc));
    PCV_TRY(L.Address(a.v_cache, "v_cache", &vc));
  }
  struct {
    uint32_t kc_lo, kc_hi, vc_lo, vc_hi, q_off, o_off, qs_off, sl_off, bt_off;
    uint32_t n_tokens, n_seqs, n_heads, n_kv_heads, head_dim, block_size, max_blocks, dtype;
    float scale;
    uint32_t window;  // 0: none (1.4; an older host's struct has no window)
  } push{U32(kc), U32(kc >> 32), U32(vc), U32(vc >> 32), w[0].first / 4, w[1].first / 4,
         w[2].first / 4, w[3].first / 4, w[4].first / 4, U32(a.n_tokens), U32(a.n_seqs),
         U32(a.n_heads), U32(a.n_kv_heads), U32(a.head_dim), U32(a.block_size),
         U32(a.max_blocks_per_seq), CacheCode(a.cache_dtype), a.scale,
         U32(std::min<int64_t>(sdk::AttentionWindow(a), UINT32_MAX))};
  if (texel) w.insert(w.begin(), {kt, vt});
  return L.Dispatch(*k, w, &push, sizeof(push), a.n_tokens * a.n_heads);
}

pc_error_t* Convert(Launcher& L, const pc_convert_args_t& a) {
  const uint64_t src_bytes = sdk::RowBytes(a.src_dtype, a.n);
  const uint64_t dst_bytes = sdk::RowBytes(a.dst_dtype, a.n);
  std::vector<Window> w(2);
  if (FloatType(a.src_dtype)) {
    if (!FloatType(a.dst_dtype)) return MakeError(PC_CODE_UNIMPLEMENTED, "convert: dst dtype");
    Kernel* k = nullptr;
    PCV_TRY(GetKernel(L.device(), "convert_float", 2, &k));
    PCV_TRY(L.Bind(a.src, src_bytes, a.src_dtype == PC_DTYPE_F32 ? 4 : 2, "src", &w[0]));
    PCV_TRY(L.Bind(a.dst, dst_bytes, 4, "dst", &w[1]));
    uint32_t push[5] = {w[0].first, w[1].first, U32(a.n), CacheCode(a.src_dtype),
                        CacheCode(a.dst_dtype)};
    const uint64_t words = a.dst_dtype == PC_DTYPE_F32 ? a.n : Ceil(a.n, 2);
    return L.Dispatch(*k, w, push, sizeof(push), Ceil(words, 256));
  }
  const char* suffix = WeightSuffix(a.src_dtype);
  if (!suffix || a.dst_dtype != PC_DTYPE_F32)
    return MakeError(PC_CODE_UNIMPLEMENTED, "convert: dtype pair not supported");
  Kernel* k = nullptr;
  PCV_TRY(GetKernel(L.device(), std::string("convert_") + suffix, 2, &k));
  PCV_TRY(L.Bind(a.src, src_bytes, 2, "src", &w[0]));
  PCV_TRY(L.Bind(a.dst, dst_bytes, 4, "dst", &w[1]));
  uint32_t push[3] = {w[0].first, w[1].first / 4, U32(a.n)};
  return L.Dispatch(*k, w, push, sizeof(push), Ceil(a.n / 32, 64));
}

}  // namespace

int32_t OpSupports(const Device& d, const pc_op_query_t& q) {
  auto weight = [](pc_dtype_t t) { return WeightSuffix(t) != nullptr; };
  const bool gguf = q.struct_size < offsetof(pc_op_query_t, layout) + sizeof(q.layout) ||
                    q.layout == PC_LAYOUT_GGUF;
  switch (q.op) {
    case PC_OP_EMBEDDING:
    case PC_OP_MATMUL: return gguf && weight(q.dtypes[0]);
    case PC_OP_KV_STORE:
    case PC_OP_ATTENTION:
      return d.info.buffer_device_address && CacheTypes(q.dtypes[0], q.dtypes[1]);
    case PC_OP_CONVERT:
      if (FloatType(q.dtypes[0])) return FloatType(q.dtypes[1]);
      return weight(q.dtypes[0]) && q.dtypes[1] == PC_DTYPE_F32;
    case PC_OP_RMS_NORM:
    case PC_OP_ROPE:
    case PC_OP_SWIGLU:
    case PC_OP_GEGLU:
    case PC_OP_SCALE:
    case PC_OP_ADD: return q.dtypes[0] == PC_DTYPE_F32 || q.dtypes[0] == PC_DTYPE_INVALID;
    default: return 0;
  }
}

// Records the op's kernels on the stream. Per-op counters: launches, bytes and FLOPs counted at
// enqueue (the KV extent of ATTENTION at its upper bound: device memory is not read from the
// host); device time from a timestamp pair around the op, added when its batch retires.
pc_error_t* OpLaunch(StreamState& s, pc_op_t op, const void* args) {
  if (const char* why = sdk::ValidateOpArgs(op, args)) {
    return MakeError(op > 0 && op < PC_OP_COUNT ? PC_CODE_INVALID_ARGUMENT : PC_CODE_UNIMPLEMENTED,
                     why);
  }
  // A host's struct may be shorter than ours (an older minor): its missing tail members are
  // absent (zero).
  std::vector<uint8_t> copy(sdk::OpArgsSize(op), 0);
  std::memcpy(copy.data(), args, std::min(copy.size(), *static_cast<const size_t*>(args)));
  const void* a = copy.data();
  std::lock_guard<std::mutex> lock(s.mu);
  Launcher L(s);
  const bool timed = s.device->count_ops && s.device->info.timestamps && s.Begin() == VK_SUCCESS &&
                     s.StartOpTimer();
  pc_error_t* error = [&]() -> pc_error_t* {
    switch (op) {
      case PC_OP_EMBEDDING: return Embedding(L, *static_cast<const pc_embedding_args_t*>(a));
      case PC_OP_RMS_NORM: return RmsNorm(L, *static_cast<const pc_rms_norm_args_t*>(a));
      case PC_OP_MATMUL: return Matmul(L, *static_cast<const pc_matmul_args_t*>(a));
      case PC_OP_ROPE: return Rope(L, *static_cast<const pc_rope_args_t*>(a));
      case PC_OP_KV_STORE: return KvStore(L, *static_cast<const pc_kv_store_args_t*>(a));
      case PC_OP_ATTENTION: return Attention(L, *static_cast<const pc_attention_args_t*>(a));
      case PC_OP_SWIGLU: {
        const auto& sw = *static_cast<const pc_swiglu_args_t*>(a);
        return Binary(L, "swiglu", sw.gate, sw.up, sw.out, sw.n);
      }
      case PC_OP_GEGLU: {
        const auto& ge = *static_cast<const pc_geglu_args_t*>(a);
        return Binary(L, "geglu", ge.gate, ge.up, ge.out, ge.n);
      }
      case PC_OP_SCALE: return Scale(L, *static_cast<const pc_scale_args_t*>(a));
      case PC_OP_ADD: {
        const auto& ad = *static_cast<const pc_add_args_t*>(a);
        return Binary(L, "add", ad.a, ad.b, ad.out, ad.n);
      }
      case PC_OP_CONVERT: return Convert(L, *static_cast<const pc_convert_args_t*>(a));
      default: return MakeError(PC_CODE_UNIMPLEMENTED, "unknown op");
    }
  }();
  if (timed) s.StopOpTimer(op, error == nullptr);
  if (error == nullptr && s.device->count_ops) {
    s.device->op_counters.Record(op, 0, sdk::OpWorkOf(op, a, nullptr));
  }
  return error;
}

void DestroyKernels(Device& d) {
  const Vk& vk = *d.vk;
  for (auto& k : d.kernels) {
    vk.vkDestroyPipeline(d.device, k->pipeline, nullptr);
    vk.vkDestroyPipelineLayout(d.device, k->layout, nullptr);
    vk.vkDestroyDescriptorSetLayout(d.device, k->set_layout, nullptr);
  }
  d.kernels.clear();
}

}  // namespace polychip::vulkan
