#include "model/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace polychip::model {

namespace {
constexpr DType kTargets[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                              DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                              DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K,
                              DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

// The type llama-quantize falls back to when the rows do not fit a K-quant super-block.
DType Fallback(DType t) {
  switch (t) {
    case DType::kQ2_K: case DType::kQ3_K: return DType::kQ4_0;
    case DType::kQ4_K: return DType::kQ5_0;
    case DType::kQ5_K: return DType::kQ5_1;
    case DType::kQ6_K: return DType::kQ8_0;
    case DType::kIQ4_XS: return DType::kIQ4_NL;
    default: return DType::kF16;
  }
}
struct MixInfo {
  QuantMix mix;
  const char* name;
  DType base;
  uint32_t file_type;  // enum llama_ftype
};
constexpr MixInfo kMixes[] = {
    {QuantMix::kQ3_K_S, "Q3_K_S", DType::kQ3_K, 11},
    {QuantMix::kQ3_K_M, "Q3_K_M", DType::kQ3_K, 12},
    {QuantMix::kQ3_K_L, "Q3_K_L", DType::kQ3_K, 13},
    {QuantMix::kQ4_K_S, "Q4_K_S", DType::kQ4_K, 14},
    {QuantMix::kQ4_K_M, "Q4_K_M", DType::kQ4_K, 15},
    {QuantMix::kQ5_K_S, "Q5_K_S", DType::kQ5_K, 16},
    {QuantMix::kQ5_K_M, "Q5_K_M", DType::kQ5_K, 17},
};

const MixInfo* FindMix(QuantMix mix) {
  for (const MixInfo& m : kMixes) {
    if (m.mix == mix) return &m;
  }
  return nullptr;
}

// llama-quantize's "use more bits" layers: the first and last eighth, and every third between.
bool MoreBitsLayer(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// "blk.12.ffn_down.weight" -> layer 12 and "ffn_down"; layer -1 outside the blocks.
int64_t SplitLayerName(const std::string& name, std::string* base) {
  *base = name;
  if (const size_t dot = base->rfind(".weight"); dot != std::string::npos) base->resize(dot);
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t end = name.find('.', 4);
  if (end == std::string::npos) return -1;
  int64_t layer = 0;
  for (size_t i = 4; i < end; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    layer = layer * 10 + (name[i] - '0');
  }
  *base = base->substr(end + 1);
  return layer;
}

// The mixture's type for a matrix, before the row-length fallbacks.
DType MixTensorType(const std::string& name, const std::vector<int64_t>& dims, QuantMix mix,
                    DType base, const MixModel& model) {
  if (mix == QuantMix::kUniform) return base;
  std::string role;
  const int64_t layer = SplitLayerName(name, &role);
  const int64_t n = model.n_layer;
  const bool output =
      name == "output.weight" || (model.tied_embeddings && name == "token_embd.weight");
  if (output) {
    // Q6_K where its rows fit the base type's super-block, else Q8_0.
    return dims[0] % BlockElems(base) == 0 ? DType::kQ6_K : DType::kQ8_0;
  }
  if (layer < 0) return base;
  using M = QuantMix;
  if (role == "attn_v") {
    switch (mix) {
      case M::kQ3_K_M: return layer < 2 ? DType::kQ5_K : DType::kQ4_K;
      case M::kQ3_K_L: return DType::kQ5_K;
      case M::kQ4_K_M: case M::kQ5_K_M: return MoreBitsLayer(layer, n) ? DType::kQ6_K : base;
      case M::kQ4_K_S: return layer < 4 ? DType::kQ5_K : base;
      default: return base;
    }
  }
  if (role == "ffn_down" || role == "ffn_down_exps") {  // the experts' as the dense one's
    switch (mix) {
      case M::kQ3_K_M: return layer < n / 16 ? DType::kQ5_K : DType::kQ4_K;
      case M::kQ3_K_L: return DType::kQ5_K;
      case M::kQ4_K_M: case M::kQ5_K_M: return MoreBitsLayer(layer, n) ? DType::kQ6_K : base;
      case M::kQ4_K_S: return layer < n / 8 ? DType::kQ5_K : base;
      default: return base;
    }
  }
  if (role == "attn_output") {
    if (mix == M::kQ3_K_M) return DType::kQ4_K;
    if (mix == M::kQ3_K_L) return DType::kQ5_K;
    return base;
  }
  if (role == "attn_qkv") {  // fused q/k/v (phi3)
    if (mix == M::kQ3_K_M || mix == M::kQ3_K_L) return DType::kQ4_K;
    if (mix == M::kQ4_K_M) return DType::kQ5_K;
    if (mix == M::kQ5_K_M) return DType::kQ6_K;
  }
  return base;
}

}  // namespace

bool IsQuantizeTarget(DType type) {
  return std::find(std::begin(kTargets), std::end(kTargets), type) != std::end(kTargets);
}

std::string QuantizeTargetNames() {
  std::string s;
  for (DType t : kTargets) s += (s.empty() ? "" : ", ") + std::string(DTypeName(t));
  return s;
}

DType ChooseTensorType(const std::string& name, const std::vector<int64_t>& dims, DType target,
                       std::string* warning) {
  return ChooseTensorType(name, dims, QuantScheme{target, QuantMix::kUniform}, MixModel{},
                          warning);
}

DType ChooseTensorType(const std::string& name, const std::vector<int64_t>& dims,
                       const QuantScheme& scheme, const MixModel& model, std::string* warning) {
  size_t real_dims = dims.size();
  while (real_dims > 1 && dims[real_dims - 1] == 1) --real_dims;  // [n, 1] is still a vector
  // A mixture-of-experts router (ffn_gate_inp) stays F32, as llama.cpp's converter writes it
  // and its quantizer leaves it: it is small, and a near-tie between experts decides a route.
  const bool router = name.size() >= 19 && name.compare(name.size() - 19, 19,
                                                         "ffn_gate_inp.weight") == 0;
  if (real_dims <= 1 || name == "rope_freqs.weight" || router) return DType::kF32;
  int64_t row = dims[0];
  DType t = MixTensorType(name, dims, scheme.mix, scheme.type, model);
  while (RowBytes(t, row) < 0) {
    DType next = Fallback(t);
    if (warning) {
      *warning = fmt::format("{}: row length {} is not a multiple of {}'s block {}, using {}",
                             name, row, DTypeName(t), BlockElems(t), DTypeName(next));
    }
    t = next;
  }
  return t;
}

StatusOr<QuantScheme> ParseQuantScheme(std::string_view name) {
  for (const MixInfo& m : kMixes) {
    if (name.size() == std::strlen(m.name) &&
        std::equal(name.begin(), name.end(), m.name, [](char a, char b) {
          return std::toupper(static_cast<unsigned char>(a)) == b;
        })) {
      return QuantScheme{m.base, m.mix};
    }
  }
  auto type = DTypeFromName(name);
  if (!type || !IsQuantizeTarget(*type)) {
    return InvalidArgument(fmt::format("unsupported type '{}' (supported: {})", name,
                                       QuantSchemeNames()));
  }
  return QuantScheme{*type, QuantMix::kUniform};
}

std::string QuantSchemeName(const QuantScheme& scheme) {
  const MixInfo* m = FindMix(scheme.mix);
  return m != nullptr ? m->name : DTypeName(scheme.type);
}

std::string QuantSchemeNames() {
  std::string s = QuantizeTargetNames();
  for (const MixInfo& m : kMixes) s += std::string(", ") + m.name;
  return s;
}

uint32_t LlamaFileType(const QuantScheme& scheme) {
  const MixInfo* m = FindMix(scheme.mix);
  return m != nullptr ? m->file_type : LlamaFileType(scheme.type);
}

uint32_t LlamaFileType(DType target) {
  switch (target) {
    case DType::kF32: return 0;
    case DType::kF16: return 1;
    case DType::kQ4_0: return 2;
    case DType::kQ4_1: return 3;
    case DType::kQ8_0: return 7;
    case DType::kQ5_0: return 8;
    case DType::kQ5_1: return 9;
    case DType::kQ2_K: return 10;
    case DType::kQ3_K: return 11;  // Q3_K_S: every matrix Q3_K
    case DType::kQ4_K: return 14;  // Q4_K_S
    case DType::kQ5_K: return 16;  // Q5_K_S
    case DType::kQ6_K: return 18;
    case DType::kIQ4_NL: return 25;
    case DType::kIQ4_XS: return 30;
    case DType::kBF16: return 32;
    default: return 0;
  }
}

std::string LlamaFileTypeName(uint32_t file_type) {
  for (const MixInfo& m : kMixes) {
    if (m.file_type == file_type) return m.name;
  }
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1, DType::kQ8_0, DType::kQ2_K, DType::kQ6_K, DType::kIQ4_NL,
                  DType::kIQ4_XS}) {
    if (LlamaFileType(t) == file_type) return DTypeName(t);
  }
  return "";
}

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void ParallelRows(int64_t n_rows, int threads, const std::function<void(int64_t, int64_t)>& fn) {
  threads = static_cast<int>(std::clamp<int64_t>(ResolveThreads(threads), 1, std::max<int64_t>(n_rows, 1)));
  if (threads == 1) {
    fn(0, n_rows);
    return;
  }
  std::vector<std::thread> pool;
  int64_t chunk = (n_rows + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    int64_t b = i * chunk, e = std::min(n_rows, b + chunk);
    if (b >= e) break;
    pool.emplace_back(fn, b, e);
  }
  for (std::thread& t : pool) t.join();
}

