// Loader tests: each deliberately broken plugin gets its own precise message; selection works by
// environment, config file and code registration; plugin errors become canonical Statuses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "common/fake_backend.h"
#include "runtime/abi_internal.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/ops.h"
#include "runtime/plugin_loader.h"
#include "test_util.h"

namespace polychip::runtime {
namespace {

using ::testing::HasSubstr;
using testing::PluginPath;
using testing::RuntimeTest;

class LoaderTest : public RuntimeTest {};

TEST_F(LoaderTest, FileNames) {
  EXPECT_EQ(PluginFileName(PluginKind::kBackend, "emu"), "libpolychip_backend_emu.so");
  EXPECT_EQ(PluginFileName(PluginKind::kComm, "shm"), "libpolychip_comm_shm.so");
}

TEST_F(LoaderTest, FutureAbiMajorIsRefusedWithBothVersions) {
  LoadReport report;
  auto b = LoadBackendFromPath(PluginPath("futureabi"), {}, &report);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  const std::string pair = "plugin ABI " + std::to_string(PC_ABI_MAJOR + 1) + "." +
                           std::to_string(PC_ABI_MINOR) + ", host ABI " +
                           std::to_string(PC_ABI_MAJOR) + "." + std::to_string(PC_ABI_MINOR);
  EXPECT_THAT(b.status().message(), HasSubstr(pair));
  EXPECT_THAT(b.status().message(), HasSubstr(PluginPath("futureabi")));
  EXPECT_EQ(report.stage, "abi");
  EXPECT_EQ(report.abi_major, uint32_t{PC_ABI_MAJOR + 1});
}

TEST_F(LoaderTest, MissingGetApiSymbolIsNamed) {
  LoadReport report;
  auto b = LoadBackendFromPath(PluginPath("nogetapi"), {}, &report);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("missing symbol 'pc_backend_get_api'"));
  EXPECT_EQ(report.stage, "symbol");
}

TEST_F(LoaderTest, NullRequiredMemberIsNamed) {
  LoadReport report;
  auto b = LoadBackendFromPath(PluginPath("nullmember"), {}, &report);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("required member 'mem_alloc' is NULL"));
  EXPECT_EQ(report.stage, "validate");
}

TEST_F(LoaderTest, ProbeScoreZeroGivesItsReason) {
  LoadReport report;
  auto b = LoadBackendFromPath(PluginPath("probezero"), {}, &report);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(),
              HasSubstr("probe: unusable (score 0): no fake accelerator present (test)"));
  EXPECT_EQ(report.stage, "probe");
  EXPECT_EQ(report.probe_score, 0);
}

TEST_F(LoaderTest, MissingDependencyIsNamed) {
  LoadReport report;
  auto b = LoadBackendFromPath(PluginPath("missingdep"), {}, &report);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(report.stage, "dlopen");
  EXPECT_THAT(b.status().message(), HasSubstr("dlopen failed"));
  EXPECT_THAT(b.status().message(),
              HasSubstr("unresolved dependency: libpctest_helper.so not found"));
  ASSERT_EQ(report.missing_libraries.size(), 1u);
  EXPECT_EQ(report.missing_libraries[0], "libpctest_helper.so");
}

TEST_F(LoaderTest, DependencyCheckHonoursLdLibraryPath) {
  const std::string path = PluginPath("missingdep");
  const auto needed = NeededLibraries(path);
  EXPECT_NE(std::find(needed.begin(), needed.end(), "libpctest_helper.so"), needed.end());
  EXPECT_EQ(MissingLibraries(path), std::vector<std::string>{"libpctest_helper.so"});
  const char* old = std::getenv("LD_LIBRARY_PATH");
  const std::string saved = old ? old : "";
  setenv("LD_LIBRARY_PATH", (std::string(PCTEST_PLUGIN_DIR) + "/hidden").c_str(), 1);
  EXPECT_TRUE(MissingLibraries(path).empty());
  if (old) {
    setenv("LD_LIBRARY_PATH", saved.c_str(), 1);
  } else {
    unsetenv("LD_LIBRARY_PATH");
  }
  // A good plugin has no missing dependency.
  EXPECT_TRUE(MissingLibraries(PluginPath("goodfake")).empty());
}

TEST_F(LoaderTest, UnknownNameListsEveryPathTried) {
  std::vector<LoadReport> reports;
  auto b = PluginRegistry::Global().LoadBackend("nosuch", {"/nonexistent/a", "/nonexistent/b"},
                                                {}, &reports);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(b.status().message(),
              HasSubstr("/nonexistent/a/libpolychip_backend_nosuch.so: no such file"));
  EXPECT_THAT(b.status().message(),
              HasSubstr("/nonexistent/b/libpolychip_backend_nosuch.so: no such file"));
  EXPECT_EQ(reports.size(), 2u);
}

