// The projector between an encoder and the llm: `layers` linear layers from the encoder's
// width through `ffn` to the llm's width, GELU between them (LLaVA-1.5's "mlp2x_gelu" with
// two layers; one layer is a plain linear map), applied to every token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/modules/layers.hpp"

namespace braid::nn {

struct ProjectorCache {
  std::vector<Tensor> inputs;    // of each linear layer
  std::vector<Tensor> pre_gelu;  // outputs of every layer but the last
};

class Projector : public Module {
 public:
  Projector(ParameterStore& store, std::string name, int64_t in, int64_t ffn, int64_t out, int64_t layers, bool frozen);
  int64_t in() const { return layers_.front().in(); }
  int64_t out() const { return layers_.back().out(); }

  // x (..., in) -> (..., out).
  Tensor forward(Ops& ops, const Tensor& x, ProjectorCache& cache) const;
  // Adds the parameter gradients; returns dx unless `want_dx` is false.
  Tensor backward(Ops& ops, const Tensor& dy, const ProjectorCache& cache, bool want_dx = true) const;

 private:
  std::vector<Linear> layers_;
};

}  // namespace braid::nn
