// The one cost model every estimate comes from: per-module work for a microbatch
// at a given tensor-parallel width, collectives, and training-state memory.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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
  // What one layer's recomputation holds when all of a microbatch's passes (its image sides)
  // recompute that layer before any runs its backward, as a colocated encoder run kernel by
  // kernel does: their sum. layer.recompute_bytes is one pass's at a time (the largest).
  double recompute_bytes_all_passes = 0;

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

// One training sample as it sizes the work: its image's side in pixels and its caption's
// tokens (0: the run's nominal text length).
struct TrainedSample {
  int side = 0;
  int caption = 0;
  auto operator<=>(const TrainedSample&) const = default;
};
// Samples of these sides, their captions at the nominal length.
std::vector<TrainedSample> at_sides(const std::vector<int>& sides);

// The samples a run trains on, as its dataset draws them: its first training samples, in
// order. A microbatch runs one pass per distinct image side (patch sequences of different
// lengths do not stack), its text padded to the pass's longest caption (a text tower's to the
// microbatch's), so the modules that see image tokens or text cost the sum of those passes
// rather than one pass at the nominal sizes.
struct TrainedSamples {
  std::vector<TrainedSample> samples;
};

// Bytes an AdamW step moves per parameter it updates, at the run's precision.
double adamw_bytes_per_parameter(spec::Precision precision);

class CostModel {
 public:
  explicit CostModel(const spec::RunSpec& run);
  // Prices the modules that see image tokens or text as the trainer runs `trained` (the mean
  // over the microbatches they make of each pass's cost); the planner's nominal sizes
  // elsewhere. With Kernels::reference, every module as braid's reference modules run it
  // (braid train).
  CostModel(const spec::RunSpec& run, TrainedSamples trained, Kernels kernels = Kernels::megatron);
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  const spec::RunSpec& run() const { return *run_; }
  Kernels kernels() const { return kernels_; }
  // The context of a kernel priced on its own (one device, every gradient), with this
  // model's device, links, settings and kernels.
  BlockContext kernel_context() const {
    return BlockContext{&device_, &comm_, &run_->training, 1, {}, GradNeeds{}, kernels_};
  }
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

  // The model an Optimus colocated encoder is priced on. braid's trainer (Kernels::reference)
  // runs one kernel by kernel on whole sequences (train::ChainStage), so there it is this run
  // without sequence parallelism; Megatron splits its sequences as the llm's (this model).
  const CostModel& colocated_encoder_model() const;

  // Training state per parameter of module `m`, with ZeRO sharding over `dp` replicas.
  StateBytes state_bytes(int m, int dp) const;
  // What ZeRO-2/3 hold inside a forward or backward of module `m` at microbatch `samples`
  // beyond state_bytes' shards, for a stage's part of `layers` layers of `layer_params` and the
  // rest (embeddings, heads; a projector is all rest) of `rest_params`: whole gradients before
  // their reduce-scatter (2, 3) and gathered weights (3), no optimizer state. braid's trainer
  // (Kernels::reference, train/zero.hpp) gathers the whole part for a stage-3 backward and
  // holds the whole part's gradients where a microbatch makes several passes (image sides,
  // most_passes), else the rest's and one layer's; elsewhere (DeepSpeed's per-module gather
  // and reduction) one unit, the larger of a layer and the rest.
  StateBytes in_instruction_bytes(int m, int samples, int layers, double layer_params, double rest_params,
                                  int dp) const;
  // Whether module `m` holds that state beside the state of a module whose instructions it
  // shares (a projector riding with its encoder), kind by kind, rather than after it: under
  // braid's kernels a stage-3 backward gathers both parts first (weights), and where a
  // microbatch makes several passes each unit's gradient waits for its last call (gradients);
  // with one pass the projector's are reduced before the encoder's backward begins, and
  // elsewhere one unit is held at a time.
  struct HeldBeside {
    bool weights = false, gradients = false;
  };
  HeldBeside held_beside(int m, int samples) const;
  // The host buffers braid's own DP collectives (Kernels::reference, train/comm_buffer.hpp)
  // copy floats through, for the stage part of in_instruction_bytes. Under ZeRO a unit padded
  // to `dp` equal shards and this rank's shard, one unit at a time: inside a forward or
  // backward (ZeRO-2/3: a unit's reduce-scatter or gather) and after the last backward
  // (`step_end`, when no activation is held: ZeRO-1's reduce-scatters, ZeRO-1/2's gathers of
  // the updated weights). None without ZeRO: the trainer's all-reduce sums the gradients in
  // place, laid out end to end (nn::FlatParameters). None elsewhere: Megatron reduces and
  // gathers in place in its contiguous gradient and parameter buffers.
  struct CollectiveBuffers {
    double inside = 0, step_end = 0;
  };
  CollectiveBuffers collective_buffer_bytes(int m, int layers, double layer_params, double rest_params, int dp) const;
  // The most passes (image sides) a trained microbatch of `samples` makes through module `m`:
  // the calls braid's trainer makes of it per instruction; 1 where it is priced at nominal sizes.
  std::size_t most_passes(int m, int samples) const;
  // Optimizer step time for `params` local parameters (memory bound); reference, with the
  // gradients' squared norm (for clipping) and their zeroing for the next step.
  double optimizer_seconds(int m, double params, int dp) const;
  // What one host core takes to make a step's samples of braid's dataset: one rendered image
  // of each of `rendered_sides` (pixels on a side) and `described` samples without one, at the
  // cluster's measured rates (spec::SampleRates; nothing where none were measured).
  double data_seconds(const std::vector<int>& rendered_sides, std::int64_t described) const;
  // DP collectives once per step, after the last backward: all-reduce of the gradients
  // (ZeRO-0); reduce-scatter + all-gather of updated weights (ZeRO-1); the all-gather
  // alone (ZeRO-2, whose gradients were reduced per microbatch); nothing (ZeRO-3).
  double gradient_sync_seconds(int m, double params, const GroupShape& dp_group) const;
  // The part of gradient_sync_seconds that all-gathers updated parameters (ZeRO-1 and 2,
  // Megatron's distributed optimizer): what `overlap_param_gather` hides behind the next
  // step's forward; the rest is the gradient reduction `overlap_grad_reduce` hides.
  double param_gather_seconds(int m, double params, const GroupShape& dp_group) const;
  // DP collectives every microbatch: ZeRO-2 and 3 reduce-scatter gradients as they are
  // produced; ZeRO-3 also all-gathers the weights for forward and again for backward.
  double sharded_traffic_seconds(int m, double params, const GroupShape& dp_group) const;

