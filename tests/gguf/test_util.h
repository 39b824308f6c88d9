// Helpers shared by the GGUF tests: temp files, the vocabulary folder, byte patching.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace polychip::model::testing {

namespace fs = std::filesystem;

inline fs::path TempDir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() /
                 ("polychip_gguf_test_" + std::to_string(::getpid()) + "_" +
                  std::to_string(std::random_device{}()));
    fs::create_directories(d);
    // Synthesized models are large: remove them when the test process ends.
    static struct Cleanup {
      fs::path dir;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(dir, ec);
      }
    } cleanup{d};
    return d;
  }();
  return dir;
}

inline std::string ReadAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void WriteAll(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void Patch(std::string& bytes, size_t offset, T v) {
  ASSERT_LE(offset + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + offset, &v, sizeof(T));
}

// The llama.cpp models folder with the vocabulary GGUFs (same convention as the tokenizer tests).
inline fs::path VocabDir() {
  const char* env = std::getenv("POLYCHIP_LLAMA_CPP_DIR");
  return fs::path(env && *env ? env : "/root/.cache/polychip/llama.cpp") / "models";
}

#define POLYCHIP_REQUIRE_VOCAB(path)                                                        \
  if (!std::filesystem::exists(path)) {                                                     \
    GTEST_SKIP() << path << " not found: run tests/setup/fetch-llama-cpp.sh or set "         \
                 << "POLYCHIP_LLAMA_CPP_DIR";                                               \
  }

}  // namespace polychip::model::testing
