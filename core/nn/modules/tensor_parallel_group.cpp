#include "core/nn/modules/tensor_parallel_group.hpp"

#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/tensor_parallel.hpp"

namespace braid::nn {
namespace {

// Adds bias (out) to every row of y (..., out) with the Ops alone: the bias broadcast by a
// row gather, then one add.
void add_bias(Ops& ops, const Tensor& bias, Tensor& y) {
  const int64_t out = bias.numel();
  const std::vector<int32_t> rows(static_cast<std::size_t>(y.numel() / out), 0);
  Tensor broadcast = gather_rows(ops, reshaped(bias, {1, out}), rows);
  broadcast.reshape(y.shape);
  ops.add(y, broadcast);
}

}  // namespace

void check_tensor_parallel(const TensorParallel& tp, const std::string& who) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    throw Error(Status::invalid_argument, who + ": tensor-parallel rank " + std::to_string(tp.rank) + " of " +
                                              std::to_string(tp.size) + " does not exist");
  if (tp.size > 1 && !tp.allreduce_sum)
    throw Error(Status::invalid_argument,
                who + ": tensor parallelism over " + std::to_string(tp.size) + " ranks needs an allreduce_sum");
}

void tp_allreduce(const TensorParallel& tp, Tensor& t) {
  if (tp.size > 1) tp.allreduce_sum(t);
}

Tensor column_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x, const TensorParallel& tp) {
  if (tp.size == 1) return layer.forward(ops, x);
  const Tensor weight = column_parallel_shard(layer.weight_param()->value, tp.rank, tp.size);
  const Parameter* bias = layer.bias_param();
  const Tensor bias_shard = bias ? column_parallel_shard(bias->value, tp.rank, tp.size) : Tensor();
  Tensor y;
  ops.linear_forward(x, weight, bias ? &bias_shard : nullptr, y);
  return y;
}

Tensor column_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x, const Tensor& dy_shard,
                                const TensorParallel& tp) {
  if (tp.size == 1) return layer.backward(ops, x, dy_shard);
  Parameter* weight = layer.weight_param();
  Parameter* bias = layer.bias_param();
  const Tensor weight_shard = column_parallel_shard(weight->value, tp.rank, tp.size);
  Tensor* full_dweight = weight->grad_or_null();
  Tensor* full_dbias = bias ? bias->grad_or_null() : nullptr;
  Tensor dweight = full_dweight ? Tensor(weight_shard.shape) : Tensor();
  Tensor dbias = full_dbias ? Tensor(Shape{weight_shard.dim(0)}) : Tensor();
  Tensor dx;
  ops.linear_backward(x, weight_shard, dy_shard, &dx, full_dweight ? &dweight : nullptr, full_dbias ? &dbias : nullptr);
  if (full_dweight) add_column_parallel_shard(*full_dweight, dweight, tp.rank, tp.size);
  if (full_dbias) add_column_parallel_shard(*full_dbias, dbias, tp.rank, tp.size);
  return dx;
}

Tensor row_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp) {
  if (tp.size == 1) return layer.forward(ops, x_shard);
  const Tensor weight = row_parallel_shard(layer.weight_param()->value, tp.rank, tp.size);
  Tensor y;
  ops.linear_forward(x_shard, weight, nullptr, y);
  tp.allreduce_sum(y);
  if (const Parameter* bias = layer.bias_param()) add_bias(ops, bias->value, y);
  return y;
}

Tensor row_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x_shard, const Tensor& dy,
                             const TensorParallel& tp) {
  if (tp.size == 1) return layer.backward(ops, x_shard, dy);
  Parameter* weight = layer.weight_param();
  Parameter* bias = layer.bias_param();
  const Tensor weight_shard = row_parallel_shard(weight->value, tp.rank, tp.size);
  Tensor* full_dweight = weight->grad_or_null();
  Tensor dweight = full_dweight ? Tensor(weight_shard.shape) : Tensor();
  Tensor dx;
  ops.linear_backward(x_shard, weight_shard, dy, &dx, full_dweight ? &dweight : nullptr,
                      bias ? bias->grad_or_null() : nullptr);
  if (full_dweight) add_row_parallel_shard(*full_dweight, dweight, tp.rank, tp.size);
  return dx;
}

}  // namespace braid::nn
