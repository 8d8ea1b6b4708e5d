// A CLIP-like dual encoder's work on one rank's stage of the plan's batch-sync program
// (batch-sync, DistMM-Pipe or two-phase), for every layout the planner gives it: both
// towers on every rank (DP), the towers on disjoint ranks with DP widths of their own
// (DistMM's branches), or both towers split into pipeline stages.
//
//   load_microbatch   (the step's rows are rendered in begin_step)
//   forward           each tower this stage holds (two-phase: without keeping its
//                     activations, then again to recompute them before the backward)
//   send/recv_*       hidden states (or their gradients) of each tower to/from the same
//                     replica of the neighbouring stage: one message per image side
//   batch_sync        the contrastive group's all-gather, loss share and row gradients (clip_work)
//   backward          parameter gradients
//   reduce_grads      each tower's DP all-reduce; the temperature over the batch-sync group
//
// A replica's rows of a step are split into the program's microbatches: microbatch j of
// contrastive group g is the (g K + j)-th slice, K the stage's microbatches per group; the
// size is the plan's microbatch_size.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/data/shapes.hpp"
#include "core/nn/modules/model.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/clip_work.hpp"
#include "core/train/device_collectives.hpp"
#include "core/train/layout.hpp"
#include "core/train/loader.hpp"
#include "core/train/memory_meter.hpp"
#include "core/train/messages.hpp"
#include "core/train/rank_program.hpp"
#include "core/train/stage_work.hpp"
#include "core/train/zero.hpp"

namespace braid::train {

class ClipStage : public StageWork {
 public:
  // Throws Error(bad_config) naming the training field when the batch does not split into
  // the plan's replicas and microbatches, Error(unsupported) for a tower split by TP.
  ClipStage(const spec::RunSpec& run, const plan::Plan& plan, nn::Model& model, const data::ShapesDataset& dataset,
            const RankLayout& layout, const RankProgram& program, runtime::World& world, nn::Ops& ops,
            const DataOptions& data, const DeviceCollectives* collectives = nullptr, const Agree& agree = {});

  void begin_step(std::int64_t step, StepResult& r) override;
  void install(Interpreter& interpreter) override;
  ~ClipStage() override;
  std::vector<TrainedParameter>& parameters() override { return params_; }
  std::vector<nn::Parameter*> held_parameters() const override;
  void single_process(bool on) override;
  void add_memory_sources(MemoryMeter& meter) override {
    meter.add_source(MemoryKind::messages, [this] { return sends_.bytes(); });
    meter.add_source(MemoryKind::communication, [this] { return reduction_bytes_.in_flight; });
    reduction_bytes_.meter = &meter;
    for (Tower& t : towers_)
      if (t.zero) t.zero->measure_with(meter);
  }
  std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::string& kind) override;
  void gather_parameters() override;
  void after_optimizer_step() override;
  void end_step() override { result_ = nullptr; }

 private:
  struct Tower {
    bool here = false;  // this rank's stage runs a part of it
    const ModuleRole* role = nullptr;
    nn::EncoderPart part;
    std::int64_t microbatch = 0;  // samples per microbatch
    std::unique_ptr<Loader> loader;
    std::unique_ptr<Prefetcher> prefetch;  // made at the first step
    std::optional<runtime::Communicator> dp, tp;
    std::unique_ptr<DeviceGroup> dp_device, tp_device;  // `dp`, `tp` on the device, when its collectives run there
    nn::TensorParallel tp_group;                        // over `tp`, when the tower is split
    std::vector<nn::Parameter*> params;
    std::unique_ptr<ZeroModule> zero;  // ZeRO >= 1 over a DP group of 2+
    // Per step.
    std::vector<data::Sample> samples;
    std::vector<TowerMicrobatch> mbs;
    std::vector<std::vector<nn::Tensor>> kept;  // two-phase: each microbatch's received input
  };
  std::span<const data::Sample> slice(const Tower& t, int microbatch) const;  // a view of t.samples
  void forward(Tower& t, int tower, const pipeline::Instruction& i);
  void backward(Tower& t, int tower, int microbatch);
  Pending receive(const pipeline::Instruction& i);
  void send(const pipeline::Instruction& i);
  Pending sync(const pipeline::Instruction& i);
  Pending reduce();
  void make_zero(int stage);  // a ZeroModule per data-parallel tower this rank holds
  // Every split tower sliced for its group, or whole (gathered) for one process.
  void set_tensor_parallel(bool single_process);
  // The calls into tower `tower`'s encoder a forward or backward of `samples` makes.
  static int tower_calls(int tower, std::span<const data::Sample> samples);

  nn::Model& model_;
  const RankLayout& layout_;
  const RankProgram& program_;
  nn::Ops& ops_;
  DataOptions data_;
  runtime::Communicator* world_ = nullptr;
  std::optional<runtime::Communicator> sync_;  // the batch-sync group of this TP index, when this stage joins it
  int sync_front_ = -1;                        // its lowest rank
  int tp_index_ = 0;                           // this rank's TP rank in the towers it holds
  Tower towers_[2];                            // image, text
  int groups_ = 1;                             // contrastive groups per step
  std::int64_t rows_per_replica_ = 0;          // the most rows a rank holds per group
  nn::Parameter* logit_scale_ = nullptr;
  std::vector<TrainedParameter> params_;
  PendingSends sends_;
  CommBytes reduction_bytes_;  // the DP all-reduces' buffers (without ZeRO)
  StepResult* result_ = nullptr;
  double loss_ = 0, logit_grad_ = 0;
};

}  // namespace braid::train
