#include "model/gguf_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>

#include <unistd.h>

namespace polychip::model {
namespace {

template <typename T>
void Append(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the host is little-endian (x86-64, aarch64)
  out.append(b, sizeof(T));
}
void AppendString(std::string& out, std::string_view s) {
  Append<uint64_t>(out, s.size());
  out.append(s);
}
std::string Tagged(GgufType t) {
  std::string s;
  Append<uint32_t>(s, static_cast<uint32_t>(t));
  return s;
}
template <typename T>
std::string Scalar(GgufType t, T v) {
  std::string s = Tagged(t);
  Append<T>(s, v);
  return s;
}

// The array body (element type, count, elements) of a value read by GgufFile.
void AppendArrayBody(std::string& out, const GgufValue& v) {
  Append<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  Append<uint64_t>(out, v.count);
  if (v.elem_type == GgufType::kString) {
    for (std::string_view s : v.strings) AppendString(out, s);
  } else if (v.elem_type == GgufType::kArray) {
    for (const GgufValue& item : v.items) AppendArrayBody(out, item);
  } else if (v.count > 0) {
    out.append(reinterpret_cast<const char*>(v.raw), v.count * GgufScalarSize(v.elem_type));
  }
}

// A FILE* that removes its temporary file unless committed. The temporary name is unique per
// process, so two processes writing the same model at once each rename a complete file.
class TempFile {
 public:
  explicit TempFile(std::string final_path)
      : final_(std::move(final_path)), tmp_(final_ + ".tmp." + std::to_string(::getpid())) {}
  ~TempFile() {
    if (f_) std::fclose(f_);
    if (!committed_) std::remove(tmp_.c_str());
  }
  Status Open() {
    f_ = std::fopen(tmp_.c_str(), "wb");
    if (!f_) return Unavailable(fmt::format("{}: cannot create: {}", tmp_, std::strerror(errno)));
    return Status::Ok();
  }
  Status Write(const void* p, size_t n) {
    if (n > 0 && std::fwrite(p, 1, n, f_) != n) {
      return Unavailable(fmt::format("{}: write failed: {}", tmp_, std::strerror(errno)));
    }
    return Status::Ok();
  }
  Status Commit() {
    int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return Unavailable(fmt::format("{}: close failed: {}", tmp_, std::strerror(errno)));
    if (std::rename(tmp_.c_str(), final_.c_str()) != 0) {
      return Unavailable(fmt::format("{}: rename failed: {}", final_, std::strerror(errno)));
    }
    committed_ = true;
    return Status::Ok();
  }

 private:
  std::string final_, tmp_;
  FILE* f_ = nullptr;
  bool committed_ = false;
};

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::Put(std::string_view key, std::string encoded) {
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.encoded = std::move(encoded);
      return;
    }
  }
  kv_.push_back({std::string(key), std::move(encoded)});
}

void GgufWriter::SetU8(std::string_view k, uint8_t v) { Put(k, Scalar(GgufType::kU8, v)); }
void GgufWriter::SetI8(std::string_view k, int8_t v) { Put(k, Scalar(GgufType::kI8, v)); }
void GgufWriter::SetU16(std::string_view k, uint16_t v) { Put(k, Scalar(GgufType::kU16, v)); }
void GgufWriter::SetI16(std::string_view k, int16_t v) { Put(k, Scalar(GgufType::kI16, v)); }
void GgufWriter::SetU32(std::string_view k, uint32_t v) { Put(k, Scalar(GgufType::kU32, v)); }
void GgufWriter::SetI32(std::string_view k, int32_t v) { Put(k, Scalar(GgufType::kI32, v)); }
void GgufWriter::SetU64(std::string_view k, uint64_t v) { Put(k, Scalar(GgufType::kU64, v)); }
void GgufWriter::SetI64(std::string_view k, int64_t v) { Put(k, Scalar(GgufType::kI64, v)); }
void GgufWriter::SetF32(std::string_view k, float v) { Put(k, Scalar(GgufType::kF32, v)); }
void GgufWriter::SetF64(std::string_view k, double v) { Put(k, Scalar(GgufType::kF64, v)); }
void GgufWriter::SetBool(std::string_view k, bool v) {
  Put(k, Scalar(GgufType::kBool, static_cast<uint8_t>(v ? 1 : 0)));
}
void GgufWriter::SetString(std::string_view k, std::string_view v) {
  std::string s = Tagged(GgufType::kString);
  AppendString(s, v);
  Put(k, std::move(s));
}
void GgufWriter::SetStringArray(std::string_view k, const std::vector<std::string>& v) {
  std::string s = Tagged(GgufType::kArray);
  Append<uint32_t>(s, static_cast<uint32_t>(GgufType::kString));
  Append<uint64_t>(s, v.size());
  for (const std::string& x : v) AppendString(s, x);
  Put(k, std::move(s));
}
void GgufWriter::SetRawArray(std::string_view k, GgufType elem_type, const void* data,
                             uint64_t count) {
  PC_CHECK(GgufScalarSize(elem_type) > 0);
  std::string s = Tagged(GgufType::kArray);
  Append<uint32_t>(s, static_cast<uint32_t>(elem_type));
  Append<uint64_t>(s, count);
  s.append(static_cast<const char*>(data), count * GgufScalarSize(elem_type));
  Put(k, std::move(s));
}
void GgufWriter::SetI32Array(std::string_view k, const std::vector<int32_t>& v) {
  SetRawArray(k, GgufType::kI32, v.data(), v.size());
}
void GgufWriter::SetI64Array(std::string_view k, const std::vector<int64_t>& v) {
  SetRawArray(k, GgufType::kI64, v.data(), v.size());
}
void GgufWriter::SetF32Array(std::string_view k, const std::vector<float>& v) {
  SetRawArray(k, GgufType::kF32, v.data(), v.size());
}

