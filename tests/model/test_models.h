// What the model tests share: the qwen2 vocabulary from the llama.cpp oracle cache, models
// synthesized once per build directory, a device of an in-tree plugin, and a fixture base that
// opens a model file and reads its configuration.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/synth.h"
#include "runtime/plugin_loader.h"

namespace polychip::model::testing {

inline std::string VocabPath() {
  const char* d = std::getenv("POLYCHIP_LLAMA_CPP_DIR");
  const char* home = std::getenv("HOME");
  const std::string dir =
      d && *d ? d : std::string(home ? home : "") + "/.cache/polychip/llama.cpp";
  return dir + "/models/ggml-vocab-qwen2.gguf";
}

// Synthesizes `o` (its vocabulary: VocabPath()) into test-models/<name>.gguf; the path, or
// "error: ..." when synthesis failed.
inline std::string SynthesizeTestModel(const std::string& name, SynthOptions o) {
  const std::string out = std::string(POLYCHIP_BUILD_DIR) + "/test-models/" + name + ".gguf";
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  o.vocab_path = VocabPath();
  o.progress = false;
  const Status s = SynthesizeModel(o, out);
  return s.ok() ? out : std::string("error: " + s.ToString());
}

// Greedy-run helper of the engine tests over real runners: submits every input at once, runs
// `engine` until idle and returns each request's tokens (a failure for a request that errs).
inline std::vector<std::vector<int32_t>> GenerateAll(
    engine::Engine& engine, const std::vector<engine::GenerateInput>& inputs) {
  std::vector<std::shared_ptr<engine::RequestStream>> streams;
  for (const engine::GenerateInput& in : inputs) {
    auto s = engine.Submit(in);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return {};
    streams.push_back(*s);
  }
  engine.RunUntilIdle(100000);
  std::vector<std::vector<int32_t>> out;
  for (auto& s : streams) {
    out.emplace_back();
    for (auto& ev : s->Pop(std::chrono::milliseconds(0))) {
      out.back().insert(out.back().end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finished) EXPECT_TRUE(ev.error.ok()) << ev.error.ToString();
    }
  }
  return out;
}

// Device 0 of the in-tree backend plugin `backend`, or nullptr after adding a failure.
inline std::shared_ptr<runtime::Device> OpenTestDevice(const std::string& backend) {
  auto b = runtime::LoadBackendFromPath(std::string(POLYCHIP_BUILD_DIR) +
                                        "/lib/polychip/libpolychip_backend_" + backend + ".so");
  if (!b.ok()) {
    ADD_FAILURE() << b.status().ToString();
    return nullptr;
  }
  auto d = (*b)->OpenDevice(0);
  if (!d.ok()) {
    ADD_FAILURE() << d.status().ToString();
    return nullptr;
  }
  return *d;
}

// Opens `model_path` (from SynthesizeTestModel) into file_ and config_.
template <typename Base>
class ModelFileTest : public Base {
 protected:
  void OpenModel(const std::string& model_path) {
    if (!std::filesystem::exists(VocabPath())) {
      GTEST_FAIL() << VocabPath() << " missing: run tests/setup/fetch-llama-cpp.sh";
    }
    ASSERT_EQ(model_path.rfind("error", 0), std::string::npos) << model_path;
    auto f = GgufFile::Open(model_path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    file_ = std::move(*f);
    auto c = ModelConfig::FromGguf(*file_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    config_ = *c;
  }

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
};

}  // namespace polychip::model::testing
