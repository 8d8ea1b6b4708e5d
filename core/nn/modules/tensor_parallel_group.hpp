// Megatron tensor parallelism for the reference modules, on one rank of a TP group.
//
// A rank holds only its slice of each split parameter (Parameter::slice): a column-parallel
// linear the rows of its output features (weight and bias), a row-parallel linear the columns
// of its input features, a vocabulary-parallel embedding or LM head the rows of its share of
// the vocabulary. Gradients and optimizer state are of the slice alone. Every other parameter
// (norms, position tables, row-parallel biases) is replicated: each rank computes the same
// gradient for it from the same inputs, so no gradient crosses the TP group (under sequence
// parallelism the norms see 1/size of the positions, and their gradients are summed).
//
// A module splits its parameters when given a TP group (set_tensor_parallel) and puts the
// whole tensors back, gathering the slices over the group, when given size 1. Parameters are
// created whole on every rank from one seed, so the slices of all ranks make the same model.
//
// The group's communication is a callback, so core/nn does not depend on the runtime.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/modules/layers.hpp"

namespace braid::nn {

struct TensorParallel {
  TensorParallel() = default;
  TensorParallel(int rank_, int size_, std::function<void(Tensor&)> allreduce_sum_)
      : rank(rank_), size(size_), allreduce_sum(std::move(allreduce_sum_)) {}

  int rank = 0, size = 1;
  std::function<void(Tensor&)> allreduce_sum;  // in place, over the TP group; unused when size == 1
  // Megatron's sequence parallelism (Korthikanti et al. 2022): between a block's tensor-parallel
  // regions (norms, residuals) each rank keeps 1/size of every sequence; an all-gather along the
  // sequence replaces the identity before a column-parallel layer, a reduce-scatter the
  // all-reduce after a row-parallel one. The two collectives over the group, on flat buffers:
  // every rank's `mine` in rank order into `all` (size x mine.size()); `all` summed over the
  // group, this rank's block of it into `mine`.
  bool sequence_parallel = false;
  std::function<void(std::span<const float> mine, std::span<float> all)> allgather;
  std::function<void(std::span<const float> all, std::span<float> mine)> reduce_scatter;
  bool splits_sequence() const { return sequence_parallel && size > 1; }
  // Where the group's tensors live, when not in host memory: the Ops of a device. The
  // sequence splits, the vocabulary-parallel loss and the slice gathers work on host memory,
  // and stage such tensors through it (and the callbacks above get host memory).
  Ops* ops = nullptr;
};

// For the helpers that work on host memory: `t` itself when it is host memory, else its
// host copy in `scratch`; and a host tensor moved to where tp's tensors live.
const Tensor& host_view(const TensorParallel& tp, const Tensor& t, Tensor& scratch);
Tensor to_group_device(const TensorParallel& tp, Tensor host);

// Throws Error(invalid_argument) naming `who` unless 0 <= rank < size and, for size > 1,
// allreduce_sum is set.
void check_tensor_parallel(const TensorParallel& tp, const std::string& who);

// Sums `t` over the group in place; nothing when size == 1.
void tp_allreduce(const TensorParallel& tp, Tensor& t);

// Sequence parallelism on (B, S, H) tensors, S a multiple of tp.size: this rank's positions
// [rank S/size, (rank + 1) S/size) of every sequence; the whole sequences from every rank's
// (B, S/size, H) (an all-gather); a (B, S, H) summed over the group, this rank's positions kept
// (a reduce-scatter).
Tensor sequence_shard(const Tensor& x, const TensorParallel& tp);
Tensor sequence_allgather(const Tensor& shard, const TensorParallel& tp);
Tensor sequence_reduce_scatter(const Tensor& x, const TensorParallel& tp);

// A parameter tensor parallelism splits, and along which axis (0: rows, 1: columns).
struct TpSplit {
  Parameter* param = nullptr;
  int axis = 0;
};

// Slice `slice` of a whole tensor (the tensor itself when the slice is all of it).
Tensor cut_slice(const Tensor& whole, const TensorSlice& slice);

// Makes every parameter of `splits` what `to` holds of it: its slice when to.size > 1, else the
// whole tensor. A parameter sliced for `from` is first made whole by summing its slices over
// from's group (every rank of that group must call this, in the same order); one already as
// `to` wants it is left alone. Gradients follow the values' shapes and start at zero.
void retarget_tensor_parallel(std::span<const TpSplit> splits, const TensorParallel& from, const TensorParallel& to);

// What a module with tensor-parallel parts keeps: its group and the parameters it splits.
// set() checks the group, then slices (or gathers) the parameters; detach() forgets the
// callback (the owner of the group is going away) and keeps the slices.
class TensorParallelState {
 public:
  const TensorParallel& group() const { return tp_; }
  void set(TensorParallel tp, std::span<const TpSplit> splits, const std::string& who);
  void detach() {
    tp_.allreduce_sum = nullptr;
    tp_.allgather = nullptr;
    tp_.reduce_scatter = nullptr;
    tp_.ops = nullptr;
  }

