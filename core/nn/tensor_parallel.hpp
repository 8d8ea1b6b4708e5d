// Megatron-style tensor parallelism for linear layers y = x W^T + b, weight (out, in).
//
// Column-parallel: shard t of T holds rows [t*out/T, (t+1)*out/T) of W and of b, so it
// computes that slice of y's features from the full x; element-wise ops (GELU) follow
// without communication. Attention's Q, K, V projections split this way by heads.
// Row-parallel: shard t holds columns [t*in/T, (t+1)*in/T) of W, consumes the matching
// slice of its input (the column-parallel output) and yields a partial y; the sum of the
// partials over shards (an all-reduce) plus b, added once after the sum, is y.
// A column- then row-parallel pair (MLP, attention) needs one all-reduce forward, of y,
// and one backward, of dx of the column-parallel layer (each shard has a partial dx).
// Gradients of a shard are the same slices of the full gradients.
#pragma once

#include "core/nn/tensor.hpp"

namespace braid::nn {

// Rows of a weight (out, in) or elements of a bias (out) for column-parallel shard `shard`.
Tensor column_parallel_shard(const Tensor& weight_or_bias, int shard, int shards);
// Columns of a weight (out, in) for row-parallel shard `shard`.
Tensor row_parallel_shard(const Tensor& weight, int shard, int shards);

// The inverses for gradients: add a shard's gradient (the shape the functions above return)
// into its slice of the full gradient; the other slices are untouched.
void add_column_parallel_shard(Tensor& full, const Tensor& shard_grad, int shard, int shards);
void add_row_parallel_shard(Tensor& full, const Tensor& shard_grad, int shard, int shards);

}  // namespace braid::nn
