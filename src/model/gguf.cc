#include "model/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

namespace polychip::model {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;                  // as ggml's GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;            // nested arrays deeper than this are rejected

// Bounds-checked little-endian reader over the mapped image. Every failure names the byte
// offset and what was being read, so a truncated download is easy to tell from a corrupt one.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size) : base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  Status Need(uint64_t n, std::string_view what) const {
    if (n > remaining()) {
      return InvalidArgument(fmt::format("truncated file: needs {} bytes at offset {} for {}, "
                                         "only {} left",
                                         n, pos_, what, remaining()));
    }
    return Status::Ok();
  }
  template <typename T>
  Status Read(T* out, std::string_view what) {
    PC_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string_view* out, std::string_view what) {
    uint64_t len = 0;
    PC_RETURN_IF_ERROR(Read(&len, what));
    if (len > remaining()) {
      return InvalidArgument(fmt::format("string length {} at offset {} ({}) exceeds the {} bytes "
                                         "left in the file",
                                         len, pos_ - 8, what, remaining()));
    }
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  const uint8_t* Skip(uint64_t n) {  // caller has checked Need(n)
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool IsValidType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// The smallest encoding of one array element of this type, to reject absurd counts early.
uint64_t MinEncodedSize(GgufType t) {
  if (t == GgufType::kString) return 8;
  if (t == GgufType::kArray) return 12;
  return GgufScalarSize(t);
}

void SetScalar(const uint8_t* p, GgufType t, GgufValue* v) {
  auto load = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (t) {
    case GgufType::kU8: v->u = load(uint8_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI8: v->i = load(int8_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU16: v->u = load(uint16_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI16: v->i = load(int16_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU32: v->u = load(uint32_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI32: v->i = load(int32_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kU64: v->u = load(uint64_t{}); v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kI64: v->i = load(int64_t{}); v->u = static_cast<uint64_t>(v->i); break;
    case GgufType::kBool: v->u = load(uint8_t{}) != 0; v->i = static_cast<int64_t>(v->u); break;
    case GgufType::kF32: v->f = load(float{}); break;
    case GgufType::kF64: v->f = load(double{}); break;
    default: return;
  }
  if (t != GgufType::kF32 && t != GgufType::kF64) {
    v->f = t == GgufType::kU64 ? static_cast<double>(v->u) : static_cast<double>(v->i);
  } else {
    // Saturating casts so later integer coercion of a float never reaches UB.
    v->i = std::isfinite(v->f) && std::fabs(v->f) < 9e18 ? static_cast<int64_t>(v->f) : 0;
    v->u = static_cast<uint64_t>(v->i);
  }
}

// An array body (as the spec's gguf_array_t): element type, count, elements. Elements of an
// array of arrays are themselves array bodies, without a further type tag.
Status ReadArrayBody(Cursor& c, GgufValue* v, int depth, std::string_view key) {
  v->type = GgufType::kArray;
  if (depth >= kMaxArrayDepth) {
    return InvalidArgument(fmt::format("metadata '{}': arrays nested deeper than {}", key,
                                       kMaxArrayDepth));
  }
  uint32_t et = 0;
  PC_RETURN_IF_ERROR(c.Read(&et, key));
  if (!IsValidType(et)) {
    return InvalidArgument(fmt::format("metadata '{}': unknown array element type {}", key, et));
  }
  v->elem_type = static_cast<GgufType>(et);
  PC_RETURN_IF_ERROR(c.Read(&v->count, key));
  uint64_t min_size = MinEncodedSize(v->elem_type);
  if (v->count > c.remaining() / min_size) {
    return InvalidArgument(fmt::format("metadata '{}': array length {} exceeds what the remaining "
                                       "{} bytes of the file could hold",
                                       key, v->count, c.remaining()));
  }
  if (v->elem_type == GgufType::kString) {
    v->strings.resize(v->count);
    for (auto& s : v->strings) PC_RETURN_IF_ERROR(c.ReadString(&s, key));
  } else if (v->elem_type == GgufType::kArray) {
    v->items.resize(v->count);
    for (auto& item : v->items) PC_RETURN_IF_ERROR(ReadArrayBody(c, &item, depth + 1, key));
  } else {
    uint64_t bytes = v->count * min_size;
    PC_RETURN_IF_ERROR(c.Need(bytes, key));
    v->raw = c.Skip(bytes);
  }
  return Status::Ok();
}

Status ReadValue(Cursor& c, GgufType type, GgufValue* v, std::string_view key) {
  v->type = type;
  if (type == GgufType::kString) return c.ReadString(&v->str, key);
  if (type == GgufType::kArray) return ReadArrayBody(c, v, 0, key);
  size_t n = GgufScalarSize(type);
  PC_RETURN_IF_ERROR(c.Need(n, key));
  SetScalar(c.Skip(n), type, v);
  return Status::Ok();
}

std::string Quote(std::string_view s) { return fmt::format("'{}'", s); }

}  // namespace

const char* GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "?";
}

bool IsGgufIntegerType(GgufType t) {
  return t != GgufType::kF32 && t != GgufType::kF64 && t != GgufType::kString &&
         t != GgufType::kArray && IsValidType(static_cast<uint32_t>(t));
}

size_t GgufScalarSize(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

int64_t GgufValue::IntAt(uint64_t k) const {
  PC_CHECK(type == GgufType::kArray && raw != nullptr && k < count);
  GgufValue e;
  SetScalar(raw + k * GgufScalarSize(elem_type), elem_type, &e);
  return e.i;
}

double GgufValue::FloatAt(uint64_t k) const {
  PC_CHECK(type == GgufType::kArray && raw != nullptr && k < count);
  GgufValue e;
  SetScalar(raw + k * GgufScalarSize(elem_type), elem_type, &e);
  return e.f;
}

std::string GgufTensor::ShapeString() const {
  std::string s = "[";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + "]";
}

// ---- opening ----

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(fmt::format("{}: not a regular file", path));
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return Internal(fmt::format("{}: mmap failed: {}", path, std::strerror(err)));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping keeps the file alive
  Status s = f->Parse();
  if (!s.ok()) return Status(s.code(), path + ": " + s.message());
  return f;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string bytes, std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = reinterpret_cast<const uint8_t*>(f->owned_.data());
  f->size_ = f->owned_.size();
  Status s = f->Parse();
  if (!s.ok()) return Status(s.code(), f->path_ + ": " + s.message());
  return f;
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

void GgufFile::ReleasePages(const GgufTensor& tensor) const {
  ReleaseRange(tensor.data, tensor.n_bytes);
}

void GgufFile::ReleaseDataPages() const {
  if (data_offset_ < size_) ReleaseRange(base_ + data_offset_, size_ - data_offset_);
}

void GgufFile::ReleaseMetadataPages() const { ReleaseRange(base_, data_offset_); }

void GgufFile::ReleaseRange(const uint8_t* begin, uint64_t bytes) const {
  if (map_ == nullptr || bytes == 0) return;
  // Whole pages, rounded outward: a page shared with a neighbouring tensor or the metadata is
  // dropped too, which costs at most a refault.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t map_begin = reinterpret_cast<uintptr_t>(map_);
  const uintptr_t first = std::max(map_begin, reinterpret_cast<uintptr_t>(begin) / page * page);
  const uintptr_t end = std::min(map_begin + size_, reinterpret_cast<uintptr_t>(begin) + bytes);
  if (end <= first) return;
  // The mapping is private and read-only, so its pages were never written: MADV_DONTNEED only
  // unmaps them, and the file's bytes come back on the next access.
  (void)::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
}

Status GgufFile::Parse() {
  // Header: magic, version, tensor count, kv count (24 bytes in v2/v3).
  if (size_ < 8) {
    return InvalidArgument(fmt::format("file too small ({} bytes) to be a GGUF file", size_));
  }
  Cursor c(base_, size_);
  uint32_t magic = 0;
  PC_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    std::string shown;
    for (int k = 0; k < 4; ++k) {
      char ch = static_cast<char>(base_[k]);
      shown += (ch >= 32 && ch < 127) ? std::string(1, ch) : fmt::format("\\x{:02x}", base_[k]);
    }
    return InvalidArgument(fmt::format("not a GGUF file (magic \"{}\", expected \"GGUF\")", shown));
  }
  PC_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ == 1) {
    return Unimplemented("unsupported GGUF version 1 (supported: 2, 3); re-convert the model");
  }
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffff) == 0) {
      return Unimplemented(fmt::format("big-endian GGUF files are not supported (version word "
                                       "0x{:08x})",
                                       version_));
    }
    return Unimplemented(fmt::format("unsupported GGUF version {} (supported: 2, 3)", version_));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  PC_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  PC_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  // A tensor info takes at least 24 bytes (empty name, 0 dims), a key/value at least 13.
  if (n_tensors > c.remaining() / 24) {
    return InvalidArgument(fmt::format("absurd tensor count {}: a {}-byte file cannot hold it "
                                       "(truncated or corrupt)",
                                       n_tensors, size_));
  }
  if (n_kv > c.remaining() / 13) {
    return InvalidArgument(fmt::format("absurd metadata count {}: a {}-byte file cannot hold it "
                                       "(truncated or corrupt)",
                                       n_kv, size_));
  }

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string_view key;
    PC_RETURN_IF_ERROR(c.ReadString(&key, fmt::format("metadata key #{}", k)));
    uint32_t t = 0;
    PC_RETURN_IF_ERROR(c.Read(&t, key));
    if (!IsValidType(t)) {
      return InvalidArgument(fmt::format("metadata {}: unknown value type {}", Quote(key), t));
    }
    GgufValue v;
    PC_RETURN_IF_ERROR(ReadValue(c, static_cast<GgufType>(t), &v, key));
    kv_.emplace_back(std::string(key), std::move(v));
  }
  // Index after kv_ stops growing: the views point into kv_'s strings.
  for (size_t k = 0; k < kv_.size(); ++k) {
    if (!kv_index_.emplace(kv_[k].first, k).second) {
      return InvalidArgument(fmt::format("duplicate metadata key {}", Quote(kv_[k].first)));
    }
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (!IsGgufIntegerType(a->type) || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
      return InvalidArgument("general.alignment must be a power of two integer");
    }
    alignment_ = a->u;
  }

  tensors_.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor& t = tensors_[k];
    std::string what = fmt::format("tensor info #{}", k);
    std::string_view name;
    PC_RETURN_IF_ERROR(c.ReadString(&name, what));
    t.name = std::string(name);
    uint32_t n_dims = 0;
    PC_RETURN_IF_ERROR(c.Read(&n_dims, what));
    if (n_dims > kMaxDims) {
      return InvalidArgument(fmt::format("tensor {} has {} dimensions (at most {})", Quote(name),
                                         n_dims, kMaxDims));
    }
    t.dims.resize(n_dims);
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      PC_RETURN_IF_ERROR(c.Read(&dim, what));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && static_cast<uint64_t>(n_el) > static_cast<uint64_t>(
                                                          std::numeric_limits<int64_t>::max()) /
                                                          dim)) {
        return InvalidArgument(fmt::format("tensor {}: dimensions overflow", Quote(name)));
      }
      t.dims[d] = static_cast<int64_t>(dim);
      n_el *= t.dims[d];
    }
    t.n_elements = n_el;
    int32_t type = 0;
    PC_RETURN_IF_ERROR(c.Read(&type, what));
    if (!IsKnownDType(type)) {
      return InvalidArgument(fmt::format("tensor {} has unknown or unsupported type {}",
                                         Quote(name), type));
    }
    t.dtype = static_cast<DType>(type);
    PC_RETURN_IF_ERROR(c.Read(&t.offset, what));
    // No type stores an element in less than 2 bits, so bigger tensors cannot fit (and this
    // keeps the byte-size arithmetic below far from overflow).
    uint64_t max_elems = size_ * 4 + 256;
    if (static_cast<uint64_t>(t.n_elements) > max_elems ||
        static_cast<uint64_t>(t.row_len()) > max_elems) {
      return InvalidArgument(fmt::format("tensor {} {} {} is larger than the file", Quote(name),
                                         t.ShapeString(), DTypeName(t.dtype)));
    }
    int64_t row_bytes = RowBytes(t.dtype, t.row_len());
    if (row_bytes < 0) {
      return InvalidArgument(fmt::format("tensor {}: row length {} is not a multiple of the {} "
                                         "block size {}",
                                         Quote(name), t.row_len(), DTypeName(t.dtype),
                                         BlockElems(t.dtype)));
    }
    int64_t rows = t.n_rows();
    t.n_bytes = static_cast<uint64_t>(row_bytes) * static_cast<uint64_t>(rows);
    if (t.offset % alignment_ != 0) {
      return InvalidArgument(fmt::format("tensor {}: offset {} is not a multiple of the alignment "
                                         "{}",
                                         Quote(name), t.offset, alignment_));
    }
  }
  for (size_t k = 0; k < tensors_.size(); ++k) {
    if (!tensor_index_.emplace(tensors_[k].name, k).second) {
      return InvalidArgument(fmt::format("duplicate tensor name {}", Quote(tensors_[k].name)));
    }
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t pos = c.pos();
  data_offset_ = (pos + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > size_) {
    return InvalidArgument(fmt::format("truncated file: tensor data would start at {} but the "
                                       "file has {} bytes",
                                       data_offset_, size_));
  }
  for (GgufTensor& t : tensors_) {
    uint64_t avail = size_ - data_offset_;
    if (t.offset > avail || t.n_bytes > avail - t.offset) {
      return InvalidArgument(fmt::format("tensor {} {} {} ends at byte {} beyond the end of the "
                                         "file ({} bytes): truncated?",
                                         Quote(t.name), t.ShapeString(), DTypeName(t.dtype),
                                         data_offset_ + t.offset + t.n_bytes, size_));
    }
    t.data = base_ + data_offset_ + t.offset;
  }
  return Status::Ok();
}

