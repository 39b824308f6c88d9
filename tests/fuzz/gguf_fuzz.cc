// libFuzzer target: the GGUF reader on arbitrary bytes, then everything the CLI derives from a
// file before loading weights (every metadata value through the typed accessors, the model
// configuration and its tensor checks, the tokenizer). Nothing may crash, hang or allocate
// beyond what the file's size justifies.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

using polychip::model::GgufFile;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = GgufFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  for (const auto& [key, value] : f.metadata()) {
    (void)f.GetString(key);
    (void)f.GetU32(key);
    (void)f.GetI64(key);
    (void)f.GetF32(key);
    (void)f.GetBool(key);
    (void)f.GetStringArray(key);
    (void)f.GetIntArray(key);
    (void)f.GetI32Array(key);
    (void)f.GetF32Array(key);
  }
  for (const auto& t : f.tensors()) {
    // A tensor's bytes lie inside the file (the reader promises it).
    const uint64_t size_left = f.file_size() - f.data_offset();
    if (f.data_offset() > f.file_size() || t.offset > size_left ||
        t.n_bytes > size_left - t.offset) {
      __builtin_trap();
    }
    (void)t.ShapeString();
  }
  (void)polychip::model::ModelConfig::FromGguf(f);
  (void)polychip::model::Tokenizer::FromGguf(f);
  return 0;
}