TEST_F(LoaderTest, BrokenNamedPluginIsAnErrorNotAFallback) {
  auto b = PluginRegistry::Global().LoadBackend("futureabi", {"/nonexistent", PCTEST_PLUGIN_DIR});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.status().message(), HasSubstr("cannot be loaded"));
  EXPECT_THAT(b.status().message(), HasSubstr("/nonexistent/libpolychip_backend_futureabi.so"));
  EXPECT_THAT(b.status().message(), HasSubstr("host ABI"));
  EXPECT_TRUE(PluginRegistry::Global().Backends().empty());
}

TEST_F(LoaderTest, DiscoveryFindsTestPlugins) {
  auto files = DiscoverPlugins({PCTEST_PLUGIN_DIR, PCTEST_PLUGIN_DIR "/."});
  int goodfake = 0, shadowed = 0;
  for (const auto& f : files) {
    if (f.name == "goodfake") ++goodfake;
    if (f.shadowed) ++shadowed;
  }
  EXPECT_EQ(goodfake, 2);
  EXPECT_EQ(shadowed, 7);  // the whole second listing
  LoadReport r = DiagnosePlugin(PluginPath("goodfake"), PluginKind::kBackend);
  EXPECT_TRUE(r.usable) << r.ToString();
  EXPECT_EQ(r.probe_score, 10);
  EXPECT_EQ(r.version, "0.0.1-test");
}

TEST_F(LoaderTest, SelectionByEnvironment) {
  setenv("POLYCHIP_DEVICE_BACKEND", "goodfake", 1);
  setenv("POLYCHIP_PLUGIN_PATH", "/nonexistent:" PCTEST_PLUGIN_DIR, 1);
  auto config = ResolveRuntimeConfig("", "");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->backend_source, "env POLYCHIP_DEVICE_BACKEND");
  auto sel = SelectPlugins(*config);
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  EXPECT_EQ(sel->backend->name(), "goodfake");
  EXPECT_EQ(sel->backend->path(), PluginPath("goodfake"));
  EXPECT_EQ(sel->backend->abi_major(), uint32_t{PC_ABI_MAJOR});
  auto count = sel->backend->DeviceCount();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, 2);
  auto props = sel->backend->GetProps(1);
  ASSERT_TRUE(props.ok());
  EXPECT_EQ(props->alignment, 4096u);
  EXPECT_EQ(props->physical_id, "fake-1");
  EXPECT_FALSE(props->async_free);
}

TEST_F(LoaderTest, SelectionByConfigFilePassesParams) {
  const std::string file = ::testing::TempDir() + "/pc_runtime_config.yaml";
  {
    std::ofstream out(file);
    out << "backend:\n  name: goodfake\n  path: " << PluginPath("goodfake")
        << "\n  params: {fail: \"on purpose\"}\n";
  }
  auto config = ResolveRuntimeConfig(file, "");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto sel = SelectPlugins(*config);
  ASSERT_FALSE(sel.ok());  // the plugin saw the parameter and refused to initialize
  EXPECT_THAT(sel.status().message(), HasSubstr("asked to fail: on purpose"));
  EXPECT_THAT(sel.status().message(), HasSubstr("config " + file));
  {
    std::ofstream out(file);
    out << "backend:\n  name: goodfake\n  path: " << PluginPath("goodfake")
        << "\n  params: {devices: [0, 1]}\n";
  }
  config = ResolveRuntimeConfig(file, "");
  ASSERT_TRUE(config.ok());
  sel = SelectPlugins(*config);
  ASSERT_TRUE(sel.ok()) << sel.status().ToString();
  EXPECT_EQ(sel->backend->name(), "goodfake");
}

TEST_F(LoaderTest, RegistrationFromCodeInitializesAndShutsDown) {
  {
    auto b = PluginRegistry::Global().RegisterBackendTable(FakeBackendTable(), {{"devices", "0"}});
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ((*b)->name(), "fake");
    EXPECT_EQ((*b)->path(), "<registered from code>");
    EXPECT_EQ(FakeGetStats()->initialized, 1);
    EXPECT_STREQ(FakeGetStats()->last_params, "devices=0");
    EXPECT_EQ(PluginRegistry::Global().FindBackend("fake"), *b);
    auto again = PluginRegistry::Global().RegisterBackendTable(FakeBackendTable());
    ASSERT_FALSE(again.ok());
    EXPECT_THAT(again.status().message(), HasSubstr("already loaded"));
    PluginRegistry::Global().Clear();
  }
  EXPECT_EQ(FakeGetStats()->initialized, 0);  // shutdown ran with the last reference
}

