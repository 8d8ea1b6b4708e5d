// The plugin loader against real files: the CUDA plugin when built, and files that
// are not plugins (a text file, a shared library without the entry symbol).
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/runtime/device_comm.hpp"
#include "core/runtime/plugin_loader.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

namespace fs = std::filesystem;

// A private plugin folder first on BRAID_PLUGIN_PATH for one test.
class PluginDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("braid-plugins-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ::setenv("BRAID_PLUGIN_PATH", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("BRAID_PLUGIN_PATH");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(PluginDir, SearchPathStartsWithTheEnvironment) {
  auto dirs = runtime::plugin_search_path();
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(dirs.front(), dir_.string());
}

TEST_F(PluginDir, MissingPluginNamesEveryPlaceTried) {
  test::expect_error(
      [] { runtime::load_device_plugin("nope"); }, Status::plugin,
      {"no usable libbraid-nope.so", "BRAID_PLUGIN_PATH", (dir_ / "libbraid-nope.so").string() + ": not found"});
}

TEST_F(PluginDir, AFileThatIsNotALibraryIsReported) {
  std::ofstream(dir_ / "libbraid-bogus.so") << "not an ELF file\n";
  test::expect_error([] { runtime::load_device_plugin("bogus"); }, Status::plugin,
                     {(dir_ / "libbraid-bogus.so").string() + ": cannot load"});
}

TEST_F(PluginDir, AnUnusableFileOnTheUsersPathIsNotPassedOver) {
  // The build's libbraid-host.so comes later on the path; loading it instead of the file the
  // user pointed at would hide that file's problem.
  std::ofstream(dir_ / "libbraid-host.so") << "not an ELF file\n";
  test::expect_error(
      [] { runtime::load_device_plugin("host"); }, Status::plugin,
      {(dir_ / "libbraid-host.so").string() + ": cannot load", "braid loads the first libbraid-host.so"});
}

TEST_F(PluginDir, ALibraryWithoutTheEntryPointIsReported) {
  fs::copy_file(BRAID_LIBRARY_PATH, dir_ / "libbraid-wrong.so");  // a real shared library, not a plugin
  test::expect_error([] { runtime::load_device_plugin("wrong"); }, Status::plugin,
                     {"libbraid-wrong.so: does not export braidDevicePlugin_v1", "version 2 was looked for first",
                      "does not export braidDevicePlugin_v2"});
}

TEST(Plugin, HostBackendLoadsThroughInterfaceTwo) {
  auto plugin = runtime::load_device_plugin("host");
  EXPECT_EQ(fs::path(plugin->path()).filename(), "libbraid-host.so");
  EXPECT_STREQ(plugin->name(), "host");
  EXPECT_EQ(plugin->interface_version(), 2);
  ASSERT_NE(plugin->v2(), nullptr);
  const auto devices = plugin->devices();
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_TRUE(devices[0].host_memory);
  EXPECT_NO_THROW(plugin->self_test(0));
  test::expect_error([&] { plugin->self_test(1); }, Status::plugin, {"self-test on device 1", "no device 1"});
}

TEST(Plugin, NcclPluginLoadsThroughCommInterfaceTwo) {
#if BRAID_NCCL_ENABLED
  auto plugin = runtime::load_device_comm_plugin("nccl");
  EXPECT_EQ(fs::path(plugin->path()).filename(), "libbraid-nccl.so");
  EXPECT_STREQ(plugin->name(), "nccl");
  EXPECT_EQ(plugin->backend_version().rfind("NCCL 2.", 0), 0u) << plugin->backend_version();
  // Without a bootstrap NCCL cannot find its world; the plugin says so instead of crashing.
  EXPECT_NE(plugin->api().init(nullptr), 0);
  EXPECT_NE(std::string(plugin->api().last_error()).find("init needs a bootstrap"), std::string::npos)
      << plugin->api().last_error();
#else
  GTEST_SKIP() << "built without NCCL (no CUDA, or no nccl.h / libnccl found)";
#endif
}

TEST(Plugin, CudaPluginLoadsWhereBuilt) {
#if BRAID_CUDA_ENABLED
  auto plugin = runtime::load_device_plugin("cuda");
  EXPECT_EQ(fs::path(plugin->path()).filename(), "libbraid-cuda.so");
  EXPECT_STREQ(plugin->name(), "cuda");
  auto devices = plugin->devices();  // zero devices without a driver: reported, not thrown
  if (devices.empty()) {
    std::printf("  cuda plugin loaded, no devices: %s\n", plugin->unavailable_reason().c_str());
  }
#else
  GTEST_SKIP() << "built without CUDA (BRAID_WITH_CUDA found no nvcc or was OFF)";
#endif
}

}  // namespace
}  // namespace braid
