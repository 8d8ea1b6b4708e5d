#include "core/nn/tensor_parallel.hpp"

#include <algorithm>
#include <string>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

// The size of one shard of `size`, after checking the split is even.
int64_t shard_size(int64_t size, int shard, int shards, const char* op, const Tensor& t) {
  if (shards < 1 || shard < 0 || shard >= shards)
    throw Error(Status::invalid_argument, std::string(op) + ": shard " + std::to_string(shard) + " of " +
                                              std::to_string(shards) + " does not exist");
  if (size % shards != 0)
    throw Error(Status::invalid_argument, std::string(op) + ": " + std::to_string(shards) +
                                              " shards do not divide the split axis of " + shape_string(t.shape));
  return size / shards;
}

}  // namespace

Tensor column_parallel_shard(const Tensor& weight_or_bias, int shard, int shards) {
  const Tensor& t = weight_or_bias;
  if (t.rank() != 1 && t.rank() != 2)
    throw Error(Status::invalid_argument,
                "column_parallel_shard: expected a weight (out, in) or a bias (out), got " + shape_string(t.shape));
  const int64_t rows = shard_size(t.dim(0), shard, shards, "column_parallel_shard", t);
  const int64_t row_size = t.rank() == 2 ? t.dim(1) : 1;
  Shape shape = t.shape;
  shape[0] = rows;
  Tensor out(shape);
  const float* from = t.ptr() + shard * rows * row_size;  // the rows are contiguous
  std::copy(from, from + rows * row_size, out.ptr());
  return out;
}

Tensor row_parallel_shard(const Tensor& weight, int shard, int shards) {
  if (weight.rank() != 2)
    throw Error(Status::invalid_argument,
                "row_parallel_shard: expected a weight (out, in), got " + shape_string(weight.shape));
  const int64_t out_features = weight.dim(0), in = weight.dim(1);
  const int64_t cols = shard_size(in, shard, shards, "row_parallel_shard", weight);
  Tensor out({out_features, cols});
  for (int64_t r = 0; r < out_features; ++r) {
    const float* from = weight.ptr() + r * in + shard * cols;
    std::copy(from, from + cols, out.ptr() + r * cols);
  }
  return out;
}

void add_column_parallel_shard(Tensor& full, const Tensor& shard_grad, int shard, int shards) {
  if (full.rank() != 1 && full.rank() != 2)
    throw Error(
        Status::invalid_argument,
        "add_column_parallel_shard: expected a weight (out, in) or a bias (out), got " + shape_string(full.shape));
  const int64_t rows = shard_size(full.dim(0), shard, shards, "add_column_parallel_shard", full);
  Shape shape = full.shape;
  shape[0] = rows;
  expect_shape(shard_grad, shape, "add_column_parallel_shard", "shard_grad");
  float* to = full.ptr() + shard * shard_grad.numel();  // the rows are contiguous
  for (int64_t i = 0; i < shard_grad.numel(); ++i) to[i] += shard_grad.data[static_cast<std::size_t>(i)];
}

void add_row_parallel_shard(Tensor& full, const Tensor& shard_grad, int shard, int shards) {
  if (full.rank() != 2)
    throw Error(Status::invalid_argument,
                "add_row_parallel_shard: expected a weight (out, in), got " + shape_string(full.shape));
  const int64_t out_features = full.dim(0), in = full.dim(1);
  const int64_t cols = shard_size(in, shard, shards, "add_row_parallel_shard", full);
  expect_shape(shard_grad, {out_features, cols}, "add_row_parallel_shard", "shard_grad");
  for (int64_t r = 0; r < out_features; ++r) {
    float* to = full.ptr() + r * in + shard * cols;
    const float* from = shard_grad.ptr() + r * cols;
    for (int64_t c = 0; c < cols; ++c) to[c] += from[c];
  }
}

}  // namespace braid::nn
