// GGUF writer: collects metadata and tensor descriptions, then streams a v3 file to disk one
// tensor at a time (each tensor's bytes are produced on demand by a callback, so a multi-GB
// model is never held in memory twice).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "runtime/dtype.h"
#include "util/status.h"

namespace polychip::model {

class GgufWriter {
 public:
  // Fills `dst` (exactly the tensor's byte size) with the tensor's data.
  using Producer = std::function<Status(uint8_t* dst, uint64_t n_bytes)>;
  // Called after each tensor is written: (index, count, name).
  using Progress = std::function<void(size_t, size_t, const std::string&)>;

  // ---- metadata (setting a key again replaces its value, keeping its position) ----
  void SetU8(std::string_view key, uint8_t v);
  void SetI8(std::string_view key, int8_t v);
  void SetU16(std::string_view key, uint16_t v);
  void SetI16(std::string_view key, int16_t v);
  void SetU32(std::string_view key, uint32_t v);
  void SetI32(std::string_view key, int32_t v);
  void SetU64(std::string_view key, uint64_t v);
  void SetI64(std::string_view key, int64_t v);
  void SetF32(std::string_view key, float v);
  void SetF64(std::string_view key, double v);
  void SetBool(std::string_view key, bool v);
  void SetString(std::string_view key, std::string_view v);
  void SetStringArray(std::string_view key, const std::vector<std::string>& v);
  void SetI32Array(std::string_view key, const std::vector<int32_t>& v);
  void SetI64Array(std::string_view key, const std::vector<int64_t>& v);
  void SetF32Array(std::string_view key, const std::vector<float>& v);
  // Any numeric array given as packed little-endian elements of `elem_type`.
  void SetRawArray(std::string_view key, GgufType elem_type, const void* data, uint64_t count);
  // Copies a value read by GgufFile (any type, including nested arrays).
  void SetValue(std::string_view key, const GgufValue& v);
  void Remove(std::string_view key);
  bool Has(std::string_view key) const;

  // general.alignment, if set, must be a power of two (default 32).
  void SetAlignment(uint32_t alignment);

  // ---- tensors ----
  // dims as in GgufTensor (dims[0] innermost). Fails on a duplicate name or a row length that
  // is not a multiple of the dtype's block.
  Status AddTensor(std::string name, std::vector<int64_t> dims, DType dtype, Producer producer);
  // Convenience: data already in memory (must outlive Write).
  Status AddTensor(std::string name, std::vector<int64_t> dims, DType dtype, const void* data);
  size_t tensor_count() const { return tensors_.size(); }

  // Writes `path` (via a temporary file renamed into place on success).
  Status Write(const std::string& path, const Progress& progress = nullptr) const;

 private:
  struct Kv {
    std::string key;
    std::string encoded;  // type tag + value, exactly as in the file
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    DType dtype;
    uint64_t n_bytes;
    Producer producer;
  };
  void Put(std::string_view key, std::string encoded);

  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace polychip::model
