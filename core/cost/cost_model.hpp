// The one cost model every estimate comes from: per-module work for a microbatch
// at a given tensor-parallel width, collectives, and training-state memory.
#pragma once

#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/cost/block.hpp"
#include "core/cost/comm.hpp"
#include "core/cost/device.hpp"
#include "core/cost/transformer.hpp"
#include "core/spec/run.hpp"

namespace braid::cost {

// The work of one module for one microbatch on one device of its TP group.
struct ModuleCost {
  BlockCost layer;          // one repeated layer (transformer block); zero for projectors
  BlockCost first;          // work on the module's first stage: embeddings, or the whole projector
  BlockCost last;           // work on its last stage: LM head + loss, pooled projection, unpatchify
  int layers = 0;           // repeated layers that pipeline stages split
  double output_bytes = 0;  // activations handed to the next module per microbatch

  // Work of a stage holding `n` layers, and the first/last extras if it holds them.
  BlockCost stage(int n, bool has_first, bool has_last) const {
    BlockCost c = layer.times(n);
    if (has_first) c += first;
    if (has_last) c += last;
    return c;
  }
};

// Bytes per parameter of training state, split as the ZeRO stage shards them.
struct StateBytes {
  double weights = 0, gradients = 0, optimizer = 0;
  double total() const { return weights + gradients + optimizer; }
};

class CostModel {
 public:
  explicit CostModel(const spec::RunSpec& run);
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  const spec::RunSpec& run() const { return *run_; }
  const DeviceModel& device() const { return device_; }
  const CommModel& comm() const { return comm_; }
  double element_bytes() const { return device_.element_bytes(); }

  // Sequence length one sample brings to module `m` (patches, text tokens, latent patches...).
  double tokens(int m) const { return tokens_[static_cast<std::size_t>(m)]; }
  // Whether module `m` runs a backward pass at all, and whether it trains.
  GradNeeds grads(int m) const { return grads_[static_cast<std::size_t>(m)]; }
  // Total parameters of module `m`, unsharded.
  double parameters(int m) const { return params_[static_cast<std::size_t>(m)]; }

  // Work of module `m` for a microbatch of `samples` on a TP group of `tp`
  // devices shaped `tp_group`. Memoized: planners call this millions of times.
  // Thread-safe: several threads may plan with one CostModel.
  const ModuleCost& module(int m, int tp, int samples, const GroupShape& tp_group) const;
  // Same for a TP group inside one node (the only place TP runs).
  const ModuleCost& module(int m, int tp, int samples) const;

  // The kernels of one transformer layer of module `m` (not a projector), priced as
  // module() prices that layer: for schedulers that place kernels one by one.
  std::vector<LayerKernel> layer_kernels(int m, int tp, int samples) const;

  // Training state per parameter of module `m`, with ZeRO sharding over `dp` replicas.
  StateBytes state_bytes(int m, int dp) const;
  // Optimizer step time for `params` local parameters (memory bound).
  double optimizer_seconds(int m, double params, int dp) const;
  // DP collectives once per step, after the last backward: all-reduce of the gradients
  // (ZeRO-0); reduce-scatter + all-gather of updated weights (ZeRO-1); the all-gather
  // alone (ZeRO-2, whose gradients were reduced per microbatch); nothing (ZeRO-3).
  double gradient_sync_seconds(int m, double params, const GroupShape& dp_group) const;
  // DP collectives every microbatch: ZeRO-2 and 3 reduce-scatter gradients as they are
  // produced; ZeRO-3 also all-gathers the weights for forward and again for backward.
  double sharded_traffic_seconds(int m, double params, const GroupShape& dp_group) const;

  // Model FLOPs of one sample through the whole model, forward + backward,
  // excluding recomputation (the numerator of MFU).
  double model_flops_per_sample() const { return model_flops_per_sample_; }

 private:
  ModuleCost build(int m, int tp, int samples, const GroupShape& tp_group) const;

  const spec::RunSpec* run_;
  DeviceModel device_;
  CommModel comm_;
  std::vector<double> tokens_;
  std::vector<GradNeeds> grads_;
  std::vector<double> params_;
  double model_flops_per_sample_ = 0;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::tuple<int, int, int, int, int>, ModuleCost> cache_;  // node-stable: references stay valid
};

}  // namespace braid::cost
