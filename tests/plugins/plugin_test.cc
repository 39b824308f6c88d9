// Loads every backend plugin the build produced as the framework would (dlopen +
// pc_backend_get_api) and checks its table, memory round trips and a few ops against plain
// loops; then the properties the cpu and emu plugins promise, and emu's stream semantics.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "polychip/plugin/pc_backend.h"

namespace {

void LogToStderr(void*, pc_log_level_t, const char* source, const char* msg) {
  fprintf(stderr, "[%s] %s\n", source, msg);
}
pc_code_t KvSet(void*, const char*, const void*, size_t) { return PC_CODE_UNIMPLEMENTED; }
pc_code_t KvGet(void*, const char*, void*, size_t, size_t*, int64_t) {
  return PC_CODE_UNIMPLEMENTED;
}
const pc_host_services_t kHost = {sizeof(pc_host_services_t), nullptr, LogToStderr, KvSet, KvGet,
                                  nullptr};

// The backend plugins the build produced (tests/CMakeLists.txt, polychip_test_every_backend).
const std::vector<std::string>& Backends() {
  static const std::vector<std::string> names = {POLYCHIP_BACKEND_PLUGINS};
  return names;
}
// Those of `names` the build produced.
std::vector<std::string> BuiltAmong(const std::vector<std::string>& names) {
  std::vector<std::string> built;
  std::ranges::copy_if(names, std::back_inserter(built), [](const std::string& n) {
    return std::ranges::find(Backends(), n) != Backends().end();
  });
  return built;
}

class Plugin {
 public:
  explicit Plugin(const std::string& name) {
    const std::string path =
        std::string(POLYCHIP_BUILD_DIR) + "/lib/polychip/libpolychip_backend_" + name + ".so";
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) return;
    auto get = reinterpret_cast<pc_backend_get_api_fn>(dlsym(handle_, PC_BACKEND_GET_API_SYMBOL));
    if (get) api_ = get(PC_ABI_MAJOR, PC_ABI_MINOR, &kHost);
  }
  ~Plugin() {
    if (handle_) dlclose(handle_);
  }
  const pc_backend_iface_t* api() const { return api_; }
  void* handle() const { return handle_; }

 private:
  void* handle_ = nullptr;
  const pc_backend_iface_t* api_ = nullptr;
};

// Expects success; on failure prints the plugin's message and frees the error.
#define PC_OK(api, call)                                                         \
  do {                                                                           \
    pc_error_t* _e = (call);                                                     \
    if (_e) {                                                                    \
      ADD_FAILURE() << #call << ": " << (api)->error_message(_e);                \
      (api)->error_destroy(_e);                                                  \
    }                                                                            \
  } while (0)

// Expects a specific error code.
pc_code_t CodeOf(const pc_backend_iface_t* api, pc_error_t* e) {
  if (!e) return PC_CODE_OK;
  pc_code_t c = api->error_code(e);
  api->error_destroy(e);
  return c;
}

class PluginTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    plugin_ = std::make_unique<Plugin>(GetParam());
    ASSERT_NE(plugin_->handle(), nullptr) << dlerror();
    api_ = plugin_->api();
    ASSERT_NE(api_, nullptr);
    pc_param_t params[] = {{"devices", "2"}};
    PC_OK(api_, api_->initialize(params, 1));
    PC_OK(api_, api_->device_open(0, &dev_));
    PC_OK(api_, api_->stream_create(dev_, 0, &stream_));
  }
  void TearDown() override {
    if (!api_) return;
    for (pc_devptr_t p : allocs_) PC_OK(api_, api_->mem_free(dev_, p));
    api_->stream_destroy(stream_);
    api_->device_close(dev_);
    api_->shutdown();
  }
  pc_devptr_t Alloc(uint64_t bytes) {
    pc_devptr_t p = 0;
    PC_OK(api_, api_->mem_alloc(dev_, bytes, &p));
    allocs_.push_back(p);
    return p;
  }
  template <typename T>
  pc_devptr_t Upload(const std::vector<T>& v) {
    pc_devptr_t p = Alloc(v.size() * sizeof(T));
    PC_OK(api_, api_->memcpy_h2d(stream_, p, v.data(), v.size() * sizeof(T)));
    // The source must outlive an asynchronous copy; callers pass temporaries.
    PC_OK(api_, api_->stream_synchronize(stream_));
    return p;
  }
  template <typename T>
  std::vector<T> Download(pc_devptr_t p, size_t n) {
    std::vector<T> v(n);
    PC_OK(api_, api_->memcpy_d2h(stream_, v.data(), p, n * sizeof(T)));
    PC_OK(api_, api_->stream_synchronize(stream_));
    return v;
  }

  std::unique_ptr<Plugin> plugin_;
  const pc_backend_iface_t* api_ = nullptr;
  pc_device_t* dev_ = nullptr;
  pc_stream_t* stream_ = nullptr;
  std::vector<pc_devptr_t> allocs_;
};