  // Model FLOPs of one sample through the whole model, forward + backward,
  // excluding recomputation (the numerator of MFU).
  double model_flops_per_sample() const { return model_flops_per_sample_; }

 private:
  ModuleCost build(int m, int tp, int samples, const GroupShape& tp_group) const;
  // Whether module `m` is priced on the trained samples: it sees image tokens or text.
  bool by_sample(int m) const;
  // Up to 64 trained microbatches of `samples`, each as the passes module `m` makes of it:
  // side (0: one pass whatever the images) -> (members, longest caption; 0: nominal text).
  std::vector<std::map<int, std::pair<int, int>>> microbatch_passes(int m, int samples) const;
  // Calls `visit` for each pass of module `m` (one image side where it sees images, and its
  // members; the text at their longest caption where it sees text) of the trained
  // microbatches of `samples`, with the cost model of those sizes and the microbatch's index;
  // returns how many microbatches it covered.
  std::size_t for_each_pass(
      int m, int samples,
      const std::function<void(const CostModel& at_size, int members, std::size_t microbatch)>& visit) const;
  // The mean over the trained microbatches of `samples` of their passes (times,
  // FLOPs); the largest microbatch's activations.
  ModuleCost build_by_sample(int m, int tp, int samples, const GroupShape& tp_group) const;

  const spec::RunSpec* run_;
  DeviceModel device_;
  CommModel comm_;
  std::vector<double> tokens_;
  std::vector<GradNeeds> grads_;
  std::vector<double> params_;
  std::vector<bool> sees_images_;  // an image encoder, or fed by one
  std::vector<bool> sees_text_;    // a text encoder, or an llm
  TrainedSamples trained_;
  Kernels kernels_;
  // The run at each trained (side, caption), and its cost model (nominal pricing), built on demand.
  mutable std::map<std::pair<int, int>, std::pair<std::unique_ptr<spec::RunSpec>, std::unique_ptr<CostModel>>> at_size_;
  mutable std::mutex size_mutex_;  // guards at_size_ (node-stable: models stay valid)
  // This run without sequence parallelism and its model, built on demand (colocated_encoder_model).
  mutable std::pair<std::unique_ptr<spec::RunSpec>, std::unique_ptr<CostModel>> whole_sequences_;
  mutable std::mutex whole_sequences_mutex_;
  double model_flops_per_sample_ = 0;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::tuple<int, int, int, int, int>, ModuleCost> cache_;  // node-stable: references stay valid
};

}  // namespace braid::cost
