#include "core/nn/modules/projector.hpp"

#include <utility>

#include "core/common/error.hpp"
#include "core/nn/tensor_parallel.hpp"

namespace braid::nn {

Projector::Projector(ParameterStore& store, std::string name, int64_t in, int64_t ffn, int64_t out, int64_t layers,
                     bool frozen)
    : Module(std::move(name), frozen) {
  if (layers < 1 || in < 1 || ffn < 1 || out < 1)
    throw Error(Status::invalid_argument, this->name() + ": a projector needs at least one layer and positive widths");
  int64_t width = in;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t next = l + 1 == layers ? out : ffn;
    layers_.emplace_back(store, this->name() + ".layers." + std::to_string(l), width, next, true, kInitStd, frozen);
    adopt(layers_.back());
    width = next;
  }
}

namespace {

// This rank's slice of the last axis of x (..., n): the input of a row-parallel layer.
Tensor slice_features(const Tensor& x_any, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& x = host_view(tp, x_any, scratch);
  const int64_t n = x.dim(-1);
  Tensor slice = row_parallel_shard(reshaped(x, {x.numel() / n, n}), tp.rank, tp.size);
  Shape shape = x.shape;
  shape.back() = n / tp.size;
  slice.reshape(shape);
  return to_group_device(tp, std::move(slice));
}

// The whole last axis from every rank's slice (zeros elsewhere, summed over the group).
Tensor gather_features(const Tensor& slice_any, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& slice = host_view(tp, slice_any, scratch);
  const int64_t n = slice.dim(-1) * tp.size, rows = slice.numel() / slice.dim(-1);
  Tensor whole({rows, n});
  add_row_parallel_shard(whole, reshaped(slice, {rows, n / tp.size}), tp.rank, tp.size);
  tp_allreduce(tp, whole);
  Shape shape = slice.shape;
  shape.back() = n;
  whole.reshape(shape);
  return to_group_device(tp, std::move(whole));
}

}  // namespace

Tensor Projector::forward(Ops& ops, const Tensor& x, ProjectorCache& c) const {
  if (x.rank() < 1 || x.dim(-1) != in())
    throw Error(Status::invalid_argument,
                name() + ": input must be (..., " + std::to_string(in()) + "), got " + shape_string(x.shape));
  const TensorParallel& tp = tp_.group();
  c.inputs.assign(layers_.size(), Tensor());
  c.pre_gelu.assign(layers_.size() - 1, Tensor());
  Tensor h = x;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const bool sliced_input = tp.size > 1 && !column_parallel(l) && (l == 0 || !column_parallel(l - 1));
    c.inputs[l] = sliced_input ? slice_features(h, tp) : std::move(h);
    h = column_parallel(l) ? column_parallel_forward(ops, layers_[l], c.inputs[l], tp)
                           : row_parallel_forward(ops, layers_[l], c.inputs[l], tp);
    if (l + 1 < layers_.size()) {
      c.pre_gelu[l] = std::move(h);
      ops.gelu_forward(c.pre_gelu[l], h);
    }
  }
  return h;
}

Tensor Projector::backward(Ops& ops, const Tensor& dy, const ProjectorCache& c, bool want_dx) const {
  if (c.inputs.size() != layers_.size())
    throw Error(Status::invalid_argument, name() + ": backward needs the cache of this module's forward");
  const TensorParallel& tp = tp_.group();
  Tensor d = dy;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    if (l + 1 < layers_.size()) {
      Tensor dz;
      ops.gelu_backward(c.pre_gelu[l], d, dz);
      d = std::move(dz);
    }
    if (!want_dx && l == 0 && tp.size == 1) return layers_[l].backward(ops, c.inputs[l], d, false);
    if (column_parallel(l)) {
      d = column_parallel_backward(ops, layers_[l], c.inputs[l], d, tp);
      tp_allreduce(tp, d);  // each rank had the part through its features
    } else {
      d = row_parallel_backward(ops, layers_[l], c.inputs[l], d, tp);
      if (tp.size > 1 && (l == 0 || !column_parallel(l - 1))) d = gather_features(d, tp);  // its input was sliced
    }
  }
  return want_dx ? d : Tensor();
}

void Projector::set_tensor_parallel(TensorParallel tp) {
  check_tensor_parallel(tp, name());
  std::vector<TpSplit> splits;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const Linear& layer = layers_[l];
    const int64_t width = column_parallel(l) ? layer.out() : layer.in();
    if (width % tp.size != 0)
      throw Error(Status::invalid_argument, layer.name() + ": width " + std::to_string(width) +
                                                " does not split over " + std::to_string(tp.size) +
                                                " tensor-parallel ranks");
    if (column_parallel(l))
      add_column_parallel(splits, layer);
    else
      add_row_parallel(splits, layer);
  }
  tp_.set(std::move(tp), splits, name());
}

}  // namespace braid::nn