Status QuantizeGeneratedRows(const std::function<void(int64_t, float*)>& gen, DType dst_type,
                             uint8_t* dst, int64_t row_len, int64_t n_rows, int threads) {
  int64_t dst_row = RowBytes(dst_type, row_len);
  if (dst_row < 0) {
    return InvalidArgument(fmt::format("row length {} is not a multiple of {}'s block size",
                                       row_len, DTypeName(dst_type)));
  }
  std::atomic<bool> failed{false};
  ParallelRows(n_rows, threads, [&](int64_t begin, int64_t end) {
    std::vector<float> row(row_len);  // [row_len]
    for (int64_t r = begin; r < end && !failed; ++r) {
      gen(r, row.data());
      if (!QuantizeRow(dst_type, row.data(), dst + r * dst_row, row_len)) failed = true;
    }
  });
  if (failed) return Unimplemented(fmt::format("quantizing to {} is not supported", DTypeName(dst_type)));
  return Status::Ok();
}

Status ConvertRows(DType src_type, const uint8_t* src, DType dst_type, uint8_t* dst,
                   int64_t row_len, int64_t n_rows, int threads) {
  int64_t src_row = RowBytes(src_type, row_len);
  int64_t dst_row = RowBytes(dst_type, row_len);
  if (src_row < 0 || dst_row < 0) {
    return InvalidArgument(fmt::format("row length {} does not fit {} -> {}", row_len,
                                       DTypeName(src_type), DTypeName(dst_type)));
  }
  if (src_type == dst_type) {
    std::memcpy(dst, src, static_cast<size_t>(src_row * n_rows));
    return Status::Ok();
  }
  std::atomic<bool> bad_src{false};
  Status s = QuantizeGeneratedRows(
      [&](int64_t r, float* out) {
        if (!DequantizeRow(src_type, src + r * src_row, out, row_len)) bad_src = true;
      },
      dst_type, dst, row_len, n_rows, threads);
  if (bad_src) {
    return Unimplemented(fmt::format("converting from {} is not supported", DTypeName(src_type)));
  }
  return s;
}

