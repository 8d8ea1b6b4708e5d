#include "core/nn/modules/tensor_parallel_group.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/tensor_parallel.hpp"

namespace braid::nn {

const Tensor& host_view(const TensorParallel& tp, const Tensor& t, Tensor& scratch) {
  if (t.device().is_host()) return t;
  if (!tp.ops)
    throw Error(Status::internal, "tensor parallelism: a tensor on " + t.device().name() +
                                      " but the group has no Ops to bring it to the host");
  return on_host(*tp.ops, t, scratch);
}

Tensor to_group_device(const TensorParallel& tp, Tensor host) {
  return tp.ops ? tp.ops->from_host(std::move(host)) : host;
}

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

// Throws Error(internal) unless `p` holds the slice of `axis` this rank of `tp` should hold.
void expect_slice(const Parameter& p, int axis, const TensorParallel& tp) {
  const TensorSlice want{axis, tp.rank, tp.size};
  if (p.slice != want)
    throw Error(Status::internal, p.name + ": tensor parallelism over " + std::to_string(tp.size) +
                                      " ranks needs this rank's slice of it along axis " + std::to_string(axis) +
                                      "; set_tensor_parallel was not called with this group");
}

// The whole tensor from every rank's slice: each rank writes its slice into zeros, and the
// sum over the group (each element non-zero on one rank only) is exact.
Tensor gather_slices(const Parameter& p, const TensorParallel& from) {
  if (from.size != p.slice.count || from.rank != p.slice.index || !from.allreduce_sum)
    throw Error(Status::internal, p.name + ": its slice " + std::to_string(p.slice.index) + " of " +
                                      std::to_string(p.slice.count) + " cannot be gathered over the group given");
  Tensor whole(p.full_shape), scratch;
  const Tensor& value = host_view(from, p.value, scratch);
  if (p.slice.axis == 0)
    add_column_parallel_shard(whole, value, p.slice.index, p.slice.count);
  else
    add_row_parallel_shard(whole, value, p.slice.index, p.slice.count);
  from.allreduce_sum(whole);
  return whole;
}

// Every id a row of the whole table (each rank holds only its share: an id outside the
// table would match none and silently embed as zeros).
void check_ids(const Parameter& table, std::span<const int32_t> ids) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= table.full_shape[0])
      throw Error(Status::invalid_argument, table.name + ": id " + std::to_string(ids[i]) + " at " + std::to_string(i) +
                                                " is outside the vocabulary of " + std::to_string(table.full_shape[0]));
}

// The ids of `ids` this rank's share of the vocabulary holds: their rows in the table's slice
// and their positions in `ids`.
struct LocalRows {
  std::vector<int32_t> rows, at;
};
LocalRows local_rows(const Parameter& table, std::span<const int32_t> ids, const TensorParallel& tp) {
  const int64_t share = table.full_shape[0] / tp.size, begin = tp.rank * share;
  LocalRows out;
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= begin && ids[i] < begin + share) {
      out.rows.push_back(row_id(ids[i] - begin));
      out.at.push_back(row_id(static_cast<int64_t>(i)));
    }
  return out;
}

}  // namespace

void check_tensor_parallel(const TensorParallel& tp, const std::string& who) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    throw Error(Status::invalid_argument, who + ": tensor-parallel rank " + std::to_string(tp.rank) + " of " +
                                              std::to_string(tp.size) + " does not exist");
  if (tp.size > 1 && !tp.allreduce_sum)
    throw Error(Status::invalid_argument,
                who + ": tensor parallelism over " + std::to_string(tp.size) + " ranks needs an allreduce_sum");
  if (tp.splits_sequence() && (!tp.allgather || !tp.reduce_scatter))
    throw Error(Status::invalid_argument, who + ": sequence parallelism over " + std::to_string(tp.size) +
                                              " ranks needs an allgather and a reduce_scatter");
}

namespace {

// (B, S, H) and this rank's S / size, after checking the split.
std::array<int64_t, 4> sequence_split(const Tensor& x, const TensorParallel& tp, int64_t positions, const char* op) {
  if (x.rank() != 3 || positions % tp.size != 0)
    throw Error(Status::invalid_argument, std::string(op) + ": " + std::to_string(tp.size) +
                                              " ranks do not split the sequences of " + shape_string(x.shape));
  return {x.dim(0), positions, x.dim(2), positions / tp.size};
}

}  // namespace

