// HostOps construction and the optimizer ops; the other ops live in host_*.cpp by kind.
#include <algorithm>
#include <array>
#include <cmath>
#include <thread>

#include "core/common/error.hpp"
#include "core/nn/host_ops.hpp"

namespace braid::nn {

HostOps::HostOps(int threads)
    : threads_(threads > 0 ? threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))) {}

void HostOps::adamw_step(Tensor& param, const Tensor& grad, AdamWState& state, const AdamWConfig& config) {
  expect_shape(grad, param.shape, "adamw_step", "grad");
  if (state.m.data.empty() && state.v.data.empty() && state.step == 0) {
    reset(state.m, param.shape);
    reset(state.v, param.shape);
  }
  expect_shape(state.m, param.shape, "adamw_step", "state.m");
  expect_shape(state.v, param.shape, "adamw_step", "state.v");
  ++state.step;
  // Every coefficient in double, then once to float (as torch.optim.AdamW's scalars).
  const double correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(state.step));
  const double correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(state.step));
  const auto decay = static_cast<float>(1.0 - config.lr * config.weight_decay);
  const auto beta1 = static_cast<float>(config.beta1), rest1 = static_cast<float>(1.0 - config.beta1);
  const auto beta2 = static_cast<float>(config.beta2), rest2 = static_cast<float>(1.0 - config.beta2);
  const auto step_size = static_cast<float>(config.lr / correction1);
  const auto sqrt_correction2 = static_cast<float>(std::sqrt(correction2));
  const auto eps = static_cast<float>(config.eps);
  float* p = param.ptr();
  float* m = state.m.ptr();
  float* v = state.v.ptr();
  const float* g = grad.ptr();
  for (int64_t i = 0; i < param.numel(); ++i) {
    p[i] *= decay;
    m[i] = beta1 * m[i] + rest1 * g[i];
    v[i] = beta2 * v[i] + rest2 * g[i] * g[i];
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) / sqrt_correction2 + eps);
  }
}

double HostOps::squared_norm(const Tensor& t) {
  // Eight partial sums added up in a fixed order: one running sum waits out every add's
  // latency (4x the cost model's streaming price here), and the order keeps runs bit-identical.
  constexpr std::size_t kLanes = 8;
  std::array<double, kLanes> lanes{};
  const float* x = t.ptr();
  const std::size_t n = t.data.size(), whole = n - n % kLanes;
  for (std::size_t i = 0; i < whole; i += kLanes)
    for (std::size_t l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]) * x[i + l];
  for (std::size_t i = whole; i < n; ++i) lanes[i - whole] += static_cast<double>(x[i]) * x[i];
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

void HostOps::scale(Tensor& t, float factor) {
  for (float& x : t.data) x *= factor;
}

}  // namespace braid::nn
