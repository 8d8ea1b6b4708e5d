// Megatron tensor parallelism for the reference modules, on one rank of a TP group.
//
// Every rank holds the full parameter tensors (all build the model from the same seed) and
// computes only its shard: a column-parallel linear its slice of the output features, a
// row-parallel linear a partial sum over its slice of the input features. The weight slices
// are copied per call (the reference models are small). Gradients of a sharded parameter go
// into this rank's slice of the full .grad, the other slices left as they are (zero from this
// rank): summing the .grad over the group gives the full gradient. A row-parallel bias, added
// once after the all-reduce, gets its full gradient on every rank.
//
// The group's communication is a callback, so core/nn does not depend on the runtime.
#pragma once

#include <functional>

#include "core/nn/modules/layers.hpp"

namespace braid::nn {

struct TensorParallel {
  int rank = 0, size = 1;
  std::function<void(Tensor&)> allreduce_sum;  // in place, over the TP group; unused when size == 1
};

// Throws Error(invalid_argument) naming `who` unless 0 <= rank < size and, for size > 1,
// allreduce_sum is set.
void check_tensor_parallel(const TensorParallel& tp, const std::string& who);

// Sums `t` over the group in place; nothing when size == 1.
void tp_allreduce(const TensorParallel& tp, Tensor& t);

// Column-parallel: x (..., in) -> this rank's output features (..., out / size), bias slice
// included. With size 1 exactly layer.forward.
Tensor column_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x, const TensorParallel& tp);
// dy_shard (..., out / size). Adds the weight and bias gradients into this rank's rows of the
// full gradients; returns this rank's partial dx (..., in): the sum over ranks is dx.
Tensor column_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x, const Tensor& dy_shard,
                                const TensorParallel& tp);

// Row-parallel: x_shard (..., in / size), this rank's input features -> the full y (..., out):
// the partial products summed over the group (one all-reduce), then the bias. With size 1
// exactly layer.forward.
Tensor row_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp);
// dy (..., out), the same on every rank. Adds the weight gradient into this rank's columns
// and the full bias gradient; returns dx_shard (..., in / size).
Tensor row_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x_shard, const Tensor& dy,
                             const TensorParallel& tp);

}  // namespace braid::nn
