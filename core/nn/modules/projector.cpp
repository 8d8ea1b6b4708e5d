#include "core/nn/modules/projector.hpp"

#include <utility>

#include "core/common/error.hpp"

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

Tensor Projector::forward(Ops& ops, const Tensor& x, ProjectorCache& c) const {
  if (x.rank() < 1 || x.dim(-1) != in())
    throw Error(Status::invalid_argument,
                name() + ": input must be (..., " + std::to_string(in()) + "), got " + shape_string(x.shape));
  c.inputs.assign(layers_.size(), Tensor());
  c.pre_gelu.assign(layers_.size() - 1, Tensor());
  Tensor h = x;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    c.inputs[l] = std::move(h);
    h = layers_[l].forward(ops, c.inputs[l]);
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
  Tensor d = dy;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    if (l + 1 < layers_.size()) {
      Tensor dz;
      ops.gelu_backward(c.pre_gelu[l], d, dz);
      d = std::move(dz);
    }
    d = layers_[l].backward(ops, c.inputs[l], d, want_dx || l > 0);
  }
  return d;
}

}  // namespace braid::nn