TEST_P(PluginTest, TableAndProps) {
  EXPECT_EQ(api_->abi_major, static_cast<uint32_t>(PC_ABI_MAJOR));
  // The table's name is the file's: the framework finds `--device <name>:0` by file name and
  // reports the table's (a copy of the template that was not renamed everywhere fails here).
  EXPECT_STREQ(api_->name, GetParam().c_str());
  int32_t n = 0;
  PC_OK(api_, api_->device_count(&n));
  ASSERT_GE(n, 1);
  pc_device_props_t props{};
  props.struct_size = sizeof(props);
  PC_OK(api_, api_->device_get_props(n - 1, &props));
  EXPECT_GT(props.total_memory, 0u);
  // Honest flags: stream-ordered free is offered exactly when claimed.
  EXPECT_EQ(api_->mem_free_async != nullptr, (props.flags & PC_DEVICE_FLAG_ASYNC_FREE) != 0);
  EXPECT_EQ(api_->event_elapsed_ms != nullptr, (props.flags & PC_DEVICE_FLAG_TIMING) != 0);
  EXPECT_EQ(CodeOf(api_, api_->device_get_props(n, &props)), PC_CODE_INVALID_ARGUMENT);
  pc_device_t* again = nullptr;
  EXPECT_EQ(CodeOf(api_, api_->device_open(0, &again)), PC_CODE_FAILED_PRECONDITION);
}

TEST_P(PluginTest, CopyRoundTripMemsetD2D) {
  std::vector<uint8_t> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  pc_devptr_t a = Upload(data), b = Alloc(data.size());
  pc_device_props_t props{};
  props.struct_size = sizeof(props);
  PC_OK(api_, api_->device_get_props(0, &props));
  EXPECT_EQ(a % props.alignment, 0u);
  EXPECT_EQ(b % props.alignment, 0u);
  PC_OK(api_, api_->memcpy_d2d(stream_, b, a, data.size()));
  PC_OK(api_, api_->memset(stream_, b + 100, 0xAB, 50));
  auto back = Download<uint8_t>(b, data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    ASSERT_EQ(back[i], (i >= 100 && i < 150) ? 0xAB : data[i]) << i;
  }
  uint64_t free_b = 0, total_b = 0;
  PC_OK(api_, api_->mem_get_info(dev_, &free_b, &total_b));
  EXPECT_LE(free_b, total_b);
}

TEST_P(PluginTest, OpsAgainstPlainLoops) {
  const int64_t m = 3, n = 4, k = 32;
  std::vector<float> x(m * k), w(n * k), bias(n), res(m * n, 1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.7f * i);
  for (int64_t j = 0; j < n; ++j) bias[j] = 0.1f * j;
  pc_devptr_t dx = Upload(x), dw = Upload(w), db = Upload(bias), dout = Upload(res);
  pc_matmul_args_t mm{sizeof(mm), dx, dw, PC_DTYPE_F32, PC_LAYOUT_GGUF, db, dout, m, n, k, k, n, 1};
  PC_OK(api_, api_->op_launch(stream_, PC_OP_MATMUL, &mm));
  // out = swiglu(out, out) then add x-row slices: chain ops on the stream, read back once.
  pc_swiglu_args_t sw{sizeof(sw), dout, dout, dout, m * n};
  PC_OK(api_, api_->op_launch(stream_, PC_OP_SWIGLU, &sw));
  pc_add_args_t ad{sizeof(ad), dout, dx, dout, m * n};
  PC_OK(api_, api_->op_launch(stream_, PC_OP_ADD, &ad));
  auto got = Download<float>(dout, m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 1.0f + bias[j];
      for (int64_t kk = 0; kk < k; ++kk) s += x[i * k + kk] * w[j * k + kk];
      float y = s / (1 + std::exp(-s)) * s + x[i * n + j];
      EXPECT_NEAR(got[i * n + j], y, 1e-4 * (1 + std::fabs(y))) << i << "," << j;
    }
  }
  pc_op_query_t q{sizeof(q), PC_OP_MATMUL, {PC_DTYPE_Q4_K, PC_DTYPE_INVALID, PC_DTYPE_INVALID, PC_DTYPE_INVALID}, PC_SHAPE_ANY};
  EXPECT_EQ(api_->op_supports(dev_, &q), 1);
  q.op = static_cast<pc_op_t>(42);
  EXPECT_EQ(api_->op_supports(dev_, &q), 0);
  EXPECT_NE(CodeOf(api_, api_->op_launch(stream_, static_cast<pc_op_t>(42), &mm)), PC_CODE_OK);
}

