// The NCCL plugin at world size 1 (one process, bootstrapped over the MPI plugin's world of
// one): every collective and dtype, a send to itself, a communicator made and freed, and a
// wait that reaches its deadline (its stream held by a host function) and aborts its
// communicator with a message. Skips, saying why, where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime/device_comm.hpp"
#include "core/runtime/world.hpp"

namespace braid {
namespace {

class Nccl : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return;
    world_ = std::make_unique<runtime::World>(runtime::World::from_plugin("mpi"));
    bootstrap_ = std::make_unique<runtime::WorldBootstrap>(*world_);
    plugin_ = runtime::load_device_comm_plugin("nccl");
    plugin_->init(bootstrap_->get());
  }
  static void TearDownTestSuite() {
    plugin_.reset();
    bootstrap_.reset();
    world_.reset();
  }
  void SetUp() override {
    if (!plugin_) GTEST_SKIP() << "no GPU: cudaGetDeviceCount found none";
  }

  const braid_comm_plugin_v2& api() { return plugin_->api(); }
  braid_comm_v2* world_comm() {
    braid_comm_v2* c = nullptr;
    plugin_->check(api().comm_world(&c), "comm_world");
    return c;
  }
  void wait(braid_comm_request_v2* r) { plugin_->check(api().wait(r, 30.0), "wait"); }

  template <typename T>
  static T* device_copy(const std::vector<T>& host) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    return static_cast<T*>(p);
  }
  template <typename T>
  static std::vector<T> host_copy(const T* device, std::size_t count) {
    std::vector<T> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  static std::unique_ptr<runtime::World> world_;
  static std::unique_ptr<runtime::WorldBootstrap> bootstrap_;
  static std::unique_ptr<runtime::DeviceCommPlugin> plugin_;
};

std::unique_ptr<runtime::World> Nccl::world_;
std::unique_ptr<runtime::WorldBootstrap> Nccl::bootstrap_;
std::unique_ptr<runtime::DeviceCommPlugin> Nccl::plugin_;

template <typename T>
void all_reduce_one(braid_comm_v2* c, const braid_comm_plugin_v2& api, int32_t dtype,
                    runtime::DeviceCommPlugin& plugin) {
  const std::vector<T> values = {T(3), T(-1), T(7), T(2)};
  for (int32_t op : {BRAID_COMM_SUM, BRAID_COMM_MAX, BRAID_COMM_MIN}) {
    T* d = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), values.size() * sizeof(T)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    braid_comm_request_v2* r = nullptr;
    plugin.check(api.iallreduce(c, d, d, values.size(), dtype, op, nullptr, &r), "iallreduce");
    plugin.check(api.wait(r, 30.0), "wait");
    std::vector<T> back(values.size());
    ASSERT_EQ(cudaMemcpy(back.data(), d, back.size() * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, values) << "dtype " << dtype << " op " << op << ": one rank's reduction is its own values";
    cudaFree(d);
  }
}

TEST_F(Nccl, WorldOfOne) {
  int32_t rank = -1, size = -1;
  plugin_->check(api().world(&rank, &size, nullptr, nullptr), "world");
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  plugin_->check(api().comm_size(world_comm(), &size), "comm_size");
  EXPECT_EQ(size, 1);
}

TEST_F(Nccl, EveryReductionAndDtype) {
  braid_comm_v2* c = world_comm();
  all_reduce_one<float>(c, api(), BRAID_COMM_FLOAT32, *plugin_);
  all_reduce_one<double>(c, api(), BRAID_COMM_FLOAT64, *plugin_);
  all_reduce_one<int32_t>(c, api(), BRAID_COMM_INT32, *plugin_);
  all_reduce_one<int64_t>(c, api(), BRAID_COMM_INT64, *plugin_);
}

TEST_F(Nccl, GatherBroadcastReduceScatterAndSelfSend) {
  braid_comm_v2* c = world_comm();
  const std::vector<float> values = {1.5f, -2.0f, 4.25f};
  float* a = device_copy(values);
  float* b = device_copy(std::vector<float>(3, 0.0f));
  braid_comm_request_v2* r = nullptr;
  plugin_->check(api().iallgather(c, a, b, 3 * sizeof(float), nullptr, &r), "iallgather");
  wait(r);
  EXPECT_EQ(host_copy(b, 3), values);
  plugin_->check(api().ibroadcast(c, a, 3 * sizeof(float), 0, nullptr, &r), "ibroadcast");
  wait(r);
  EXPECT_EQ(host_copy(a, 3), values);
  plugin_->check(api().ireduce_scatter(c, a, b, 3, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &r), "ireduce_scatter");
  wait(r);
  EXPECT_EQ(host_copy(b, 3), values);
  // To itself: the receive is issued after the send, and both run as one group.
  float* c_out = device_copy(std::vector<float>(3, 0.0f));
  braid_comm_request_v2 *send = nullptr, *recv = nullptr;
  plugin_->check(api().isend(c, a, 3 * sizeof(float), 0, 7, nullptr, &send), "isend");
  plugin_->check(api().irecv(c, c_out, 3 * sizeof(float), 0, 7, nullptr, &recv), "irecv");
  wait(recv);
  wait(send);
  EXPECT_EQ(host_copy(c_out, 3), values);
  plugin_->check(api().barrier(c, 30.0), "barrier");
  cudaFree(a);
  cudaFree(b);
  cudaFree(c_out);
}

// Holds a stream until opened: a host function enqueued on it waits for the flag, so work
// queued behind it cannot complete. (NCCL refuses a receive from itself without a send.)
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB hold(void* self) {
    while (!static_cast<StreamGate*>(self)->open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

TEST_F(Nccl, ADeadlineAbortsTheCommunicatorAndSaysWhat) {
  const int32_t me = 0;
  braid_comm_v2* c = nullptr;
  plugin_->check(api().comm_create(&me, 1, &c), "comm_create");
  float* d = device_copy(std::vector<float>(4, 0.0f));
  cudaStream_t stream = nullptr;  // its own: the gate holds it
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  StreamGate gate;
  ASSERT_EQ(cudaLaunchHostFunc(stream, StreamGate::hold, &gate), cudaSuccess);
  // Opened after the deadline whatever happens, in case the abort waits for the stream.
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    gate.open = true;
  });
  braid_comm_request_v2* r = nullptr;
  plugin_->check(api().iallreduce(c, d, d, 4, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, stream, &r), "iallreduce");
  EXPECT_NE(api().wait(r, 1.0), 0);
  const std::string why = api().last_error();
  EXPECT_NE(why.find("all-reduce of 4 elements did not complete within"), std::string::npos) << why;
  EXPECT_NE(why.find("aborted"), std::string::npos) << why;
  opener.join();
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_NE(api().iallreduce(c, d, d, 4, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, nullptr, &r), 0);
  EXPECT_NE(std::string(api().last_error()).find("was aborted"), std::string::npos) << api().last_error();
  plugin_->check(api().comm_free(c), "comm_free");
  cudaStreamDestroy(stream);
  cudaFree(d);
}

}  // namespace
}  // namespace braid