namespace {

// The model facts a mixture's rules read, from a file's metadata and tensor names.
MixModel MixModelOf(const GgufFile& f) {
  MixModel m;
  const std::string arch = f.GetString("general.architecture", "");
  m.n_layer = f.GetI64(arch + ".block_count", 0);
  const int64_t heads = f.GetI64(arch + ".attention.head_count", 1);
  const int64_t kv_heads = f.GetI64(arch + ".attention.head_count_kv", heads);
  m.n_gqa = kv_heads > 0 ? heads / kv_heads : 1;
  m.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  return m;
}

}  // namespace

Status QuantizeFile(const std::string& in, const std::string& out, const QuantizeOptions& opts) {
  if (!IsQuantizeTarget(opts.type)) {
    return InvalidArgument(fmt::format("unsupported target type {} (supported: {})",
                                       DTypeName(opts.type), QuantizeTargetNames()));
  }
  const QuantScheme scheme{opts.type, opts.mix};
  PC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> src, GgufFile::Open(in));
  const MixModel model = MixModelOf(*src);
  GgufWriter w;
  for (const auto& [key, value] : src->metadata()) w.SetValue(key, value);
  if (src->Has("general.alignment")) w.SetAlignment(static_cast<uint32_t>(src->alignment()));
  w.SetU32("general.file_type", LlamaFileType(scheme));
  if (IsQuantized(opts.type)) w.SetU32("general.quantization_version", 2);

  const int threads = ResolveThreads(opts.threads);
  const size_t n = src->tensors().size();
  std::vector<DType> chosen(n);
  for (size_t i = 0; i < n; ++i) {
    const GgufTensor& t = src->tensors()[i];
    std::string warning;
    chosen[i] = ChooseTensorType(t.name, t.dims, scheme, model, &warning);
    if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
    PC_RETURN_IF_ERROR(w.AddTensor(
        t.name, t.dims.empty() ? std::vector<int64_t>{1} : t.dims, chosen[i],
        [&t, dst = chosen[i], threads](uint8_t* out_data, uint64_t) {
          return ConvertRows(t.dtype, t.data, dst, out_data, t.row_len(), t.n_rows(), threads);
        }));
  }
  uint64_t in_bytes = 0, out_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const GgufTensor& t = src->tensors()[i];
    in_bytes += t.n_bytes;
    out_bytes += static_cast<uint64_t>(RowBytes(chosen[i], t.row_len())) * t.n_rows();
  }
  GgufWriter::Progress progress;
  if (opts.progress) {
    progress = [&](size_t i, size_t count, const std::string& name) {
      const GgufTensor& t = src->tensors()[i];
      std::fprintf(stderr, "[%4zu/%zu] %-32s %-5s -> %-5s %s\n", i + 1, count, name.c_str(),
                   DTypeName(t.dtype), DTypeName(chosen[i]), t.ShapeString().c_str());
    };
  }
  PC_RETURN_IF_ERROR(w.Write(out, progress));
  if (opts.progress) {
    std::fprintf(stderr, "quantized %zu tensors: %.1f MiB -> %.1f MiB (%s, %d threads)\n", n,
                 in_bytes / 1048576.0, out_bytes / 1048576.0, QuantSchemeName(scheme).c_str(),
                 threads);
  }
  return Status::Ok();
}

}  // namespace polychip::model