void GgufWriter::SetValue(std::string_view k, const GgufValue& v) {
  std::string s = Tagged(v.type);
  switch (v.type) {
    case GgufType::kString: AppendString(s, v.str); break;
    case GgufType::kArray: AppendArrayBody(s, v); break;
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: Append<uint8_t>(s, v.u); break;
    case GgufType::kU16: case GgufType::kI16: Append<uint16_t>(s, v.u); break;
    case GgufType::kU32: case GgufType::kI32: Append<uint32_t>(s, v.u); break;
    case GgufType::kU64: case GgufType::kI64: Append<uint64_t>(s, v.u); break;
    case GgufType::kF32: Append<float>(s, static_cast<float>(v.f)); break;
    case GgufType::kF64: Append<double>(s, v.f); break;
  }
  Put(k, std::move(s));
}

void GgufWriter::Remove(std::string_view key) {
  for (size_t i = 0; i < kv_.size(); ++i) {
    if (kv_[i].key == key) {
      kv_.erase(kv_.begin() + static_cast<ptrdiff_t>(i));
      return;
    }
  }
}

bool GgufWriter::Has(std::string_view key) const {
  for (const Kv& kv : kv_) {
    if (kv.key == key) return true;
  }
  return false;
}

void GgufWriter::SetAlignment(uint32_t alignment) {
  PC_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  alignment_ = alignment;
  SetU32("general.alignment", alignment);
}

Status GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, DType dtype,
                             Producer producer) {
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgument(fmt::format("duplicate tensor name '{}'", name));
  }
  if (dims.empty() || dims.size() > 4) {
    return InvalidArgument(fmt::format("tensor '{}': {} dimensions (1 to 4)", name, dims.size()));
  }
  int64_t rows = 1;
  for (size_t d = 1; d < dims.size(); ++d) rows *= dims[d];
  int64_t row_bytes = RowBytes(dtype, dims[0]);
  if (row_bytes < 0) {
    return InvalidArgument(fmt::format("tensor '{}': row length {} is not a multiple of the {} "
                                       "block size {}",
                                       name, dims[0], DTypeName(dtype), BlockElems(dtype)));
  }
  tensors_.push_back({std::move(name), std::move(dims), dtype,
                      static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(rows),
                      std::move(producer)});
  return Status::Ok();
}

Status GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, DType dtype,
                             const void* data) {
  return AddTensor(std::move(name), std::move(dims), dtype,
                   [data](uint8_t* dst, uint64_t n) {
                     std::memcpy(dst, data, n);
                     return Status::Ok();
                   });
}

Status GgufWriter::Write(const std::string& path, const Progress& progress) const {
  // Header, metadata and tensor infos are small: build them in memory.
  std::string head;
  head.append("GGUF", 4);
  Append<uint32_t>(head, 3);
  Append<uint64_t>(head, tensors_.size());
  Append<uint64_t>(head, kv_.size());
  for (const Kv& kv : kv_) {
    AppendString(head, kv.key);
    head += kv.encoded;
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    AppendString(head, t.name);
    Append<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Append<uint64_t>(head, static_cast<uint64_t>(d));
    Append<int32_t>(head, static_cast<int32_t>(t.dtype));
    Append<uint64_t>(head, offset);
    offset = AlignUp(offset + t.n_bytes, alignment_);
  }
  head.resize(AlignUp(head.size(), alignment_), '\0');

  TempFile out(path);
  PC_RETURN_IF_ERROR(out.Open());
  PC_RETURN_IF_ERROR(out.Write(head.data(), head.size()));
  // One tensor in memory at a time.
  std::vector<uint8_t> buf;
  const char zeros[256] = {};
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    buf.assign(t.n_bytes, 0);
    Status s = t.producer(buf.data(), t.n_bytes);
    if (!s.ok()) return Status(s.code(), fmt::format("tensor '{}': {}", t.name, s.message()));
    PC_RETURN_IF_ERROR(out.Write(buf.data(), buf.size()));
    uint64_t pad = AlignUp(t.n_bytes, alignment_) - t.n_bytes;
    for (uint64_t n = 0; n < pad; n += sizeof(zeros)) {
      PC_RETURN_IF_ERROR(out.Write(zeros, std::min<uint64_t>(sizeof(zeros), pad - n)));
    }
    if (progress) progress(i, tensors_.size(), t.name);
  }
  return out.Commit();
}

}  // namespace polychip::model