// ---- metadata accessors ----

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
Status Missing(std::string_view key) { return NotFound(fmt::format("metadata key '{}' not found", key)); }
Status WrongType(std::string_view key, const GgufValue& v, std::string_view want) {
  return InvalidArgument(fmt::format("metadata key '{}' is {}, expected {}", key,
                                     GgufTypeName(v.type), want));
}
// Integer value range check: true if v fits in [lo, hi].
bool IntInRange(const GgufValue& v, int64_t lo, uint64_t hi) {
  if (v.type == GgufType::kU64) return v.u <= hi && (lo <= 0 || v.u >= static_cast<uint64_t>(lo));
  if (v.i < lo) return false;
  return v.i < 0 || static_cast<uint64_t>(v.i) <= hi;
}
}  // namespace

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kString) return WrongType(key, *v, "string");
  return std::string(v->str);
}
std::string GgufFile::GetString(std::string_view key, std::string_view def) const {
  auto r = GetString(key);
  return r.ok() ? *r : std::string(def);
}

StatusOr<uint32_t> GgufFile::GetU32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsGgufIntegerType(v->type)) return WrongType(key, *v, "an integer");
  if (!IntInRange(*v, 0, std::numeric_limits<uint32_t>::max())) {
    return InvalidArgument(fmt::format("metadata key '{}' = {} is out of range for u32", key,
                                       v->type == GgufType::kU64 ? std::to_string(v->u)
                                                                 : std::to_string(v->i)));
  }
  return static_cast<uint32_t>(v->u);
}
uint32_t GgufFile::GetU32(std::string_view key, uint32_t def) const {
  auto r = GetU32(key);
  return r.ok() ? *r : def;
}

