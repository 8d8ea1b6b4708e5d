// Runs training steps of a reference model on this rank by executing the step's pipeline
// program (core/pipeline) instruction by instruction: batch-sync (or DistMM-Pipe) for a
// contrastive model on the one stage a rank runs, 1F1B over the llm's stages for an MLLM
// (ChainPipeline).
//
//   load_microbatch  render this microbatch's samples (the loader's share of the step)
//   forward          the towers / the chain this rank holds
//   batch_sync       the contrastive group's all-gather, loss share and row gradients
//   backward         parameter gradients
//   reduce_grads     all-reduce of every held module's gradients over its DP group (and
//                    CLIP's temperature over the batch-sync group)
//   optimizer_step   global-norm clipping over all ranks, then AdamW on the held parameters
//
// Every collective goes through the communication plugin, non-blocking; the seconds spent
// waiting are reported per step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/modules/model.hpp"
#include "core/pipeline/program.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/chain_pipeline.hpp"
#include "core/train/clip_work.hpp"
#include "core/train/layout.hpp"
#include "core/train/loader.hpp"
#include "core/train/messages.hpp"

namespace braid::train {

struct ExecutorOptions {
  bool reorder = true;       // DistTrain intra-step reordering of samples over DP replicas
  bool distmm_pipe = false;  // contrastive: interleave a group's backwards with the next group's forwards
  std::function<void(std::int64_t step)> after_reduce;  // called between reduce_grads and optimizer_step
};

struct StepResult {
  double loss = 0;           // the global batch's loss (every rank gets it)
  double grad_norm = 0;      // global L2 norm before clipping
  double seconds = 0;        // wall time of the step on this rank
  double wait_seconds = 0;   // blocked in collectives
  std::int64_t samples = 0;  // the global batch
};

// A held parameter and its optimizer state.
struct TrainedParameter {
  nn::Parameter* param = nullptr;
  nn::AdamWState state;
  bool counted = false;  // contributes to the global gradient norm (one rank per distinct tensor)
};

class Executor {
 public:
  // `model` and `dataset` outlive the executor. Throws Error(bad_config) naming the
  // training field when the batch does not split into the layout's replicas and microbatches.
  Executor(const spec::RunSpec& run, nn::Model& model, const data::ShapesDataset& dataset, RankLayout layout,
           runtime::World& world, nn::Ops& ops, ExecutorOptions options = {});

  StepResult step(std::int64_t step, double learning_rate);

  const RankLayout& layout() const { return layout_; }
  const pipeline::Program& program() const { return program_; }
  std::vector<TrainedParameter>& parameters() { return params_; }
  runtime::Communicator& world_communicator() { return *world_comm_; }
  ChainPipeline* chain() { return chain_.get(); }  // null for a contrastive model
  // Every parameter from the rank that trains it to every rank, so that one rank can
  // evaluate a pipelined model whole (collective over the world).
  void gather_parameters();

 private:
  struct Tower {
    bool held = false;
    int replica = 0, replicas = 1;
    int stage = 0, stages = 1;
    nn::EncoderPart part;
    const ModuleRole* role = nullptr;
    std::unique_ptr<Loader> loader;
    std::vector<data::Sample> samples;  // this step's rows
    std::optional<runtime::Communicator> dp;
    std::vector<nn::Parameter*> params;
  };
  void run_instruction(const pipeline::Instruction& i, std::int64_t step, double lr, StepResult& r);
  std::vector<data::Sample> slice(const Tower& t, int microbatch) const;
  void reduce_grads(StepResult& r);
  std::vector<TowerMicrobatch>& microbatches(int tower);
  void release(int microbatch);
  void receive(int tower, const pipeline::Instruction& i, StepResult& r);
  void send(int tower, const pipeline::Instruction& i);
  void optimizer_step(double lr, StepResult& r);

  const spec::RunSpec& run_;
  nn::Model& model_;
  RankLayout layout_;
  nn::Ops& ops_;
  ExecutorOptions options_;
  runtime::Communicator* world_comm_;
  std::optional<runtime::Communicator> sync_;  // contrastive batch-sync group
  std::vector<Tower> towers_;                  // clip: [image, text]
  std::int64_t microbatch_ = 1;
  int stage_ = 0;  // this rank's stage of the towers' pipeline
  PendingSends sends_;
  int groups_ = 1;                     // contrastive groups per step
  std::int64_t rows_per_replica_ = 0;  // contrastive: the most rows a rank holds per group
  nn::Parameter* logit_scale_ = nullptr;
  pipeline::Program program_;
  std::vector<TrainedParameter> params_;
  // Per-step state.
  std::vector<TowerMicrobatch> image_mbs_, text_mbs_;
  std::unique_ptr<ChainPipeline> chain_;
  double loss_ = 0, logit_grad_ = 0;
};

}  // namespace braid::train
