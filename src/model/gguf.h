// GGUF reader: memory-maps a model file (v2 or v3, little-endian) and exposes its metadata and
// tensors without copying tensor data. Every read is bounds-checked: a corrupt or truncated file
// yields a one-line Status, never a crash.
//
// Lifetime: string views, array views and tensor data pointers point into the mapping and are
// valid as long as the GgufFile lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* GgufTypeName(GgufType type);  // "u32", "string", "array", ...
bool IsGgufIntegerType(GgufType type);    // u8..i64 and bool
// Size in bytes of a scalar of this type (0 for string and array).
size_t GgufScalarSize(GgufType type);

// One metadata value. Scalars are widened into `i`/`u`/`f` (all three are filled consistently
// for numbers, so any accessor may read them); strings are views; arrays keep their element
// type and either a raw view of packed little-endian scalars, a list of string views, or (for
// arrays of arrays) a list of nested values.
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string_view str;  // kString

  // kArray only:
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;             // numeric/bool elements, count * GgufScalarSize
  std::vector<std::string_view> strings;    // elem_type == kString
  std::vector<GgufValue> items;             // elem_type == kArray (nested arrays)

  // Element k of a numeric array, widened (no bounds check beyond a PC_CHECK).
  int64_t IntAt(uint64_t k) const;
  double FloatAt(uint64_t k) const;
};

// One tensor. dims[0] is the innermost (contiguous) dimension, as in ggml: a weight matrix
// [n_out, n_in] in math notation has dims {n_in, n_out}, i.e. rows of length dims[0].
struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;
  DType dtype = DType::kF32;
  uint64_t offset = 0;   // relative to the start of the data section
  uint64_t n_bytes = 0;  // RowBytes(dtype, dims[0]) * rows
  int64_t n_elements = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t row_len() const { return dims.empty() ? 1 : dims[0]; }
  int64_t n_rows() const { return row_len() == 0 ? 0 : n_elements / row_len(); }
  std::string ShapeString() const;  // "[896, 151936]"
};

class GgufFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE) and parses it.
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses an in-memory image (owned by the result); used by tests and tools.
  static StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string bytes, std::string name = "<memory>");

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  // ---- metadata ----
  // Key/value pairs in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  const GgufValue* Find(std::string_view key) const;

  // Typed accessors. Integers coerce among integer types (range-checked), floats accept any
  // number. The StatusOr forms fail with NotFound / InvalidArgument; the defaulted forms return
  // `def` when the key is absent (and also when it has an incompatible type).
  StatusOr<std::string> GetString(std::string_view key) const;
  std::string GetString(std::string_view key, std::string_view def) const;
  StatusOr<uint32_t> GetU32(std::string_view key) const;
  uint32_t GetU32(std::string_view key, uint32_t def) const;
  StatusOr<int64_t> GetI64(std::string_view key) const;
  int64_t GetI64(std::string_view key, int64_t def) const;
  StatusOr<float> GetF32(std::string_view key) const;
  float GetF32(std::string_view key, float def) const;
  StatusOr<bool> GetBool(std::string_view key) const;
  bool GetBool(std::string_view key, bool def) const;

  // Arrays (copied out; for large vocabularies GetStringArrayView avoids the copy).
  StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  StatusOr<const std::vector<std::string_view>*> GetStringArrayView(std::string_view key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  StatusOr<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  StatusOr<std::vector<float>> GetF32Array(std::string_view key) const;

  // ---- tensors ----
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;

  // Drop pages of the mapping from this process's resident memory once what they hold has
  // been copied: a tensor's data once a device holds its copy, the metadata section once the
  // configuration and the tokenizer are built. Without this the file would stay resident next
  // to the copies. Nothing becomes invalid: a later read faults the bytes back in (from the
  // page cache, else the file). No-ops for an in-memory image.
  void ReleasePages(const GgufTensor& tensor) const;
  void ReleaseDataPages() const;  // every tensor's
  void ReleaseMetadataPages() const;

 private:
  GgufFile() = default;
  Status Parse();
  void ReleaseRange(const uint8_t* begin, uint64_t bytes) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;  // munmap on destruction when non-null
  std::string owned_;    // FromBytes image

  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace polychip::model
