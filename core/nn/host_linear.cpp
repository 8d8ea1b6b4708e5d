// Linear layers on OpenBLAS: every leading axis of x is folded into the GEMM's rows.
#include <algorithm>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/host_ops.hpp"

namespace braid::nn {
namespace {

// Rows of x (every axis but the last) after checking x against weight (out, in).
int64_t linear_rows(const Tensor& x, const Tensor& weight, const char* op) {
  if (weight.rank() != 2)
    throw Error(Status::invalid_argument,
                std::string(op) + ": weight must be (out, in), got " + shape_string(weight.shape));
  if (x.rank() < 1 || x.dim(-1) != weight.dim(1))
    throw Error(Status::invalid_argument, std::string(op) + ": x " + shape_string(x.shape) + " does not end in the " +
                                              std::to_string(weight.dim(1)) + " input features of weight " +
                                              shape_string(weight.shape));
  return x.numel() / weight.dim(1);
}

}  // namespace

void HostOps::linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) {
  const int64_t rows = linear_rows(x, weight, "linear_forward");
  const int64_t in = weight.dim(1), out = weight.dim(0);
  if (bias) expect_shape(*bias, {out}, "linear_forward", "bias");
  Shape shape = x.shape;
  shape.back() = out;
  prepare_output(y, shape);
  if (bias)  // y starts as the bias, the GEMM adds x W^T to it
    for (int64_t r = 0; r < rows; ++r) std::copy(bias->ptr(), bias->ptr() + out, y.ptr() + r * out);
  gemm(false, true, rows, out, in, 1.0f, x.ptr(), in, weight.ptr(), in, bias ? 1.0f : 0.0f, y.ptr(), out);
}

void HostOps::linear_backward(const Tensor& x, const Tensor& weight, const Tensor& dy, Tensor* dx, Tensor* dweight,
                              Tensor* dbias) {
  const int64_t rows = linear_rows(x, weight, "linear_backward");
  const int64_t in = weight.dim(1), out = weight.dim(0);
  Shape y_shape = x.shape;
  y_shape.back() = out;
  expect_shape(dy, y_shape, "linear_backward", "dy");
  if (dweight) expect_shape(*dweight, weight.shape, "linear_backward", "dweight");
  if (dbias) expect_shape(*dbias, {out}, "linear_backward", "dbias");
  if (dx) {
    prepare_output(*dx, x.shape);
    gemm(false, false, rows, in, out, 1.0f, dy.ptr(), out, weight.ptr(), in, 0.0f, dx->ptr(), in);
  }
  if (dweight) gemm(true, false, out, in, rows, 1.0f, dy.ptr(), out, x.ptr(), in, 1.0f, dweight->ptr(), in);
  if (dbias)  // row by row, so each sum runs over the rows in order whatever the width
    for (int64_t r = 0; r < rows; ++r) f4::add_to(dbias->ptr(), dy.ptr() + r * out, out);
}

}  // namespace braid::nn
