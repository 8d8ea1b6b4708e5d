// Row-wise and element-wise ops: layer norm, L2 normalisation, addition, GELU.
#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"
#include "core/nn/float4.hpp"
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
constexpr double kGeluWork = 40.0;  // rough cost of one element, for the thread split

// The tanh GELU as x * sigmoid(2u), u = sqrt(2/pi) (x + a x^3), since (1 + tanh(u)) / 2 =
// sigmoid(2u): one vectorised exp per element instead of a scalar tanh, and no cancellation
// in 1 + tanh(u) for negative x. s = sigmoid(2u) and 1 - s = e s with e = exp(-2u), exact
// where s is near 1. Each element on its own, the same in any lane: results do not depend
// on where an element sits or on the thread count.
struct GeluSigmoid {
  f4::F4 s, one_minus_s;
};

inline GeluSigmoid gelu_sigmoid(f4::F4 v) {
  const f4::F4 u = f4::splat(kGeluC) * (v + f4::splat(kGeluA) * v * v * v);
  const f4::F4 e = f4::exp4(f4::splat(-2.0f) * u);
  const f4::F4 s = f4::splat(1.0f) / (f4::splat(1.0f) + e);
  return {s, e * s};
}

}  // namespace

void HostOps::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, Tensor& y,
                                LayerNormSaved& saved) {
  const int64_t f = features_of(x, "layernorm_forward");
  expect_shape(gamma, {f}, "layernorm_forward", "gamma");
  expect_shape(beta, {f}, "layernorm_forward", "beta");
  const int64_t rows = x.numel() / f;
  prepare_output(y, x.shape);
  prepare_output(saved.mean, {rows});
  prepare_output(saved.rstd, {rows});
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
    prepare_output(*dx, x.shape);
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
  // Rows in order: a fixed summation order, four features at a time.
  float* dg = dgamma ? dgamma->ptr() : nullptr;
  float* db = dbeta ? dbeta->ptr() : nullptr;
  for (int64_t r = 0; r < rows && (dg || db); ++r) {
    const float* xr = x.ptr() + r * f;
    const float* dyr = dy.ptr() + r * f;
    const float m = mean[r], s = rstd[r];
    if (dg)
      f4::each4(
          f,
          [&](int64_t i) {
            f4::store(dg + i, f4::load(dg + i) + f4::load(dyr + i) * (f4::load(xr + i) - f4::splat(m)) * f4::splat(s));
          },
          [&](int64_t i) { dg[i] += dyr[i] * (xr[i] - m) * s; });
    if (db) f4::add_to(db, dyr, f);
  }
}

void HostOps::l2_normalize_forward(const Tensor& x, Tensor& y) {
  const int64_t f = features_of(x, "l2_normalize_forward");
  prepare_output(y, x.shape);
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
  prepare_output(dx, x.shape);
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
  f4::add_to(y.ptr(), x.ptr(), y.numel());
}

void HostOps::gelu_forward(const Tensor& x, Tensor& y) {
  prepare_output(y, x.shape);
  const float* in = x.ptr();
  float* out = y.ptr();
  parallel_for(threads_, x.numel(), chunk_for(kGeluWork), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + f4::kWidth <= end; i += f4::kWidth) {
      const f4::F4 v = f4::load(in + i);
      f4::store(out + i, v * gelu_sigmoid(v).s);
    }
    if (i < end) {
      const f4::F4 v = f4::load_tail(in + i, end - i, 0.0f);
      f4::store_tail(out + i, v * gelu_sigmoid(v).s, end - i);
    }
  });
}

void HostOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  expect_shape(dy, x.shape, "gelu_backward", "dy");
  prepare_output(dx, x.shape);
  const float* in = x.ptr();
  const float* d_out = dy.ptr();
  float* d_in = dx.ptr();
  // d/dv v s(2u) = s + 2 v s (1 - s) du/dv, with du/dv = sqrt(2/pi) (1 + 3 a v^2).
  auto derivative = [](f4::F4 v) {
    const GeluSigmoid g = gelu_sigmoid(v);
    const f4::F4 du = f4::splat(kGeluC) * (f4::splat(1.0f) + f4::splat(3.0f * kGeluA) * v * v);
    return g.s + f4::splat(2.0f) * v * g.s * g.one_minus_s * du;
  };
  parallel_for(threads_, x.numel(), chunk_for(kGeluWork), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + f4::kWidth <= end; i += f4::kWidth)
      f4::store(d_in + i, f4::load(d_out + i) * derivative(f4::load(in + i)));
    if (i < end)
      f4::store_tail(d_in + i,
                     f4::load_tail(d_out + i, end - i, 0.0f) * derivative(f4::load_tail(in + i, end - i, 0.0f)),
                     end - i);
  });
}

}  // namespace braid::nn
