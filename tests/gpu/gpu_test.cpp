// GPU tests: run where a GPU is present, skip with the reason where not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>

#include "core/common/scoped_env.hpp"
#include "core/nn/device_backend.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid {
namespace {

// Needs no GPU: the switches are checked before the driver is.
TEST(CudaSwitches, ASettingOtherThan0Or1IsRefusedByName) {
  for (const char* name : {"BRAID_CUDA_TF32", "BRAID_CUDA_FUSED_ATTENTION"}) {
    const ScopedEnv setting(name, "yes");
    auto plugin = runtime::load_device_plugin("cuda");
    EXPECT_NE(plugin->unavailable_reason().find(std::string(name) + " is 'yes'"), std::string::npos)
        << plugin->unavailable_reason();
  }
}

// Run by ctest's gpu.fused_attention, under BRAID_CUDA_FUSED_ATTENTION=1: attention keeps each
// query row's output and log-sum-exp, (B, H, Sq, d + 1), not the (B, H, Sq, Sk) probabilities.
TEST(CudaFusedAttention, SavesRowsNotScores) {
  const char* on = std::getenv("BRAID_CUDA_FUSED_ATTENTION");
  if (!on || std::string(on) != "1")
    GTEST_SKIP() << "BRAID_CUDA_FUSED_ATTENTION is not 1 (ctest gpu.fused_attention sets it)";
  if (runtime::load_device_plugin("cuda")->devices().empty()) GTEST_SKIP() << "no GPU";
  auto backend = nn::DeviceBackend::open("cuda");
  nn::DeviceOps ops(backend);
  const nn::Tensor x = backend->upload(nn::Tensor({2, 300, 64}, std::vector<float>(2 * 300 * 64, 0.01f)));
  nn::Tensor out;
  nn::AttentionSaved saved;
  ops.attention_forward(x, x, x, {4, true}, out, saved);
  EXPECT_EQ(saved.probs.shape, (nn::Shape{2, 4, 300, 17}));
}

// The largest difference of a (256 x 1024) x (1024 x 256) linear layer on the GPU from the
// host's, relative to the largest element, under a BRAID_CUDA_TF32 setting.
double linear_difference(const char* setting) {
  const ScopedEnv tf32("BRAID_CUDA_TF32", setting);
  auto backend = nn::DeviceBackend::open("cuda");
  nn::DeviceOps ops(backend);
  nn::HostOps host;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  nn::Tensor x({256, 1024}), w({256, 1024}), y, y_d;
  for (float& v : x.data) v = u(rng);
  for (float& v : w.data) v = u(rng);
  host.linear_forward(x, w, nullptr, y);
  ops.linear_forward(backend->upload(x), backend->upload(w), nullptr, y_d);
  const nn::Tensor got = backend->download(y_d);
  double diff = 0, top = 0;
  for (std::size_t i = 0; i < y.data.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got.data[i]) - y.data[i]));
    top = std::max(top, std::abs(static_cast<double>(y.data[i])));
  }
  return diff / top;
}

TEST(CudaTf32, GemmsRoundAsAsked) {
  if (runtime::load_device_plugin("cuda")->devices().empty()) GTEST_SKIP() << "no GPU";
  EXPECT_LE(linear_difference("0"), 1e-5) << "strict fp32 by default";
  const double tf32 = linear_difference("1");
  EXPECT_GT(tf32, 1e-5) << "BRAID_CUDA_TF32=1 should round the GEMM's inputs to TF32";
  EXPECT_LE(tf32, 1e-2);
}

TEST(Gpu, EveryDeviceComputes) {
  auto plugin = runtime::load_device_plugin("cuda");
  auto devices = plugin->devices();
  if (devices.empty()) {
    GTEST_SKIP() << "no GPU: " << (plugin->unavailable_reason().empty() ? "0 devices" : plugin->unavailable_reason());
  }
  for (std::size_t i = 0; i < devices.size(); ++i) {
    SCOPED_TRACE(devices[i].name);
    EXPECT_GT(devices[i].memory_bytes, 1e9);
    EXPECT_GT(devices[i].multiprocessors, 0);
    EXPECT_GE(devices[i].compute_major, 8);  // the kernels are built for sm_80 and sm_90
    EXPECT_NO_THROW(plugin->self_test(static_cast<int>(i)));
  }
}

}  // namespace
}  // namespace braid