TEST_P(PluginTest, ConvertF32ToF16AndBack) {
  std::vector<float> x = {1.0f, -2.5f, 65504.0f, 1.0f + 1.0f / 4096};
  pc_devptr_t dx = Upload(x), dh = Alloc(8), dy = Alloc(16);
  pc_convert_args_t c1{sizeof(c1), dx, dh, PC_DTYPE_F32, PC_DTYPE_F16, 4};
  pc_convert_args_t c2{sizeof(c2), dh, dy, PC_DTYPE_F16, PC_DTYPE_F32, 4};
  PC_OK(api_, api_->op_launch(stream_, PC_OP_CONVERT, &c1));
  PC_OK(api_, api_->op_launch(stream_, PC_OP_CONVERT, &c2));
  auto h = Download<uint16_t>(dh, 4);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[3], 0x3C00);  // 1 + 2^-12 rounds to 1
  auto y = Download<float>(dy, 4);
  EXPECT_EQ(y[1], -2.5f);
  EXPECT_EQ(y[2], 65504.0f);
}

TEST_P(PluginTest, EventsAcrossStreams) {
  pc_stream_t* other = nullptr;
  PC_OK(api_, api_->stream_create(dev_, 0, &other));
  pc_event_t *e1 = nullptr, *e2 = nullptr;
  PC_OK(api_, api_->event_create(dev_, &e1));
  PC_OK(api_, api_->event_create(dev_, &e2));
  int32_t done = 0;
  PC_OK(api_, api_->event_query(e1, &done));
  EXPECT_EQ(done, 1) << "a never-recorded event counts as complete";
  std::vector<float> x(1024, 2.0f);
  pc_devptr_t dx = Upload(x);
  PC_OK(api_, api_->event_record(e1, stream_));
  // The other stream waits for the upload, then doubles the data.
  PC_OK(api_, api_->stream_wait_event(other, e1));
  pc_add_args_t ad{sizeof(ad), dx, dx, dx, 1024};
  PC_OK(api_, api_->op_launch(other, PC_OP_ADD, &ad));
  PC_OK(api_, api_->event_record(e2, other));
  PC_OK(api_, api_->stream_wait_event(stream_, e2));
  auto got = Download<float>(dx, 1024);  // on stream_, ordered after e2
  for (float v : got) ASSERT_EQ(v, 4.0f);
  PC_OK(api_, api_->event_synchronize(e2));
  PC_OK(api_, api_->event_query(e2, &done));
  EXPECT_EQ(done, 1);
  if (api_->event_elapsed_ms) {  // optional (PC_DEVICE_FLAG_TIMING)
    float ms = -1;
    PC_OK(api_, api_->event_elapsed_ms(e1, e2, &ms));
    EXPECT_GE(ms, 0.0f);
  }
  api_->event_destroy(e1);
  api_->event_destroy(e2);
  api_->stream_destroy(other);
}

