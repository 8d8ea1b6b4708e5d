// The communication plugin loader against files that must be refused (missing, not a
// plugin, another interface version, missing functions), and the host bootstrap of
// World in one process. The MPI plugin itself runs in tests/mpi, under mpiexec.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/runtime/comm_plugin.hpp"
#include "core/runtime/world.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

namespace fs = std::filesystem;

class CommPluginDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("braid-comm-plugins-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    ::setenv("BRAID_PLUGIN_PATH", dir_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("BRAID_PLUGIN_PATH");
    fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_F(CommPluginDir, MissingPluginNamesEveryPlaceTried) {
  test::expect_error(
      [] { runtime::load_comm_plugin("nope"); }, Status::plugin,
      {"no usable libbraid-nope.so", "BRAID_PLUGIN_PATH", (dir_ / "libbraid-nope.so").string() + ": not found"});
}

TEST_F(CommPluginDir, ALibraryWithoutTheEntryPointIsReported) {
  fs::copy_file(BRAID_LIBRARY_PATH, dir_ / "libbraid-wrong.so");  // a real shared library, not a plugin
  test::expect_error(
      [] { runtime::load_comm_plugin("wrong"); }, Status::plugin,
      {"libbraid-wrong.so: does not export braidCommPlugin_v1 (not a braid communication plugin, or another version)"});
}

TEST_F(CommPluginDir, AFileThatIsNotALibraryIsReported) {
  std::ofstream(dir_ / "libbraid-text.so") << "not an ELF file\n";
  test::expect_error([] { runtime::load_comm_plugin("text"); }, Status::plugin,
                     {(dir_ / "libbraid-text.so").string() + ": cannot load"});
}

TEST_F(CommPluginDir, AnotherInterfaceVersionIsRefused) {
  fs::copy_file(BRAID_FAKE_COMM_PLUGIN_V2, dir_ / "libbraid-future.so");
  test::expect_error(
      [] { runtime::load_comm_plugin("future"); }, Status::plugin,
      {(dir_ / "libbraid-future.so").string() + ": incompatible: interface version 2, this braid reads version 1"});
}

TEST_F(CommPluginDir, AMissingFunctionIsRefused) {
  fs::copy_file(BRAID_FAKE_COMM_PLUGIN_EMPTY, dir_ / "libbraid-empty.so");
  test::expect_error([] { runtime::load_comm_plugin("empty"); }, Status::plugin,
                     {(dir_ / "libbraid-empty.so").string() +
                      ": incompatible: function last_error is NULL (version 1 requires every function)"});
}

// The host bootstrap in one process: a one-process all-gather is a copy.
int copy_allgather(const void* send, void* recv, std::size_t bytes, void* user) {
  ++*static_cast<int*>(user);
  std::memcpy(recv, send, bytes);
  return 0;
}
int duplicating_allgather(const void* send, void* recv, std::size_t bytes, void*) {
  std::memcpy(recv, send, bytes);  // a broken host: its own record twice
  std::memcpy(static_cast<char*>(recv) + bytes, send, bytes);
  return 0;
}
int silent_allgather(const void*, void*, std::size_t, void*) { return 0; }  // fills nothing
int failing_allgather(const void*, void*, std::size_t, void*) { return 7; }

TEST(HostBootstrap, OneProcessWorld) {
  int calls = 0;
  auto world = runtime::World::from_host(1, copy_allgather, &calls);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.local_rank(), 0);
  EXPECT_EQ(world.local_size(), 1);
  EXPECT_FALSE(world.has_communicator());
  test::expect_error([&] { world.communicator(); }, Status::unsupported, {"host does the communication"});
  test::expect_error([&] { world.group({0}); }, Status::unsupported, {"no communication plugin"});
}

TEST(HostBootstrap, BrokenCallbacksAreReported) {
  test::expect_error([] { runtime::World::from_host(1, failing_allgather, nullptr); }, Status::invalid_argument,
                     {"the host's all-gather callback failed (returned 7)"});
  test::expect_error([] { runtime::World::from_host(1, silent_allgather, nullptr); }, Status::invalid_argument,
                     {"record 0 of 1 returned by the host's all-gather is not a braid bootstrap record"});
  test::expect_error([] { runtime::World::from_host(2, duplicating_allgather, nullptr); }, Status::invalid_argument,
                     {"this process's record appears 2 times among the 2"});
  test::expect_error([] { runtime::World::from_host(0, copy_allgather, nullptr); }, Status::invalid_argument,
                     {"size 0 < 1"});
  test::expect_error([] { runtime::World::from_host(1, nullptr, nullptr); }, Status::invalid_argument,
                     {"callback is NULL"});
}

}  // namespace
}  // namespace braid