Tensor sequence_shard(const Tensor& x_any, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& x = host_view(tp, x_any, scratch);
  const auto [b, s, h, part] = sequence_split(x, tp, x.rank() == 3 ? x.dim(1) : 0, "sequence_shard");
  Tensor out({b, part, h});
  for (int64_t i = 0; i < b; ++i) {
    const float* from = x.ptr() + (i * s + tp.rank * part) * h;
    std::copy(from, from + part * h, out.ptr() + i * part * h);
  }
  return to_group_device(tp, std::move(out));
}

Tensor sequence_allgather(const Tensor& shard_any, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& shard = host_view(tp, shard_any, scratch);
  const auto [b, s, h, part] =
      sequence_split(shard, tp, shard.rank() == 3 ? shard.dim(1) * tp.size : 0, "sequence_allgather");
  if (!tp.allgather) throw Error(Status::internal, "sequence parallelism: the group was detached (its owner is gone)");
  std::vector<float> all(static_cast<std::size_t>(shard.numel() * tp.size));  // rank-major, as reduce-scatter's
  tp.allgather(std::span<const float>(shard.data), all);
  Tensor out({b, s, h});
  for (int r = 0; r < tp.size; ++r)
    for (int64_t i = 0; i < b; ++i) {
      const float* from = all.data() + (static_cast<int64_t>(r) * b + i) * part * h;
      std::copy(from, from + part * h, out.ptr() + (i * s + r * part) * h);
    }
  return to_group_device(tp, std::move(out));
}

Tensor sequence_reduce_scatter(const Tensor& x_any, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& x = host_view(tp, x_any, scratch);
  const auto [b, s, h, part] = sequence_split(x, tp, x.rank() == 3 ? x.dim(1) : 0, "sequence_reduce_scatter");
  std::vector<float> all(x.data.size());  // rank-major: block r holds every sequence's positions of rank r
  for (int r = 0; r < tp.size; ++r)
    for (int64_t i = 0; i < b; ++i) {
      const float* from = x.ptr() + (i * s + r * part) * h;
      std::copy(from, from + part * h, all.data() + (static_cast<int64_t>(r) * b + i) * part * h);
    }
  Tensor out({b, part, h});
  if (!tp.reduce_scatter)
    throw Error(Status::internal, "sequence parallelism: the group was detached (its owner is gone)");
  tp.reduce_scatter(all, out.data);
  return to_group_device(tp, std::move(out));
}

void tp_allreduce(const TensorParallel& tp, Tensor& t) {
  if (tp.size == 1) return;
  if (!tp.allreduce_sum)
    throw Error(Status::internal, "tensor parallelism over " + std::to_string(tp.size) +
                                      " ranks: the group was detached (its owner is gone)");
  tp.allreduce_sum(t);
}

Tensor cut_slice(const Tensor& whole, const TensorSlice& slice) {
  if (slice.whole()) return whole;
  return slice.axis == 0 ? column_parallel_shard(whole, slice.index, slice.count)
                         : row_parallel_shard(whole, slice.index, slice.count);
}

void retarget_tensor_parallel(std::span<const TpSplit> splits, const TensorParallel& from, const TensorParallel& to) {
  const TensorParallel& staging = from.ops ? from : to;  // either knows where the tensors live
  for (const TpSplit& s : splits) {
    Parameter& p = *s.param;
    const TensorSlice want = to.size > 1 ? TensorSlice{s.axis, to.rank, to.size} : TensorSlice{};
    if (p.slice == want) continue;
    Tensor scratch;
    Tensor value = host_view(staging, p.value, scratch);
    if (!p.slice.whole()) {
      value = gather_slices(p, from);
      p.slice = {};
    }
    if (!want.whole()) {
      value = cut_slice(value, want);
      p.slice = want;
    }
    const Shape shape = value.shape;
    p.value = to_group_device(staging, std::move(value));
    if (p.trainable) p.grad = to_group_device(staging, Tensor(shape));
  }
}

void TensorParallelState::set(TensorParallel tp, std::span<const TpSplit> splits, const std::string& who) {
  check_tensor_parallel(tp, who);
  retarget_tensor_parallel(splits, tp_, tp);
  tp_ = std::move(tp);
}

void add_column_parallel(std::vector<TpSplit>& splits, const Linear& layer) {
  splits.push_back({layer.weight_param(), 0});
  if (layer.bias_param()) splits.push_back({layer.bias_param(), 0});
}

void add_row_parallel(std::vector<TpSplit>& splits, const Linear& layer) {
  splits.push_back({layer.weight_param(), 1});  // the bias is added once, after the sum: replicated
}

