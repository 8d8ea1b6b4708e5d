// Row-wise and element-wise ops: layer norm, L2 normalisation, addition, GELU.
#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/parallel.hpp"

namespace braid::nn {
namespace {

int64_t features_of(const Tensor& x, const char* op) {
  if (x.rank() < 1 || x.dim(-1) == 0)
    throw Error(Status::invalid_argument,
                std::string(op) + ": x must have a non-empty last axis, got " + shape_string(x.shape));
  return x.dim(-1);
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr double kNormEps = 1e-12;  // F.normalize's eps

}  // namespace

void HostOps::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                LayerNormSaved& saved) {
  const int64_t f = features_of(x, "layernorm_forward");
  expect_shape(gamma, {f}, "layernorm_forward", "gamma");
  expect_shape(beta, {f}, "layernorm_forward", "beta");
  const int64_t rows = x.numel() / f;
  reset(y, x.shape);
  reset(saved.mean, {rows});
  reset(saved.rstd, {rows});
  parallel_for(threads_, rows, chunk_for(8.0 * f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x.ptr() + r * f;
      double sum = 0.0;  // two passes in double: no cancellation for rows with a large mean
      for (int64_t i = 0; i < f; ++i) sum += xr[i];
      const double mean = sum / f;
      double var = 0.0;
      for (int64_t i = 0; i < f; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      const auto rstd = static_cast<float>(1.0 / std::sqrt(var / f + eps));
      saved.mean.ptr()[r] = static_cast<float>(mean);
      saved.rstd.ptr()[r] = rstd;
      float* yr = y.ptr() + r * f;
      for (int64_t i = 0; i < f; ++i) yr[i] = (xr[i] - saved.mean.ptr()[r]) * rstd * gamma.ptr()[i] + beta.ptr()[i];
    }
  });
}

void HostOps::layernorm_backward(const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved, const Tensor& dy,
                                 Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  const int64_t f = features_of(x, "layernorm_backward");
  const int64_t rows = x.numel() / f;
  expect_shape(gamma, {f}, "layernorm_backward", "gamma");
  expect_shape(dy, x.shape, "layernorm_backward", "dy");
  expect_shape(saved.mean, {rows}, "layernorm_backward", "saved.mean");
  expect_shape(saved.rstd, {rows}, "layernorm_backward", "saved.rstd");
  if (dgamma) expect_shape(*dgamma, {f}, "layernorm_backward", "dgamma");
  if (dbeta) expect_shape(*dbeta, {f}, "layernorm_backward", "dbeta");
  const float* mean = saved.mean.ptr();
  const float* rstd = saved.rstd.ptr();
  if (dx) {
    reset(*dx, x.shape);
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
    parallel_for(threads_, rows, chunk_for(10.0 * f), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* xr = x.ptr() + r * f;
        const float* dyr = dy.ptr() + r * f;
        double sum_g = 0.0, sum_gx = 0.0;
        for (int64_t i = 0; i < f; ++i) {
          const double g = static_cast<double>(dyr[i]) * gamma.ptr()[i];
          sum_g += g;
          sum_gx += g * (xr[i] - mean[r]) * rstd[r];
        }
        const auto mean_g = static_cast<float>(sum_g / f), mean_gx = static_cast<float>(sum_gx / f);
        float* dxr = dx->ptr() + r * f;
        for (int64_t i = 0; i < f; ++i) {
          const float xhat = (xr[i] - mean[r]) * rstd[r];
          dxr[i] = rstd[r] * (dyr[i] * gamma.ptr()[i] - mean_g - xhat * mean_gx);
        }
      }
    });
  }
  for (int64_t r = 0; r < rows && (dgamma || dbeta); ++r) {  // rows in order: a fixed summation order
    const float* xr = x.ptr() + r * f;
    const float* dyr = dy.ptr() + r * f;
    for (int64_t i = 0; i < f; ++i) {
      if (dgamma) dgamma->ptr()[i] += dyr[i] * (xr[i] - mean[r]) * rstd[r];
      if (dbeta) dbeta->ptr()[i] += dyr[i];
    }
  }
}

void HostOps::l2_normalize_forward(const Tensor& x, Tensor& y) {
  const int64_t f = features_of(x, "l2_normalize_forward");
  reset(y, x.shape);
  for (int64_t r = 0; r < x.numel() / f; ++r) {
    const float* xr = x.ptr() + r * f;
    double sq = 0.0;
    for (int64_t i = 0; i < f; ++i) sq += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::max(std::sqrt(sq), kNormEps));
    for (int64_t i = 0; i < f; ++i) y.ptr()[r * f + i] = xr[i] * inv;
  }
}

void HostOps::l2_normalize_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t f = features_of(x, "l2_normalize_backward");
  expect_shape(dy, x.shape, "l2_normalize_backward", "dy");
  reset(dx, x.shape);
  for (int64_t r = 0; r < x.numel() / f; ++r) {
    const float* xr = x.ptr() + r * f;
    const float* dyr = dy.ptr() + r * f;
    double sq = 0.0, dot = 0.0;
    for (int64_t i = 0; i < f; ++i) {
      sq += static_cast<double>(xr[i]) * xr[i];
      dot += static_cast<double>(xr[i]) * dyr[i];
    }
    const double norm = std::sqrt(sq);
    float* dxr = dx.ptr() + r * f;
    if (norm <= kNormEps) {  // the clamped branch: y = x / eps is linear in x
      for (int64_t i = 0; i < f; ++i) dxr[i] = static_cast<float>(dyr[i] / kNormEps);
      continue;
    }
    // d(x/|x|) = (dy - y (y . dy)) / |x|
    const auto inv = static_cast<float>(1.0 / norm), proj = static_cast<float>(dot / sq);
    for (int64_t i = 0; i < f; ++i) dxr[i] = (dyr[i] - xr[i] * proj) * inv;
  }
}

void HostOps::add(Tensor& y, const Tensor& x) {
  expect_shape(x, y.shape, "add", "x");
  float* out = y.ptr();
  const float* in = x.ptr();
  for (int64_t i = 0; i < y.numel(); ++i) out[i] += in[i];
}

void HostOps::gelu_forward(const Tensor& x, Tensor& y) {
  reset(y, x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.ptr()[i];
    y.ptr()[i] = 0.5f * v * (1.0f + std::tanh(kGeluC * (v + kGeluA * v * v * v)));
  }
}

void HostOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  expect_shape(dy, x.shape, "gelu_backward", "dy");
  reset(dx, x.shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = x.ptr()[i];
    const float t = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx.ptr()[i] = dy.ptr()[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace braid::nn
