#include "model/quantize.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
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
                              DType::kQ6_K};

// The type llama-quantize falls back to when the rows do not fit a K-quant super-block.
DType Fallback(DType t) {
  switch (t) {
    case DType::kQ2_K: case DType::kQ3_K: return DType::kQ4_0;
    case DType::kQ4_K: return DType::kQ5_0;
    case DType::kQ5_K: return DType::kQ5_1;
    case DType::kQ6_K: return DType::kQ8_0;
    default: return DType::kF16;
  }
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
  size_t real_dims = dims.size();
  while (real_dims > 1 && dims[real_dims - 1] == 1) --real_dims;  // [n, 1] is still a vector
  if (real_dims <= 1 || name == "rope_freqs.weight") return DType::kF32;
  int64_t row = dims[0];
  DType t = target;
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
    case DType::kBF16: return 32;
    default: return 0;
  }
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

Status QuantizeFile(const std::string& in, const std::string& out, const QuantizeOptions& opts) {
  if (!IsQuantizeTarget(opts.type)) {
    return InvalidArgument(fmt::format("unsupported target type {} (supported: {})",
                                       DTypeName(opts.type), QuantizeTargetNames()));
  }
  PC_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> src, GgufFile::Open(in));
  GgufWriter w;
  for (const auto& [key, value] : src->metadata()) w.SetValue(key, value);
  if (src->Has("general.alignment")) w.SetAlignment(static_cast<uint32_t>(src->alignment()));
  w.SetU32("general.file_type", LlamaFileType(opts.type));
  if (IsQuantized(opts.type)) w.SetU32("general.quantization_version", 2);

  const int threads = ResolveThreads(opts.threads);
  const size_t n = src->tensors().size();
  std::vector<DType> chosen(n);
  for (size_t i = 0; i < n; ++i) {
    const GgufTensor& t = src->tensors()[i];
    std::string warning;
    chosen[i] = ChooseTensorType(t.name, t.dims, opts.type, &warning);
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
                 in_bytes / 1048576.0, out_bytes / 1048576.0, DTypeName(opts.type), threads);
  }
  return Status::Ok();
}

}  // namespace polychip::model
