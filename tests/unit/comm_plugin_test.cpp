// The communication plugin loader against files that must be refused (missing, not a
// plugin, another interface version, missing functions), Communicator over fake plugins
// with and without the optional ireduce_scatter, and the host bootstrap of World in one
// process. The MPI plugin itself runs in tests/mpi, under mpiexec.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

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
                      ": incompatible: function last_error is NULL (version 1 requires every function up to abort)"});
}

// The fake plugins are rank 1 of 2 whose rank 0 sends what this rank sends: a sum is twice
// this rank's values, and this rank's block of a reduce-scatter is the second half of send.
const std::vector<float> kSend = {1, 2, 3, 4, 5, 6, 7, 8};
const std::vector<float> kRankOneSum = {10, 12, 14, 16};
const std::string kBoth = "this 2-rank communicator (world ranks 0,1)";

TEST_F(CommPluginDir, ReduceScatterThroughThePlugin) {
  fs::copy_file(BRAID_FAKE_COMM_PLUGIN_WORLD, dir_ / "libbraid-fake.so");
  EXPECT_NE(runtime::load_comm_plugin("fake")->api().ireduce_scatter, nullptr);
  auto world = runtime::World::from_plugin("fake");
  runtime::Communicator& comm = world.communicator();
  ASSERT_EQ(comm.rank(), 1);
  ASSERT_EQ(comm.size(), 2);
  std::vector<float> recv(4, -1);
  runtime::Request request = comm.ireduce_scatter<float>(kSend, recv);
  EXPECT_EQ(request.description(), "ireduce_scatter of 4 elements per rank over " + kBoth);
  request.wait();
  EXPECT_EQ(recv, kRankOneSum);
  std::vector<double> send = {1, -2, 3, -4}, mine(2);
  comm.reduce_scatter<double>(send, mine, runtime::ReduceOp::max);
  EXPECT_EQ(mine, (std::vector<double>{3, -4}));

  test::expect_error([&] { comm.ireduce_scatter<float>(std::span(kSend).first(7), recv); }, Status::invalid_argument,
                     {"Communicator::ireduce_scatter: send has 7 elements, " + kBoth + " reduce-scatters 2 x 4"});
  std::vector<float> both(kSend);
  test::expect_error([&] { comm.ireduce_scatter<float>(both, std::span(both).subspan(4)); }, Status::invalid_argument,
                     {"Communicator::ireduce_scatter: send and recv overlap"});
}

// Without ireduce_scatter (NULL, or a table from before it was appended, which the loader
// must not read past): an all-reduce into a buffer the request owns, then this rank's
// block copied out once the request completes, however it completes.
TEST_F(CommPluginDir, ReduceScatterFallsBackToAnAllReduce) {
  const std::pair<std::string, const char*> plugins[] = {{"null", BRAID_FAKE_COMM_PLUGIN_NO_REDUCE_SCATTER},
                                                         {"old", BRAID_FAKE_COMM_PLUGIN_OLD}};
  for (const auto& [name, library] : plugins) {
    SCOPED_TRACE(name);
    fs::copy_file(library, dir_ / ("libbraid-" + name + ".so"));
    EXPECT_EQ(runtime::load_comm_plugin(name)->api().ireduce_scatter, nullptr);
    auto world = runtime::World::from_plugin(name);
    runtime::Communicator& comm = world.communicator();
    std::vector<float> recv(4, -1);
    runtime::Request request = comm.ireduce_scatter<float>(kSend, recv);
    EXPECT_EQ(request.description(), "ireduce_scatter of 4 elements per rank over " + kBoth +
                                         " (through iallreduce: the plugin has no ireduce_scatter)");
    runtime::Request moved = std::move(request);  // the buffer goes with it
    EXPECT_FALSE(moved.test());                   // the fakes complete on the second test()
    EXPECT_EQ(recv, std::vector<float>(4, -1));
    EXPECT_TRUE(moved.test());
    EXPECT_EQ(recv, kRankOneSum);

    std::vector<std::int64_t> send = {1, 2, 3, 4, 5, 6}, mine(3);
    comm.reduce_scatter<std::int64_t>(send, mine);
    EXPECT_EQ(mine, (std::vector<std::int64_t>{8, 10, 12}));
    { runtime::Request dropped = comm.ireduce_scatter<float>(kSend, recv, runtime::ReduceOp::min); }
    EXPECT_EQ(recv, (std::vector<float>{5, 6, 7, 8}));
  }
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
