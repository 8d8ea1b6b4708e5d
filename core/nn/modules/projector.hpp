// The projector between an encoder and the llm: `layers` linear layers from the encoder's
// width through `ffn` to the llm's width, GELU between them (LLaVA-1.5's "mlp2x_gelu" with
// two layers; one layer is a plain linear map), applied to every token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/modules/tensor_parallel_group.hpp"

namespace braid::nn {

struct ProjectorCache {
  std::vector<Tensor> inputs;    // of each linear layer (this rank's features of it under TP)
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

  // Megatron tensor parallelism for every later forward and backward (default: size 1, none):
  // layers in column- then row-parallel pairs (one all-reduce per pair each way, the GELU on
  // the column-parallel shard); a last unpaired layer row-parallel on this rank's slice of its
  // input. Input and output are whole on every rank. Slices the parameters for this rank, or
  // gathers them whole when tp.size is 1 (collective over the old group). Throws
  // Error(invalid_argument) naming the layer whose width tp.size does not divide; a refused
  // group changes nothing.
  void set_tensor_parallel(TensorParallel tp);
  const TensorParallel& tensor_parallel() const { return tp_.group(); }
  // Forgets the group's callback (its owner is going away); the slices stay.
  void detach_tensor_parallel() { tp_.detach(); }

 private:
  // Layer l is column-parallel (the first of a pair) under tensor parallelism; else row-parallel.
  bool column_parallel(std::size_t l) const { return l % 2 == 0 && l + 1 < layers_.size(); }

  std::vector<Linear> layers_;
  TensorParallelState tp_;
};

}  // namespace braid::nn
