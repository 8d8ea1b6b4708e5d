// A colocated (Optimus) plan taken apart for the bubble scheduler: the llm's own
// 1F1B program, and on every llm stage the encoder work its devices run, cut into
// kernel-sized tasks (per layer: norms, QKV GEMM, attention, output projection, MLP
// GEMMs, the encoder's TP collectives; the stage's embedding/projection extras; the
// hand-over of each microbatch's output), priced by the cost model.
#pragma once

#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"

namespace braid::bubble {

// The work units of a colocated llm stage: unit 0 is the llm's (its 1F1B has one chunk);
// then, per encoder in plan order, one block of kEncoderUnits units, present on every stage
// whether it runs them or not: its embedding, the kLayerUnits kernels of a transformer
// layer (cost::kLayerKernels order), its head, its transfer (the hand-over of its outputs
// to the llm's first stage, or the send to its next stage) and its ZeRO-2/3 shard traffic.
constexpr int kLayerUnits = cost::kLayerKernels;
enum EncoderUnit : int {
  kEmbeddingUnit = 0,
  kFirstKernelUnit = 1,
  kHeadUnit = kFirstKernelUnit + kLayerUnits,
  kTransferUnit,
  kShardUnit,
  kEncoderUnits,
};
constexpr int encoder_unit(int encoder, int slot) { return 1 + encoder * kEncoderUnits + slot; }

// One task of an encoder microbatch on one device: an EncoderTask instruction with
// `unit` (the kernel kind, a WorkUnit of the llm stage) and `layer` (its chunk).
struct Task {
  int unit = 0;
  int layer = 0;
  bool communication = false;  // a collective or transfer: never placed in a TP bubble
  double seconds = 0;
};

// The encoder stage that one llm stage's devices hold, for one encoder.
struct Host {
  int encoder = 0;                      // index into Colocated::encoders
  int encoder_stage = 0;                // which stage of that encoder's pipeline
  int lane = 0;                         // which of the encoder's pipelines along the llm stages (stage % span)
  std::vector<Task> forward, backward;  // one microbatch, in execution order
  double forward_s = 0, backward_s = 0;
};

struct Encoder {
  std::string name;
  int microbatches = 1;  // K: encoder microbatches per device per step
  int stages = 1;        // the encoder's own pipeline depth
  int span = 1;          // llm stages per encoder stage
  // Encoder DP is free to choose whose samples each device encodes. The encoder
  // pipelines along the llm stages ("lanes", span of them) each encode the samples of
  // their own llm microbatches, ascending: lanes on later llm stages, whose warm-up
  // bubbles are longer, take the earlier microbatches. (All lanes share every
  // microbatch when the microbatches do not split evenly.)
  std::vector<std::vector<int>> lane_microbatches;
};

struct Colocated {
  // The llm's 1F1B without the step's tail (ReduceGrads, OptimizerStep); its stages
  // already carry the encoders' work units, state, DP reduction and optimizer.
  pipeline::Program llm;
  int microbatches = 1;  // llm microbatches per pipeline
  std::vector<Encoder> encoders;
  std::vector<std::vector<Host>> hosts;  // [llm stage][encoder]

  int stages() const { return static_cast<int>(llm.stages.size()); }
  // The encoder microbatches of lane `lane` are cut in order over the lane's llm
  // microbatches. The last encoder microbatch that the lane's p-th llm microbatch needs:
  int last_needed(int e, int lane, int p) const;
  // The first llm microbatch (an id) that needs encoder microbatch `j` (its forward deadline).
  int first_needing(int e, int lane, int j) const;
  // The last llm microbatch (an id) whose gradients encoder microbatch `j` needs (its backward release).
  int last_feeding(int e, int lane, int j) const;
  const std::vector<int>& lane_list(int e, int lane) const {
    return encoders[static_cast<std::size_t>(e)].lane_microbatches[static_cast<std::size_t>(lane)];
  }
  // Whether a host runs its encoder's last stage (its outputs go to the llm's first stage).
  bool last_encoder_stage(const Host& h) const {
    return h.encoder_stage == encoders[static_cast<std::size_t>(h.encoder)].stages - 1;
  }
};

// Throws Error(Status::bad_config) when the plan is not a runnable colocated plan.
Colocated decompose(const cost::CostModel& cost, const plan::Plan& plan);

}  // namespace braid::bubble
