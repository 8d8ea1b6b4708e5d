// Multi-head softmax attention with materialised probabilities (the reference: simple and
// exact; a fused kernel belongs to the device implementation). Work is split over the
// (batch, head) pairs, each done whole by one thread with per-head GEMMs that read the
// head's features in place through the leading dimension H*D.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/parallel.hpp"

namespace braid::nn {
namespace {

struct Dims {
  int64_t batch, sq, sk, heads, head_dim, width;  // width = heads * head_dim
};

Dims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                    const char* op) {
  const std::string name(op);
  if (q.rank() != 3 || k.rank() != 3)
    throw Error(Status::invalid_argument,
                name + ": q and k must be (B, S, H*D), got " + shape_string(q.shape) + " and " + shape_string(k.shape));
  Dims d{q.dim(0), q.dim(1), k.dim(1), options.heads, 0, q.dim(2)};
  if (d.heads < 1 || d.width % d.heads != 0 || d.width == 0)
    throw Error(Status::invalid_argument, name + ": " + std::to_string(d.heads) + " heads do not divide the " +
                                              std::to_string(d.width) + " features of q");
  d.head_dim = d.width / d.heads;
  expect_shape(k, {d.batch, d.sk, d.width}, op, "k");
  expect_shape(v, {d.batch, d.sk, d.width}, op, "v");
  if (d.sk == 0 && d.sq > 0)
    throw Error(Status::invalid_argument, name + ": queries need at least one key to attend to");
  if (options.causal && d.sq != d.sk)
    throw Error(Status::invalid_argument, name + ": causal attention needs as many queries as keys, got " +
                                              std::to_string(d.sq) + " and " + std::to_string(d.sk));
  return d;
}

// Keys query i may attend to: all, or 0..i when causal.
int64_t visible(const Dims& d, bool causal, int64_t i) { return causal ? i + 1 : d.sk; }

}  // namespace

void HostOps::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                Tensor& out, AttentionSaved& saved) {
  const Dims d = attention_dims(q, k, v, options, "attention_forward");
  prepare_output(out, q.shape);
  prepare_output(saved.probs, {d.batch, d.heads, d.sq, d.sk});
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const double work = 4.0 * static_cast<double>(d.sq) * d.sk * d.head_dim;
  parallel_for(threads_, d.batch * d.heads, chunk_for(work), [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.heads, h = bh % d.heads;
      const float* qh = q.ptr() + b * d.sq * d.width + h * d.head_dim;
      const float* kh = k.ptr() + b * d.sk * d.width + h * d.head_dim;
      const float* vh = v.ptr() + b * d.sk * d.width + h * d.head_dim;
      float* p = saved.probs.ptr() + bh * d.sq * d.sk;
      gemm(false, true, d.sq, d.sk, d.head_dim, scale, qh, d.width, kh, d.width, 0.0f, p, d.sk);
      for (int64_t i = 0; i < d.sq; ++i) {
        float* row = p + i * d.sk;
        const int64_t n = visible(d, options.causal, i);
        const float top = *std::max_element(row, row + n);
        double sum = 0.0;
        for (int64_t j = 0; j < n; ++j) sum += row[j] = std::exp(row[j] - top);
        const auto inv = static_cast<float>(1.0 / sum);
        for (int64_t j = 0; j < n; ++j) row[j] *= inv;
        std::fill(row + n, row + d.sk, 0.0f);  // masked keys: probability exactly zero
      }
      gemm(false, false, d.sq, d.head_dim, d.sk, 1.0f, p, d.sk, vh, d.width, 0.0f,
           out.ptr() + b * d.sq * d.width + h * d.head_dim, d.width);
    }
  });
}

void HostOps::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                                 const AttentionSaved& saved, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const Dims d = attention_dims(q, k, v, options, "attention_backward");
  expect_shape(saved.probs, {d.batch, d.heads, d.sq, d.sk}, "attention_backward", "saved.probs");
  expect_shape(dout, q.shape, "attention_backward", "dout");
  prepare_output(dq, q.shape);
  prepare_output(dk, k.shape);
  prepare_output(dv, v.shape);
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  const double work = 8.0 * static_cast<double>(d.sq) * d.sk * d.head_dim;
  parallel_for(threads_, d.batch * d.heads, chunk_for(work), [&](int64_t begin, int64_t end) {
    std::vector<float> ds(static_cast<std::size_t>(d.sq * d.sk));  // dP, then dS in place
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.heads, h = bh % d.heads;
      const int64_t q_at = b * d.sq * d.width + h * d.head_dim, k_at = b * d.sk * d.width + h * d.head_dim;
      const float* p = saved.probs.ptr() + bh * d.sq * d.sk;
      // out = P V: dV = P^T dout, dP = dout V^T.
      gemm(true, false, d.sk, d.head_dim, d.sq, 1.0f, p, d.sk, dout.ptr() + q_at, d.width, 0.0f, dv.ptr() + k_at,
           d.width);
      gemm(false, true, d.sq, d.sk, d.head_dim, 1.0f, dout.ptr() + q_at, d.width, v.ptr() + k_at, d.width, 0.0f,
           ds.data(), d.sk);
      // Softmax backward per row: dS = P * (dP - sum_j P dP); masked entries have P = 0.
      for (int64_t i = 0; i < d.sq; ++i) {
        const float* pr = p + i * d.sk;
        float* row = ds.data() + i * d.sk;
        double dot = 0.0;
        for (int64_t j = 0; j < d.sk; ++j) dot += static_cast<double>(pr[j]) * row[j];
        for (int64_t j = 0; j < d.sk; ++j) row[j] = pr[j] * (row[j] - static_cast<float>(dot));
      }
      // S = scale Q K^T: dQ = scale dS K, dK = scale dS^T Q.
      gemm(false, false, d.sq, d.head_dim, d.sk, scale, ds.data(), d.sk, k.ptr() + k_at, d.width, 0.0f, dq.ptr() + q_at,
           d.width);
      gemm(true, false, d.sk, d.head_dim, d.sq, scale, ds.data(), d.sk, q.ptr() + q_at, d.width, 0.0f, dk.ptr() + k_at,
           d.width);
    }
  });
}

}  // namespace braid::nn
