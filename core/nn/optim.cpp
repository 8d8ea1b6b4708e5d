#include "core/nn/optim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/common/error.hpp"

namespace braid::nn {

float clip_coefficient(double total_norm, float max_norm) {
  if (!(max_norm > 0.0f)) throw Error(Status::invalid_argument, "clip_grad_norm: max_norm must be positive");
  if (std::isnan(total_norm)) return std::numeric_limits<float>::quiet_NaN();
  return static_cast<float>(std::min(1.0, static_cast<double>(max_norm) / (total_norm + 1e-6)));
}

double clip_grad_norm(Ops& ops, std::span<Tensor* const> grads, float max_norm) {
  double sum = 0.0;  // in the given order: the same norm on every run
  for (const Tensor* g : grads) sum += ops.squared_norm(*g);
  const double norm = std::sqrt(sum);
  const float coefficient = clip_coefficient(norm, max_norm);
  if (clip_applies(coefficient))
    for (Tensor* g : grads) ops.scale(*g, coefficient);
  return norm;
}

void clamp_logit_scale_param(float& t) { t = std::clamp(t, 0.0f, static_cast<float>(kMaxLogitScaleParam)); }

}  // namespace braid::nn
