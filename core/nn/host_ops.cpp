// HostOps construction and the optimizer ops; the other ops live in host_*.cpp by kind.
#include <algorithm>
#include <array>
#include <cmath>
#include <thread>

#include "core/common/error.hpp"
#include "core/nn/float4.hpp"
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
  using f4::F4, f4::load, f4::splat, f4::store;
  f4::each4(
      param.numel(),
      [&](int64_t i) {
        const F4 gi = load(g + i);
        const F4 mi = splat(beta1) * load(m + i) + splat(rest1) * gi;
        const F4 vi = splat(beta2) * load(v + i) + splat(rest2) * gi * gi;
        const F4 pi = load(p + i) * splat(decay);
        store(m + i, mi);
        store(v + i, vi);
        store(p + i, pi - splat(step_size) * mi / (f4::sqrt4(vi) / splat(sqrt_correction2) + splat(eps)));
      },
      [&](int64_t i) {
        p[i] *= decay;
        m[i] = beta1 * m[i] + rest1 * g[i];
        v[i] = beta2 * v[i] + rest2 * g[i] * g[i];
        p[i] -= step_size * m[i] / (std::sqrt(v[i]) / sqrt_correction2 + eps);
      });
}

double HostOps::squared_norm(const Tensor& t) {
  // Eight partial sums added up in a fixed order: one running sum waits out every add's
  // latency (4x the cost model's streaming price here), and the order keeps runs bit-identical.
  // Lane l sums the elements at l modulo 8, two lanes to a vector of doubles, each vector a
  // variable of its own (GCC keeps an array of them in memory, 2.5x slower).
  typedef double D2 __attribute__((vector_size(16)));
  constexpr std::size_t kLanes = 8;
  D2 p0{}, p1{}, p2{}, p3{};
  const float* x = t.ptr();
  const std::size_t n = t.data.size(), whole = n - n % kLanes;
  for (std::size_t i = 0; i < whole; i += kLanes) {
    const D2 d0 = {x[i], x[i + 1]}, d1 = {x[i + 2], x[i + 3]}, d2 = {x[i + 4], x[i + 5]}, d3 = {x[i + 6], x[i + 7]};
    p0 += d0 * d0;
    p1 += d1 * d1;
    p2 += d2 * d2;
    p3 += d3 * d3;
  }
  std::array<double, kLanes> lanes = {p0[0], p0[1], p1[0], p1[1], p2[0], p2[1], p3[0], p3[1]};
  for (std::size_t i = whole; i < n; ++i) lanes[i - whole] += static_cast<double>(x[i]) * x[i];
  double sum = 0.0;
  for (double lane : lanes) sum += lane;
  return sum;
}

void HostOps::scale(Tensor& t, float factor) {
  float* x = t.ptr();
  f4::each4(
      t.numel(), [&](int64_t i) { f4::store(x + i, f4::load(x + i) * f4::splat(factor)); },
      [&](int64_t i) { x[i] *= factor; });
}

}  // namespace braid::nn
