// Per-op counters (ABI 1.3) as the host reads them: a 1.2 table (without op_counters_read)
// loads and reads as absent; shorter records than the host's are read only as far as they go;
// the difference of two snapshots and the Prometheus lines with their labels.
#include "runtime/op_counters.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/fake_backend.h"
#include "polychip/plugin/pc_backend.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"
#include "test_util.h"

namespace polychip::runtime {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class OpCountersTest : public testing::RuntimeTest {};

// Two records written as a plugin built before bytes and flops existed would: struct_size ends
// after device_ns, yet flags claims bytes (which the host must then not read).
int32_t ShortRecords(pc_device_t*, pc_op_counters_t* out, int32_t capacity) {
  const size_t stride = capacity > 0 ? out[0].struct_size : 0;
  const size_t size = offsetof(pc_op_counters_t, device_ns) + sizeof(uint64_t);
  const int32_t ops[2] = {PC_OP_MATMUL, PC_OP_ADD};
  for (int32_t i = 0; i < 2 && i < capacity; ++i) {
    pc_op_counters_t r;
    std::memset(&r, 0x7f, sizeof(r));  // what lies past `size` is garbage to the host
    r.struct_size = size;
    r.op = ops[i];
    r.flags = PC_OP_COUNTERS_TIME | PC_OP_COUNTERS_BYTES;
    r.launches = 5 + i;
    r.device_ns = 1000 * (i + 1);
    std::memcpy(reinterpret_cast<char*>(out) + i * stride, &r, size);
  }
  return 2;
}

int32_t CountingOff(pc_device_t*, pc_op_counters_t*, int32_t) { return -1; }

TEST_F(OpCountersTest, TableOfAbi12LoadsAndReadsAsAbsent) {
  // Static: the registry keeps the backend (and calls its table) until the fixture clears it.
  static pc_backend_iface_t t;
  t = *FakeBackendTable();
  t.struct_size = offsetof(pc_backend_iface_t, op_counters_read);  // the 1.2 table
  t.abi_minor = 2;
  t.op_counters_read = ShortRecords;  // beyond struct_size: must never be called
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto devices = OpenDevices(*b, {0});
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  EXPECT_FALSE((*b)->ReadOpCounters(*(*devices)[0]).has_value());
  std::string metrics;
  AppendOpCounterMetrics({(*devices)[0].get()}, &metrics);
  EXPECT_THAT(metrics, Not(HasSubstr("polychip_op_")));
}

TEST_F(OpCountersTest, SwitchedOffReadsAsAbsent) {
  // Static: the registry keeps the backend (and calls its table) until the fixture clears it.
  static pc_backend_iface_t t;
  t = *FakeBackendTable();
  t.op_counters_read = CountingOff;
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_TRUE(b.ok());
  auto devices = OpenDevices(*b, {0});
  ASSERT_TRUE(devices.ok());
  EXPECT_FALSE((*b)->ReadOpCounters(*(*devices)[0]).has_value());
}

TEST_F(OpCountersTest, ShortRecordsAreReadAsFarAsTheyGo) {
  // Static: the registry keeps the backend (and calls its table) until the fixture clears it.
  static pc_backend_iface_t t;
  t = *FakeBackendTable();
  t.op_counters_read = ShortRecords;
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_TRUE(b.ok());
  auto devices = OpenDevices(*b, {0});
  ASSERT_TRUE(devices.ok());
  auto ops = (*b)->ReadOpCounters(*(*devices)[0]);
  ASSERT_TRUE(ops.has_value());
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].op, static_cast<int32_t>(Op::kMatmul));
  EXPECT_EQ((*ops)[0].launches, 5u);
  EXPECT_TRUE((*ops)[0].has_time);
  EXPECT_EQ((*ops)[0].device_ns, 1000u);
  EXPECT_FALSE((*ops)[0].has_bytes);  // claimed, but past the record's struct_size
  EXPECT_EQ((*ops)[0].bytes_read, 0u);
  EXPECT_EQ((*ops)[1].launches, 6u);

  std::string metrics;
  AppendOpCounterMetrics({(*devices)[0].get()}, &metrics);
  const std::string labels =
      "backend=\"fake\",device=\"0\",generation=\"" + std::to_string((*b)->generation()) + "\"";
  EXPECT_THAT(metrics, HasSubstr("# TYPE polychip_op_launches_total counter\n"));
  EXPECT_THAT(metrics, HasSubstr("polychip_op_launches_total{" + labels + ",op=\"matmul\"} 5\n"));
  EXPECT_THAT(metrics, HasSubstr("polychip_op_launches_total{" + labels + ",op=\"add\"} 6\n"));
  EXPECT_THAT(metrics,
              HasSubstr("polychip_op_device_seconds_total{" + labels + ",op=\"add\"} 2e-06\n"));
  EXPECT_THAT(metrics, Not(HasSubstr("polychip_op_read_bytes_total")));
}

TEST(OpCountersDeltaTest, SubtractsPerOpAndDropsOpsThatDidNotRun) {
  OpCounters m{3, 10, 100, 1000, 10, 50, true, true, true};
  OpCounters a{8, 4, 40, 0, 0, 0, true, false, false};
  OpCounters m2 = m, a2 = a;
  m2.launches += 2;
  m2.device_ns += 30;
  m2.bytes_read += 500;
  OpCounters rope{4, 1, 7, 0, 0, 0, true, false, false};  // new since `before`
  const auto d = OpCountersDelta({m, a}, {m2, a2, rope});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].op, 3);
  EXPECT_EQ(d[0].launches, 2u);
  EXPECT_EQ(d[0].device_ns, 30u);
  EXPECT_EQ(d[0].bytes_read, 500u);
  EXPECT_EQ(d[1].op, 4);
  EXPECT_EQ(d[1].launches, 1u);
  EXPECT_DOUBLE_EQ(*DeviceSeconds(d), 37e-9);
  OpCounters untimed{3, 1, 0, 0, 0, 0, false, false, false};
  EXPECT_FALSE(DeviceSeconds({untimed}).has_value());
}

}  // namespace
}  // namespace polychip::runtime