TEST_F(LoaderTest, InvalidTablesFromCodeAreRefused) {
  pc_backend_iface_t t = *FakeBackendTable();
  t.op_launch = nullptr;
  auto b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("required member 'op_launch' is NULL"));
  t = *FakeBackendTable();
  t.struct_size = offsetof(pc_backend_iface_t, memset);
  b = PluginRegistry::Global().RegisterBackendTable(&t);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("struct_size"));

  pc_comm_iface_t c{};
  c.struct_size = sizeof(c);
  c.abi_major = PC_ABI_MAJOR;
  c.name = "nullcomm";
  c.version = "0";
  auto comm = PluginRegistry::Global().RegisterCommTable(&c);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().message(), HasSubstr("required member 'error_code' is NULL"));
  c.abi_major = PC_ABI_MAJOR + 1;
  comm = PluginRegistry::Global().RegisterCommTable(&c);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().message(), HasSubstr("plugin ABI " + std::to_string(PC_ABI_MAJOR + 1)));
}

TEST_F(LoaderTest, DeviceStreamEventAndOps) {
  auto b = PluginRegistry::Global().RegisterBackendTable(FakeBackendTable());
  ASSERT_TRUE(b.ok());
  auto devices = OpenDevices(*b, {1});
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  auto& dev = (*devices)[0];
  EXPECT_EQ(dev->physical_id(), 1);
  EXPECT_EQ(dev->logical_id(), 0);
  EXPECT_FALSE(OpenDevices(*b, {5}).ok());

  auto stream = dev->CreateStream(2);
  ASSERT_TRUE(stream.ok());
  const int64_t n = 1000;  // f32 [n]
  auto a = dev->Allocate(n * 4), c = dev->Allocate(n * 4), out = dev->Allocate(n * 4);
  ASSERT_TRUE(a.ok() && c.ok() && out.ok());
  EXPECT_EQ((*a)->ptr() % 4096, 0u);
  std::vector<float> x(n), y(n), z(n, -1.f);
  for (int64_t i = 0; i < n; ++i) x[i] = i, y[i] = 0.5f * i;
  ASSERT_TRUE((*stream)->CopyH2D((*a)->ptr(), x.data(), n * 4).ok());
  ASSERT_TRUE((*stream)->CopyH2D((*c)->ptr(), y.data(), n * 4).ok());
  EXPECT_TRUE(SupportsOp(*dev, Op::kAdd, {DType::kF32}));
  EXPECT_FALSE(SupportsOp(*dev, Op::kMatmul, {DType::kQ4_K}));
  ASSERT_TRUE(Launch(**stream, AddArgs{(*a)->ptr(), (*c)->ptr(), (*out)->ptr(), n}).ok());
  Status unimpl = Launch(**stream, SwigluArgs{(*a)->ptr(), (*c)->ptr(), (*out)->ptr(), n});
  EXPECT_EQ(unimpl.code(), StatusCode::kUnimplemented);
  ASSERT_TRUE((*stream)->CopyD2H(z.data(), (*out)->ptr(), n * 4).ok());
  auto event = dev->CreateEvent();
  ASSERT_TRUE(event.ok());
  ASSERT_TRUE((*event)->Record(**stream).ok());
  ASSERT_TRUE((*event)->Synchronize().ok());
  EXPECT_TRUE(*(*event)->Query());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(z[i], 1.5f * i);
  EXPECT_EQ(Event::ElapsedMs(**event, **event).status().code(), StatusCode::kUnimplemented);
}

TEST_F(LoaderTest, PluginErrorsBecomeCanonicalStatusesAndAreDestroyed) {
  auto b = PluginRegistry::Global().RegisterBackendTable(FakeBackendTable());
  ASSERT_TRUE(b.ok());
  auto dev = (*b)->OpenDevice(0);
  ASSERT_TRUE(dev.ok());
  FakeSetMemory(1 << 20);
  const int64_t destroyed = FakeGetStats()->errors_destroyed;
  auto p = (*dev)->AllocateRaw(2 << 20);
  FakeSetMemory(256ull << 20);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("fake device out of memory"));
  EXPECT_EQ(FakeGetStats()->errors_destroyed, destroyed + 1);
  // Above the max single allocation: refused before reaching the plugin.
  auto big = (*dev)->AllocateRaw(65ull << 20);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("max single allocation"));
  EXPECT_EQ((*dev)->FreeRaw(12345).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace polychip::runtime