// Test names end in the plugin's name: `ctest -R <name>` selects one backend.
INSTANTIATE_TEST_SUITE_P(InTree, PluginTest, testing::ValuesIn(Backends()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PluginTest);  // a tree without backends

// ---- what the cpu and emu plugins promise (each tested when the tree has it) ---------------

using CpuEmuTest = PluginTest;

TEST_P(CpuEmuTest, Props) {
  int32_t n = 0;
  PC_OK(api_, api_->device_count(&n));
  EXPECT_EQ(n, 2);  // the "devices" parameter
  pc_device_props_t props{};
  props.struct_size = sizeof(props);
  PC_OK(api_, api_->device_get_props(1, &props));
  EXPECT_EQ(api_->mem_free_async, nullptr);
  EXPECT_NE(api_->event_elapsed_ms, nullptr);
  if (GetParam() == "emu") {
    EXPECT_EQ(props.alignment, 4096u);
    EXPECT_EQ(props.max_alloc_size, 64u << 20);
    EXPECT_FALSE(props.flags & PC_DEVICE_FLAG_HOST_ACCESSIBLE);
    EXPECT_TRUE(props.flags & PC_DEVICE_FLAG_ASYNC_EXEC);
    EXPECT_GT(props.priority_high, props.priority_low);
  } else {
    EXPECT_TRUE(props.flags & PC_DEVICE_FLAG_HOST_ACCESSIBLE);
    EXPECT_FALSE(props.flags & PC_DEVICE_FLAG_ASYNC_EXEC);
  }
}

INSTANTIATE_TEST_SUITE_P(InTree, CpuEmuTest, testing::ValuesIn(BuiltAmong({"cpu", "emu"})),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CpuEmuTest);

// ---- emu-only semantics --------------------------------------------------------------------

using EmuTest = PluginTest;

TEST_P(EmuTest, RejectsHostPointersAndForeignMemory) {
  std::vector<float> host(64, 1.0f);
  const pc_devptr_t as_devptr = reinterpret_cast<uintptr_t>(host.data());
  pc_devptr_t good = Alloc(256);
  pc_add_args_t ad{sizeof(ad), as_devptr, good, good, 64};
  EXPECT_EQ(CodeOf(api_, api_->op_launch(stream_, PC_OP_ADD, &ad)), PC_CODE_INVALID_ARGUMENT);
  EXPECT_EQ(CodeOf(api_, api_->memcpy_h2d(stream_, as_devptr, host.data(), 256)),
            PC_CODE_INVALID_ARGUMENT);
  // Past the end of the allocation.
  ad = {sizeof(ad), good, good, good, 4096};
  EXPECT_EQ(CodeOf(api_, api_->op_launch(stream_, PC_OP_ADD, &ad)), PC_CODE_INVALID_ARGUMENT);
  // Memory of device 1 used on device 0's stream.
  pc_device_t* dev1 = nullptr;
  PC_OK(api_, api_->device_open(1, &dev1));
  pc_devptr_t foreign = 0;
  PC_OK(api_, api_->mem_alloc(dev1, 256, &foreign));
  ad = {sizeof(ad), foreign, good, good, 64};
  EXPECT_EQ(CodeOf(api_, api_->op_launch(stream_, PC_OP_ADD, &ad)), PC_CODE_INVALID_ARGUMENT);
  PC_OK(api_, api_->mem_free(dev1, foreign));
  api_->device_close(dev1);
  // Limits.
  pc_devptr_t big = 0;
  EXPECT_EQ(CodeOf(api_, api_->mem_alloc(dev_, (64u << 20) + 1, &big)), PC_CODE_INVALID_ARGUMENT);
  // A bad KV slot is only visible while running: reported by stream_synchronize.
  std::vector<float> kv(8, 1.0f);
  std::vector<int32_t> slot = {1000000};
  pc_devptr_t dk = Upload(kv), ds = Upload(slot), cache = Alloc(4096);
  pc_kv_store_args_t st{sizeof(st), dk, dk, cache, cache, ds, PC_DTYPE_F32, 1, 1, 8, 16};
  PC_OK(api_, api_->op_launch(stream_, PC_OP_KV_STORE, &st));
  EXPECT_EQ(CodeOf(api_, api_->stream_synchronize(stream_)), PC_CODE_INTERNAL);
  EXPECT_EQ(CodeOf(api_, api_->stream_synchronize(stream_)), PC_CODE_OK) << "error reported once";
}

TEST_P(EmuTest, OutOfMemoryIsResourceExhausted) {
  pc_device_t* dev1 = nullptr;
  // Device 1 of a plugin initialized with memory_mb=1 runs out quickly.
  api_->stream_destroy(stream_);
  api_->device_close(dev_);
  pc_param_t params[] = {{"devices", "2"}, {"memory_mb", "1"}};
  PC_OK(api_, api_->initialize(params, 2));
  PC_OK(api_, api_->device_open(0, &dev_));
  PC_OK(api_, api_->stream_create(dev_, 0, &stream_));
  PC_OK(api_, api_->device_open(1, &dev1));
  std::vector<pc_devptr_t> got;
  pc_error_t* e = nullptr;
  for (int i = 0; i < 1000 && !e; ++i) {
    pc_devptr_t p = 0;
    e = api_->mem_alloc(dev1, 100000, &p);
    if (!e) got.push_back(p);
  }
  EXPECT_EQ(got.size(), 10u);  // 1 MiB / (100000 rounded up to 4096 multiples = 102400)
  EXPECT_EQ(CodeOf(api_, e), PC_CODE_RESOURCE_EXHAUSTED);
  for (pc_devptr_t p : got) PC_OK(api_, api_->mem_free(dev1, p));
  pc_devptr_t whole = 0;
  PC_OK(api_, api_->mem_alloc(dev1, 1 << 20, &whole));  // freed ranges coalesced again
  PC_OK(api_, api_->mem_free(dev1, whole));
  api_->device_close(dev1);
}

// Many commands on one stream run in order: each step depends on the previous one.
TEST_P(EmuTest, StreamOrderIsPreserved) {
  std::vector<float> one(256, 1.0f);
  pc_devptr_t acc = Upload(std::vector<float>(256, 0.0f)), inc = Upload(one);
  for (int i = 0; i < 200; ++i) {
    pc_add_args_t ad{sizeof(ad), acc, inc, acc, 256};
    PC_OK(api_, api_->op_launch(stream_, PC_OP_ADD, &ad));
    if (i == 99) PC_OK(api_, api_->memset(stream_, acc, 0, 256 * 4));  // back to zero
  }
  auto got = Download<float>(acc, 256);
  for (float v : got) ASSERT_EQ(v, 100.0f);
}

// Both streams are held behind a gate event; once it opens, the high-priority stream's single
// command must finish before the low-priority stream's long queue does.
TEST_P(EmuTest, HighPriorityStreamRunsFirst) {
  pc_stream_t *gate = nullptr, *low = nullptr, *high = nullptr;
  PC_OK(api_, api_->stream_create(dev_, 0, &gate));
  PC_OK(api_, api_->stream_create(dev_, 0, &low));
  PC_OK(api_, api_->stream_create(dev_, 2, &high));
  pc_event_t *open = nullptr, *low_done = nullptr, *high_done = nullptr;
  PC_OK(api_, api_->event_create(dev_, &open));
  PC_OK(api_, api_->event_create(dev_, &low_done));
  PC_OK(api_, api_->event_create(dev_, &high_done));
  // The gate: a matmul long enough for both other queues to fill up behind it.
  const int64_t k = 1024, n = 1024, m = 8;
  pc_devptr_t x = Upload(std::vector<float>(m * k, 0.5f));
  pc_devptr_t w = Upload(std::vector<float>(n * k, 0.25f));
  pc_devptr_t y = Alloc(m * n * 4);
  pc_matmul_args_t mm{sizeof(mm), x, w, PC_DTYPE_F32, PC_LAYOUT_GGUF, 0, y, m, n, k, k, n, 0};
  PC_OK(api_, api_->stream_synchronize(stream_));
  PC_OK(api_, api_->op_launch(gate, PC_OP_MATMUL, &mm));
  PC_OK(api_, api_->event_record(open, gate));
  PC_OK(api_, api_->stream_wait_event(low, open));
  PC_OK(api_, api_->stream_wait_event(high, open));
  // Each low-priority add takes milliseconds, so the high stream's worker has ample time to
  // queue up at the executor even on a loaded machine.
  pc_devptr_t a = Alloc(16 << 20);
  pc_add_args_t ad{sizeof(ad), a, a, a, (16 << 20) / 4};
  for (int i = 0; i < 30; ++i) PC_OK(api_, api_->op_launch(low, PC_OP_ADD, &ad));
  PC_OK(api_, api_->event_record(low_done, low));
  PC_OK(api_, api_->op_launch(high, PC_OP_ADD, &ad));
  PC_OK(api_, api_->event_record(high_done, high));
  int32_t done = 1;
  PC_OK(api_, api_->event_query(low_done, &done));
  EXPECT_EQ(done, 0) << "execution is asynchronous: nothing can have finished yet";
  PC_OK(api_, api_->stream_synchronize(low));
  PC_OK(api_, api_->stream_synchronize(high));
  float ms = 0;
  PC_OK(api_, api_->event_elapsed_ms(high_done, low_done, &ms));
  EXPECT_GT(ms, 0.0f) << "the high-priority command finished after the low-priority queue";
  api_->event_destroy(open);
  api_->event_destroy(low_done);
  api_->event_destroy(high_done);
  api_->stream_destroy(gate);
  api_->stream_destroy(low);
  api_->stream_destroy(high);
}

INSTANTIATE_TEST_SUITE_P(Emu, EmuTest, testing::ValuesIn(BuiltAmong({"emu"})),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EmuTest);  // a tree without emu

}  // namespace
