// A model with tied embeddings holds its token table once. On the cpu plugin, whose upload
// repacks the output matrix into its private layout, EMBEDDING reads that layout (ABI 1.2), so
// the device memory the weights take stays within 1.1x the file's tensor bytes; the table is
// most of this model's file, so a second copy would make it ~2x. The shared table must still
// gather exactly the file's rows. On a plugin that does not repack (emu, the template) one GGUF
// copy serves both ops. Runs on every backend plugin the build produced.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/model_config.h"
#include "model/model_loader.h"
#include "model/synth.h"
#include "runtime/memory_pool.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"
#include "test_models.h"

namespace polychip::model {
namespace {

// The "tiny" shape with tied embeddings, in Q4_0 (a packed type of the cpu plugin).
const std::string& ModelPath() {
  static const std::string path = [] {
    SynthOptions o;
    o.config = *ShapePreset("tiny");
    o.config.tied_output = true;
    o.type = DType::kQ4_0;
    o.seed = 5;
    return testing::SynthesizeTestModel("tied_q4_0", o);
  }();
  return path;
}

double AllocatedBytes(const runtime::Device& device) {
  for (const auto& [name, value] : device.backend()->ReadCounters(device)) {
    if (name == "allocated_bytes") return value;
  }
  return -1;
}

class TiedWeightsTest
    : public testing::ModelFileTest<::testing::TestWithParam<std::string>> {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(OpenModel(ModelPath()));
    ASSERT_TRUE(config_.tied_output);
    device_ = testing::OpenTestDevice(GetParam());
    ASSERT_NE(device_, nullptr);
  }

  std::shared_ptr<runtime::Device> device_;
};

TEST_P(TiedWeightsTest, TableHeldOnceAndGathersTheFileRows) {
  uint64_t tensor_bytes = 0;
  for (const GgufTensor& t : file_->tensors()) tensor_bytes += t.n_bytes;
  const double before = AllocatedBytes(*device_);
  runtime::MemoryPoolOptions po;
  po.arena_bytes = 1 << 20;  // norms and test buffers; subtracted below
  auto pool = std::make_shared<runtime::MemoryPool>(device_, po);
  auto stream = device_->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto loaded = LoadWeights(*file_, config_, device_, pool, **stream);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const ModelWeights& w = **loaded;

  EXPECT_EQ(w.embd, w.output.data);
  EXPECT_EQ(w.embd_layout, w.output.layout);
  EXPECT_LT(double(w.device_bytes), 1.1 * tensor_bytes);
  if (before >= 0) {  // the plugin counts what it holds (cpu does)
    const double weights = AllocatedBytes(*device_) - before - double(pool->reserved_bytes());
    EXPECT_LT(weights, 1.1 * tensor_bytes) << "the plugin holds " << weights << " bytes for "
                                           << tensor_bytes << " bytes of tensors";
  }
  if (GetParam() == "cpu") EXPECT_NE(w.embd_layout, runtime::kLayoutGguf);  // repacked

  // Rows from every part of the table, the last one included, through the runtime's EMBEDDING.
  const GgufTensor* table = file_->FindTensor("token_embd.weight");
  ASSERT_NE(table, nullptr);
  const int64_t n_embd = config_.n_embd, n_vocab = config_.n_vocab;
  const std::vector<int32_t> ids = {0, 1, 15, 16, 12345, static_cast<int32_t>(n_vocab - 1)};
  const int64_t n = static_cast<int64_t>(ids.size());
  auto d_ids = PoolBuffer::Allocate(pool, n * 4);
  auto d_out = PoolBuffer::Allocate(pool, n * n_embd * 4);
  ASSERT_TRUE(d_ids.ok() && d_out.ok());
  ASSERT_TRUE((*stream)->CopyH2D(d_ids->ptr(), ids.data(), n * 4).ok());
  runtime::EmbeddingArgs e;
  e.table = w.embd;
  e.table_dtype = w.embd_dtype;
  e.table_layout = w.embd_layout;
  e.n_rows = n_vocab;
  e.row_len = n_embd;
  e.ids = d_ids->ptr();
  e.n_ids = n;
  e.out = d_out->ptr();
  ASSERT_TRUE(runtime::Launch(**stream, e).ok());
  std::vector<float> got(n * n_embd), want(n_embd);
  ASSERT_TRUE((*stream)->CopyD2H(got.data(), d_out->ptr(), got.size() * 4).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  const int64_t row_bytes = RowBytes(table->dtype, n_embd);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(DequantizeRow(table->dtype, table->data + ids[i] * row_bytes, want.data(), n_embd));
    for (int64_t j = 0; j < n_embd; ++j) {
      ASSERT_EQ(got[i * n_embd + j], want[j]) << "token " << ids[i] << " element " << j;
    }
  }
}

// Every backend plugin the build produced (tests/CMakeLists.txt, polychip_test_every_backend).
const std::vector<std::string> kBackends = {POLYCHIP_BACKEND_PLUGINS};
INSTANTIATE_TEST_SUITE_P(Plugins, TiedWeightsTest, ::testing::ValuesIn(kBackends),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TiedWeightsTest);  // a tree without backends

}  // namespace
}  // namespace polychip::model