 private:
  TensorParallel tp_;
};

// Column-parallel: x (..., in) -> this rank's output features (..., out / size), bias slice
// included; the layer's weight (and bias) must be sliced by rows for this rank. With size 1
// exactly layer.forward.
Tensor column_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x, const TensorParallel& tp);
// dy_shard (..., out / size). Adds the gradients of this rank's slices; returns this rank's
// partial dx (..., in): the sum over ranks is dx.
Tensor column_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x, const Tensor& dy_shard,
                                const TensorParallel& tp);

// Row-parallel with sequence parallelism: x_shard (B, S, in / size) -> this rank's positions
// of the full y (B, S / size, out): the partial products reduce-scattered along the sequence,
// then the (replicated) bias.
Tensor row_parallel_forward_scatter(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp);

// Row-parallel: x_shard (..., in / size), this rank's input features -> the full y (..., out):
// the partial products summed over the group (one all-reduce), then the (replicated) bias. The
// weight must be sliced by columns for this rank. With size 1 exactly layer.forward.
Tensor row_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp);
// dy (..., out), the same on every rank. Adds the gradient of this rank's weight columns and
// the full bias gradient; returns dx_shard (..., in / size).
Tensor row_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x_shard, const Tensor& dy,
                             const TensorParallel& tp);

// The TP splits of a column- then row-parallel linear.
void add_column_parallel(std::vector<TpSplit>& splits, const Linear& layer);
void add_row_parallel(std::vector<TpSplit>& splits, const Linear& layer);

// Throws Error(invalid_argument) naming `who` unless tp.size divides the vocabulary.
void check_vocabulary_split(int64_t vocab, const TensorParallel& tp, const std::string& who);

// Vocabulary-parallel embedding (Megatron): `table` (vocab, E) sliced by rows, rank r holding
// ids [r V/size, (r+1) V/size). Each rank gathers the rows of the ids it holds, zero for the
// others, and one all-reduce sums them: the (n, E) rows of `ids`.
Tensor vocab_parallel_embedding_forward(Ops& ops, const Parameter& table, std::span<const int32_t> ids,
                                        const TensorParallel& tp);
// Adds the rows of d_rows (n, E) into the gradient of the table rows this rank holds.
void vocab_parallel_embedding_backward(Ops& ops, Parameter& table, std::span<const int32_t> ids, const Tensor& d_rows,
                                       const TensorParallel& tp);

// Cross-entropy over logits split by vocabulary (Megatron's vocab-parallel cross-entropy):
// logits (..., V / size) are this rank's columns [r V/size, (r+1) V/size) of the whole (..., V).
// The row maxima, the sums of exponentials and the targets' logits cross the group through
// all-reduces; the loss (the same on every rank) and this rank's columns of d loss / d logits
// equal Ops::cross_entropy of the whole logits. With size 1 exactly Ops::cross_entropy.
float vocab_parallel_cross_entropy(Ops& ops, const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                                   Tensor* dlogits, const TensorParallel& tp);

}  // namespace braid::nn