Tensor column_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x, const TensorParallel& tp) {
  if (tp.size == 1) return layer.forward(ops, x);
  const Parameter* bias = layer.bias_param();
  expect_slice(*layer.weight_param(), 0, tp);
  if (bias) expect_slice(*bias, 0, tp);
  Tensor y;
  ops.linear_forward(x, layer.weight_param()->value, bias ? &bias->value : nullptr, y);
  return y;
}

Tensor column_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x, const Tensor& dy_shard,
                                const TensorParallel& tp) {
  if (tp.size == 1) return layer.backward(ops, x, dy_shard);
  Parameter* weight = layer.weight_param();
  Parameter* bias = layer.bias_param();
  expect_slice(*weight, 0, tp);
  Tensor dx;
  ops.linear_backward(x, weight->value, dy_shard, &dx, weight->grad_or_null(), bias ? bias->grad_or_null() : nullptr);
  return dx;
}

Tensor row_parallel_forward(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp) {
  if (tp.size == 1) return layer.forward(ops, x_shard);
  expect_slice(*layer.weight_param(), 1, tp);
  Tensor y;
  ops.linear_forward(x_shard, layer.weight_param()->value, nullptr, y);
  tp_allreduce(tp, y);
  if (const Parameter* bias = layer.bias_param()) add_bias(ops, bias->value, y);
  return y;
}

Tensor row_parallel_forward_scatter(Ops& ops, const Linear& layer, const Tensor& x_shard, const TensorParallel& tp) {
  expect_slice(*layer.weight_param(), 1, tp);
  Tensor y;
  ops.linear_forward(x_shard, layer.weight_param()->value, nullptr, y);
  y = sequence_reduce_scatter(y, tp);
  if (const Parameter* bias = layer.bias_param()) add_bias(ops, bias->value, y);
  return y;
}

Tensor row_parallel_backward(Ops& ops, const Linear& layer, const Tensor& x_shard, const Tensor& dy,
                             const TensorParallel& tp) {
  if (tp.size == 1) return layer.backward(ops, x_shard, dy);
  Parameter* weight = layer.weight_param();
  Parameter* bias = layer.bias_param();
  expect_slice(*weight, 1, tp);
  Tensor dx;
  ops.linear_backward(x_shard, weight->value, dy, &dx, weight->grad_or_null(), bias ? bias->grad_or_null() : nullptr);
  return dx;
}

void check_vocabulary_split(int64_t vocab, const TensorParallel& tp, const std::string& who) {
  if (vocab % tp.size != 0)
    throw Error(Status::invalid_argument, who + ": vocabulary " + std::to_string(vocab) + " does not split over " +
                                              std::to_string(tp.size) + " tensor-parallel ranks");
}

Tensor vocab_parallel_embedding_forward(Ops& ops, const Parameter& table, std::span<const int32_t> ids,
                                        const TensorParallel& tp) {
  if (tp.size == 1) return gather_rows(ops, table.value, ids);
  expect_slice(table, 0, tp);
  check_ids(table, ids);
  const LocalRows local = local_rows(table, ids, tp);
  Tensor rows = zeros(ops, {static_cast<int64_t>(ids.size()), table.full_shape[1]});
  if (!local.rows.empty()) scatter_add_rows(ops, local.at, gather_rows(ops, table.value, local.rows), rows);
  tp_allreduce(tp, rows);
  return rows;
}

void vocab_parallel_embedding_backward(Ops& ops, Parameter& table, std::span<const int32_t> ids, const Tensor& d_rows,
                                       const TensorParallel& tp) {
  Tensor* grad = table.grad_or_null();
  if (!grad) return;
  const int64_t width = table.full_shape[1];
  const Tensor d = reshaped_view(d_rows, {static_cast<int64_t>(ids.size()), width});
  if (tp.size == 1) {
    scatter_add_rows(ops, ids, d, *grad);
    return;
  }
  expect_slice(table, 0, tp);
  const LocalRows local = local_rows(table, ids, tp);
  if (!local.rows.empty()) scatter_add_rows(ops, local.rows, gather_rows(ops, d, local.at), *grad);
}