StatusOr<int64_t> GgufFile::GetI64(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsGgufIntegerType(v->type)) return WrongType(key, *v, "an integer");
  if (v->type == GgufType::kU64 && v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgument(fmt::format("metadata key '{}' = {} is out of range for i64", key, v->u));
  }
  return v->i;
}
int64_t GgufFile::GetI64(std::string_view key, int64_t def) const {
  auto r = GetI64(key);
  return r.ok() ? *r : def;
}

StatusOr<float> GgufFile::GetF32(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type == GgufType::kString || v->type == GgufType::kArray || v->type == GgufType::kBool) {
    return WrongType(key, *v, "a number");
  }
  return static_cast<float>(v->f);
}
float GgufFile::GetF32(std::string_view key, float def) const {
  auto r = GetF32(key);
  return r.ok() ? *r : def;
}

StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (!IsGgufIntegerType(v->type)) return WrongType(key, *v, "a bool");
  return v->u != 0;
}
bool GgufFile::GetBool(std::string_view key, bool def) const {
  auto r = GetBool(key);
  return r.ok() ? *r : def;
}

StatusOr<const std::vector<std::string_view>*> GgufFile::GetStringArrayView(
    std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
    return WrongType(key, *v, "an array of strings");
  }
  return &v->strings;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  PC_ASSIGN_OR_RETURN(const std::vector<std::string_view>* view, GetStringArrayView(key));
  return std::vector<std::string>(view->begin(), view->end());
}

StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kArray || !IsGgufIntegerType(v->elem_type)) {
    return WrongType(key, *v, "an array of integers");
  }
  std::vector<int64_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = v->IntAt(k);
  return out;
}

StatusOr<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  PC_ASSIGN_OR_RETURN(std::vector<int64_t> wide, GetIntArray(key));
  std::vector<int32_t> out(wide.size());
  for (size_t k = 0; k < wide.size(); ++k) {
    if (wide[k] < std::numeric_limits<int32_t>::min() ||
        wide[k] > std::numeric_limits<int32_t>::max()) {
      return InvalidArgument(fmt::format("metadata key '{}'[{}] = {} is out of range for i32", key,
                                         k, wide[k]));
    }
    out[k] = static_cast<int32_t>(wide[k]);
  }
  return out;
}

StatusOr<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key);
  if (v->type != GgufType::kArray || v->elem_type == GgufType::kString ||
      v->elem_type == GgufType::kArray) {
    return WrongType(key, *v, "an array of numbers");
  }
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) out[k] = static_cast<float>(v->FloatAt(k));
  return out;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace polychip::model
