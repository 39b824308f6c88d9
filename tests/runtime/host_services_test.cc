// The services lent to plugins: key-value stores (in-process and file-backed) and counters,
// exercised through the C table a plugin sees.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "runtime/abi_internal.h"
#include "runtime/host_services.h"

namespace polychip::runtime {
namespace {

TEST(HostServicesTest, InProcessGetBlocksUntilSetOrTimeout) {
  InProcessKvStore kv;
  auto missing = kv.Get("nope", 20);
  EXPECT_EQ(missing.status().code(), StatusCode::kUnavailable);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    (void)kv.Set("id", "abc");
  });
  auto v = kv.Get("id", 5000);
  writer.join();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "abc");
}

TEST(HostServicesTest, FileStoreIsSharedThroughTheDirectory) {
  const std::string dir = ::testing::TempDir() + "/pc_kv_" + std::to_string(getpid());
  FileKvStore writer(dir), reader(dir);
  EXPECT_EQ(reader.Get("rank0/id", 10).status().code(), StatusCode::kUnavailable);
  const std::string binary("a\0b/c", 5);
  ASSERT_TRUE(writer.Set("rank0/id", binary).ok());
  auto v = reader.Get("rank0/id", 1000);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, binary);
}

TEST(HostServicesTest, CTableForPlugins) {
  const pc_host_services_t* h = HostServices();
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->struct_size, sizeof(pc_host_services_t));
  SetHostKvStore(std::make_shared<InProcessKvStore>());
  ASSERT_EQ(h->kv_set(h->host_ctx, "k", "hello", 5), PC_CODE_OK);
  char buf[8] = {};
  size_t size = 0;
  EXPECT_EQ(h->kv_get(h->host_ctx, "k", buf, sizeof(buf), &size, 100), PC_CODE_OK);
  EXPECT_EQ(size, 5u);
  EXPECT_EQ(std::string(buf, size), "hello");
  EXPECT_EQ(h->kv_get(h->host_ctx, "k", buf, 2, &size, 100), PC_CODE_RESOURCE_EXHAUSTED);
  EXPECT_EQ(size, 5u);
  EXPECT_EQ(h->kv_get(h->host_ctx, "absent", buf, sizeof(buf), &size, 10), PC_CODE_UNAVAILABLE);
  const double before = CounterSink::Global().Get("test.bytes");
  h->counter_add(h->host_ctx, "test.bytes", 2.5);
  h->counter_add(h->host_ctx, "test.bytes", 1.0);
  EXPECT_DOUBLE_EQ(CounterSink::Global().Get("test.bytes"), before + 3.5);
  h->log(h->host_ctx, PC_LOG_INFO, "test", "a plugin log line");  // must not crash
}

}  // namespace
}  // namespace polychip::runtime
