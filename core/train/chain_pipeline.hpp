// An MLLM's training step on this rank, for every chain layout the planner gives: the
// image encoder data parallel on its ranks (its own, as DistTrain, or the llm's, as Optimus
// and Megatron), the projector with the encoder or with the llm's first stage, and the llm
// pipelined over pp stages, tensor parallel over tp ranks and data parallel over dp
// replicas, running its 1F1B pipeline program instruction by instruction.
//
// Data: llm replica d trains on the loader's share d of the step, in microbatches of the
// run's microbatch size; with f = (encoder replicas) / (llm replicas), encoder replica
// d*f + k computes the samples i of each microbatch with i % f == k (the DP fan-in of
// core/runtime's links). Encoder work runs encoder-first: every forward before the llm's
// pipeline, every backward after it (Optimus's baseline order; the bubble scheduler's
// interleaving is planned but not executed here). Samples of one image side form a group
// inside a microbatch (their image-token count is the same); each group travels between
// stages as its own message.
//
// Messages, all non-blocking point-to-point through the communication plugin:
//   encoder (tp 0) -> every tp rank of llm stage 0      image tokens of its slice
//   llm stage s, tp t -> stage s+1, tp t               hidden states per group
//   stage s+1 -> stage s                               their gradients
//   llm stage 0, tp 0 -> every tp rank of the encoder  gradients of its slice's tokens
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/data/shapes.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/modules/tensor_parallel_group.hpp"
#include "core/pipeline/program.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/layout.hpp"
#include "core/train/loader.hpp"
#include "core/train/messages.hpp"

namespace braid::train {

struct StepResult;
struct TrainedParameter;

class ChainPipeline {
 public:
  ChainPipeline(const spec::RunSpec& run, nn::Model& model, const data::ShapesDataset& dataset,
                const RankLayout& layout, runtime::World& world, bool reorder);
  ~ChainPipeline();

  // This rank's stage of the llm's program (empty when it holds no llm stage).
  const std::vector<pipeline::Instruction>& instructions() const;
  const pipeline::Program& program() const { return program_; }
  // The parameters this rank trains, each distinct tensor counted once over the world.
  std::vector<TrainedParameter> parameters() const;

  // Renders the step's samples, all-reduces the token count, runs the encoder forwards.
  void begin_step(nn::Ops& ops, std::int64_t step, StepResult& r);
  // One llm instruction other than reduce_grads and optimizer_step.
  void run(nn::Ops& ops, const pipeline::Instruction& i, StepResult& r);
  // The encoder backwards, then every gradient all-reduce (llm tp, then dp; encoder and
  // projector dp); the step's loss in r.loss.
  void reduce_grads(nn::Ops& ops, StepResult& r);
  // Copies every parameter from the rank that trains it to every rank, so that one rank
  // can evaluate the whole model (with tensor parallelism off, see single_process()).
  void gather_parameters();
  // Turns the llm's tensor parallelism off (true) or back on (false).
  void single_process(bool on);

 private:
  struct Slice;       // an encoder replica's samples of one llm microbatch
  struct Microbatch;  // an llm microbatch on this rank
  std::vector<data::Sample> microbatch_samples(const std::vector<data::Sample>& all, int j) const;
  Microbatch& prepare(int j);
  std::int64_t image_tokens(int side) const;
  std::int64_t encoder_width() const;  // width of the encoder's messages
  bool encoder_trains() const;
  void isend(std::vector<float> data, int peer, int tag);
  void wait_sends(StepResult& r);

  const spec::RunSpec& run_;
  nn::Model& model_;
  const RankLayout& layout_;
  runtime::World& world_;
  ModuleRole vision_, projector_, llm_;
  bool projector_with_vision_ = false;  // the encoder's ranks run the projector
  int fan_in_ = 1;                      // encoder replicas per llm replica
  std::int64_t microbatch_ = 1;
  int microbatches_ = 1;
  nn::DecoderPart part_;
  std::unique_ptr<Loader> loader_;  // over the llm's replicas
  pipeline::Program program_;
  runtime::Communicator* comm_ = nullptr;  // the world, for point-to-point
  std::optional<runtime::Communicator> tp_comm_, llm_dp_, vision_dp_, projector_dp_;
  // Per step.
  std::vector<data::Sample> llm_samples_;     // the llm replica's share of the step
  std::vector<data::Sample> vision_samples_;  // the share of the llm replica this rank's encoder serves
  std::int64_t normalizer_ = 0;
  double loss_ = 0;
  std::vector<Slice> slices_;            // this rank's encoder work, by microbatch
  std::map<int, Microbatch> in_flight_;  // llm microbatches between forward and backward
  PendingSends sends_;
  nn::TensorParallel tp_;
};

}  // namespace braid::train