namespace {

// The vocabulary-parallel loss on host memory (tp.size > 1).
float vocab_parallel_cross_entropy_on_host(const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                                           Tensor* dlogits, const TensorParallel& tp) {
  if (logits.rank() < 1 || logits.dim(-1) == 0)
    throw Error(
        Status::invalid_argument,
        "vocab_parallel_cross_entropy: logits must be (..., V / tp) with V > 0, got " + shape_string(logits.shape));
  const int64_t columns = logits.dim(-1), rows = logits.numel() / columns, vocab = columns * tp.size;
  const int64_t begin = tp.rank * columns;
  if (static_cast<int64_t>(targets.size()) != rows)
    throw Error(Status::invalid_argument, "vocab_parallel_cross_entropy: " + std::to_string(targets.size()) +
                                              " targets for " + std::to_string(rows) + " rows of logits " +
                                              shape_string(logits.shape));
  int64_t counted = 0;
  for (std::size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] == -1) continue;
    if (targets[r] < 0 || targets[r] >= vocab)
      throw Error(Status::invalid_argument, "vocab_parallel_cross_entropy: target " + std::to_string(targets[r]) +
                                                " of row " + std::to_string(r) + " is outside [0, " +
                                                std::to_string(vocab) + ") and is not the ignore index -1");
    ++counted;
  }
  if (normalizer < 0) throw Error(Status::invalid_argument, "vocab_parallel_cross_entropy: negative normalizer");
  const int64_t divide_by = normalizer > 0 ? normalizer : counted;
  if (dlogits) reset(*dlogits, logits.shape);
  if (divide_by == 0) return 0.0f;  // the same on every rank: the targets are
  const float* x = logits.ptr();
  // Each rank's row maxima in its own slot; the sum over the group lists them all.
  Tensor maxima({tp.size, rows});
  for (int64_t r = 0; r < rows; ++r)
    maxima.data[static_cast<std::size_t>(tp.rank * rows + r)] =
        *std::max_element(x + r * columns, x + (r + 1) * columns);
  tp_allreduce(tp, maxima);
  std::vector<float> top(static_cast<std::size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    float m = maxima.data[static_cast<std::size_t>(r)];
    for (int k = 1; k < tp.size; ++k) m = std::max(m, maxima.data[static_cast<std::size_t>(k * rows + r)]);
    top[static_cast<std::size_t>(r)] = m;
  }
  // Per row: the sum of exp(logit - max) over this rank's columns, and the target's
  // logit - max where this rank holds it (zero elsewhere); summed over the group.
  Tensor sums({2, rows});
  for (int64_t r = 0; r < rows; ++r) {
    const float m = top[static_cast<std::size_t>(r)];
    double s = 0.0;
    for (int64_t j = 0; j < columns; ++j) s += std::exp(static_cast<double>(x[r * columns + j] - m));
    sums.data[static_cast<std::size_t>(r)] = static_cast<float>(s);
    const int32_t t = targets[static_cast<std::size_t>(r)];
    if (t >= begin && t < begin + columns)
      sums.data[static_cast<std::size_t>(rows + r)] = x[r * columns + (t - begin)] - m;
  }
  tp_allreduce(tp, sums);
  const auto scale = static_cast<float>(1.0 / static_cast<double>(divide_by));
  double loss = 0.0;  // rows in order
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = targets[static_cast<std::size_t>(r)];
    if (t == -1) continue;
    const double log_sum = std::log(static_cast<double>(sums.data[static_cast<std::size_t>(r)]));
    loss += log_sum - static_cast<double>(sums.data[static_cast<std::size_t>(rows + r)]);
    if (!dlogits) continue;
    float* g = dlogits->ptr() + r * columns;
    const float m = top[static_cast<std::size_t>(r)];
    for (int64_t j = 0; j < columns; ++j)
      g[j] = static_cast<float>(std::exp(static_cast<double>(x[r * columns + j] - m) - log_sum)) * scale;
    if (t >= begin && t < begin + columns) g[t - begin] -= scale;
  }
  return static_cast<float>(loss / static_cast<double>(divide_by));
}

}  // namespace

float vocab_parallel_cross_entropy(Ops& ops, const Tensor& logits, std::span<const int32_t> targets, int64_t normalizer,
                                   Tensor* dlogits, const TensorParallel& tp) {
  if (tp.size == 1) return ops.cross_entropy(logits, targets, normalizer, dlogits);
  if (logits.device().is_host()) return vocab_parallel_cross_entropy_on_host(logits, targets, normalizer, dlogits, tp);
  // Logits on a device: through host memory, and the gradient back.
  Tensor scratch, host_dlogits;
  const float loss = vocab_parallel_cross_entropy_on_host(host_view(tp, logits, scratch), targets, normalizer,
                                                          dlogits ? &host_dlogits : nullptr, tp);
  if (dlogits) *dlogits = to_group_device(tp, std::move(host_dlogits));
  return loss;
}

}  // namespace braid::nn
