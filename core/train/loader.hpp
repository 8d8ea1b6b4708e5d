// Which samples each data-parallel replica trains on at each step. Step s (from 1) takes
// training samples [(s-1) G, s G) of the generated dataset, G the global batch; replica r
// of R gets G / R of them: the contiguous rows [r G/R, (r+1) G/R) (Megatron's sampler), or
// with reordering the DistTrain intra-step assignment of core/data/reorder (assign_lpt, which
// the C ABI's braid_reorder runs through data::arrange): longest processing time first over
// each sample's patch count, equal counts per replica. Patches, not side^4: for the reference
// models a sequence holds at most a few dozen tokens, far fewer than the hidden width, so the
// linear layers dominate and the planner's cost model (core/data/sample_cost) prices a sample
// as an affine function of its patch count; attention's quadratic term stays small. A pure
// function of (dataset, options, step, replica): the same on any number of processes.
// With contrastive groups (CLIP's contrastive batch C < G), each group g, samples
// [g C, (g+1) C) of the step, is split over the replicas on its own as above, and a
// replica's share is its part of group 0, then of group 1, ...: the samples of a group are
// the same whatever the number of replicas, so is its loss.
#pragma once

#include <cstdint>
#include <vector>

#include "core/data/shapes.hpp"

namespace braid::train {

struct LoaderOptions {
  std::int64_t global_batch = 0;
  int replicas = 1;      // DP replicas the global batch is split over
  bool reorder = false;  // DistTrain intra-step reordering over the replicas
  int groups = 1;        // contrastive groups per step, each split over the replicas alone
};

class Loader {
 public:
  // Throws Error(invalid_argument) unless groups >= 1 divides global_batch and replicas >= 1
  // divides each group.
  // Keeps a reference to `dataset`, which must outlive the loader.
  Loader(const data::ShapesDataset& dataset, LoaderOptions options);
  // Training-sample indices of `step` (>= 1) for `replica` (in [0, replicas)), G/R of them,
  // ascending (group by group). Throws Error(invalid_argument) for a step or replica out of range.
  std::vector<std::int64_t> indices(std::int64_t step, int replica) const;
  // Those samples, rendered, in indices() order.
  std::vector<data::Sample> samples(std::int64_t step, int replica) const;
  const LoaderOptions& options() const { return options_; }
  const data::ShapesDataset& dataset() const { return dataset_; }

 private:
  const data::ShapesDataset& dataset_;
  LoaderOptions options_;
};

}  // namespace braid::train
