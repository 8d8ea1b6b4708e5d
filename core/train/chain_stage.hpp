// An MLLM's work (image encoder -> projector -> decoder llm, or the llm alone) on one
// rank's stage of the plan's 1F1B / GPipe program, for each layout the planner gives it:
//
//   monolithic (Megatron)   the llm's stages; the first also runs the encoder and the
//                           projector in its forward and backward
//   chain (DistTrain)       an encoder stage on ranks of its own (with the projector), whose
//                           replicas fan in to the llm's replicas, then the llm's stages
//   colocated (Optimus)     the llm's stages (the projector with the first); the encoder
//                           runs as the bubble scheduler's EncoderTasks on every rank
//                           (ColocatedEncoder), its tokens carried by the program's
//                           ordering messages
//
// The llm runs pipelined over its stages, tensor parallel over tp ranks and data parallel
// over dp replicas. Data: llm replica d trains on the loader's share d of the step in
// microbatches of the plan's size; with f = encoder replicas / llm replicas, encoder replica
// d f + k encodes the samples i of each microbatch with i % f == k. Samples of one image side
// form a group (their image-token count is the same); each group travels between llm stages
// as its own message. Image tokens go through a TokenStore wherever they were computed.
//
// Messages, all non-blocking point-to-point through the communication plugin:
//   llm stage s, tp t -> stage s+1, tp t                     hidden states per group
//   stage s+1 -> stage s                                     their gradients
//   DistTrain (an encoder stage):
//     encoder replica (tp 0) -> every tp rank of llm stage 0  image tokens of its samples
//     llm stage 0, tp 0 -> every tp rank of the encoder       gradients of its samples' tokens
//   Optimus (the program's ordering messages; per llm replica d, encoder share c):
//     stage s, d, first tp rank of share c -> every tp rank of stage 0, d
//                                                             tokens of share c's samples
//     stage 0, d, tp t -> stage s, d, tp t                    gradients of t's share
//     stage 0's tp ranks among themselves                     their own lane's tokens, per share
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/data/shapes.hpp"
#include "core/nn/modules/model.hpp"
#include "core/nn/modules/tensor_parallel_group.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/colocated_encoder.hpp"
#include "core/train/device_collectives.hpp"
#include "core/train/layout.hpp"
#include "core/train/loader.hpp"
#include "core/train/memory_meter.hpp"
#include "core/train/messages.hpp"
#include "core/train/rank_program.hpp"
#include "core/train/stage_work.hpp"
#include "core/train/token_store.hpp"
#include "core/train/zero.hpp"

namespace braid::train {

class ChainStage : public StageWork {
 public:
  // Throws Error(unsupported) naming the module for a layout the reference modules do not
  // run, Error(bad_config) naming the training field when the batch does not split.
  ChainStage(const spec::RunSpec& run, const cost::CostModel& cost, const plan::Plan& plan, nn::Model& model,
             const data::ShapesDataset& dataset, const RankLayout& layout, const RankProgram& program,
             runtime::World& world, nn::Ops& ops, const DataOptions& data,
             const DeviceCollectives* collectives = nullptr, const Agree& agree = {});
  ~ChainStage() override;

  void begin_step(std::int64_t step, StepResult& r) override;
  void install(Interpreter& interpreter) override;
  const FillRules* fill_rules() const override { return encoder_ ? &fill_ : nullptr; }
  std::vector<TrainedParameter>& parameters() override { return params_; }
  std::vector<nn::Parameter*> held_parameters() const override;
  void gather_parameters() override;
  void single_process(bool on) override;
  void add_memory_sources(MemoryMeter& meter) override {
    meter.add_source(MemoryKind::messages, [this] { return sends_.bytes(); });
    meter.add_source(MemoryKind::communication, [this] { return reduction_bytes_.in_flight; });
    reduction_bytes_.meter = &meter;
    for (ZeroModule* z : {llm_zero_.get(), vision_zero_.get(), projector_zero_.get()})
      if (z) z->measure_with(meter);
  }
  std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::string& kind) override;
  void after_optimizer_step() override;
  void end_step() override { result_ = nullptr; }

 private:
  struct Group {                       // one image side of an llm microbatch
    std::vector<std::size_t> members;  // positions in the microbatch
    int side = 0;
    nn::Tokens text;
    nn::Tensor input, output, d_output, d_input;
    nn::DecoderCache cache;
    nn::ProjectorCache projector;
    nn::Tensor encoder_tokens;  // the projector's input, when it runs here
  };
  struct Microbatch {
    std::vector<Group> groups;
  };
  struct EncodedGroup {
    std::vector<std::size_t> members;  // indices into Encoded::positions
    int side = 0;
    nn::ImageEncoderCache vision;
    nn::ProjectorCache projector;
  };
  struct Encoded {  // the encoder's share of one llm microbatch, when it runs in forward/backward
    std::vector<std::size_t> positions;
    std::vector<EncodedGroup> groups;
  };

  std::span<const data::Sample> microbatch_samples(int i) const;  // a view of samples_
  Microbatch& prepare(int i);
  std::int64_t image_tokens(int side) const;
  std::int64_t token_width() const;  // of the tokens in the store
  bool encoder_trains() const;
  void encode(int i, const std::vector<std::size_t>& positions);
  void encode_backward(int i);
  std::vector<std::size_t> all_positions() const;
  std::vector<std::size_t> fan_positions(int k) const;  // encoder replica k of f's share

  Pending forward(const pipeline::Instruction& i);
  Pending backward(const pipeline::Instruction& i);
  Pending receive(const pipeline::Instruction& i);
  void send(const pipeline::Instruction& i);
  Pending reduce();
  // The first backward task in the DP wait (pipeline::kInDpWait) posts the llm's gradient all-reduce
  // once the stage's last llm backward has run; reduce() then waits for it. (On the host MPI
  // path only: ZeRO's and the device's reductions stay in reduce().)
  void post_llm_reduce_early();
  std::vector<TrainedParameter> trained_parameters(int zero_stage) const;
  void make_zero(int stage);  // a ZeroModule per data-parallel module this rank holds
  // A TP group over `group` whose waits count as the step's TP idle time.
  nn::TensorParallel tensor_parallel(runtime::Communicator& group, int rank, bool sequence_parallel,
                                     DeviceGroup* on_device);
  // Every split module sliced for its group, or whole (gathered) for one process.
  void set_tensor_parallel(bool single_process);
  void share_tokens_within_tp(int i);
  std::vector<std::size_t> share_positions(int share) const;  // Optimus: an encoder replica's samples
  bool token_traffic(const pipeline::Instruction& i) const;   // image tokens, not llm hidden states

  nn::Model& model_;
  const RankProgram& program_;
  nn::Ops& ops_;
  DataOptions data_;
  ModuleRole vision_, projector_, llm_;
  bool colocated_ = false;
  bool encoder_stage_ = false;         // chain: this stage runs the encoder and the projector
  bool encodes_in_forward_ = false;    // the encoder runs inside this stage's forward and backward
  bool projector_on_encoder_ = false;  // the projector runs where the encoder does (chain)
  int fan_in_ = 1;                     // encoder replicas per llm replica
  int llm_replica_ = 0;                // the llm replica whose samples this rank works on
  int encoder_part_ = 0;               // chain: this encoder replica's k of f
  int encoder_stage_index_ = -1;       // chain: the program's encoder stage
  std::int64_t microbatch_ = 1;
  int microbatches_ = 1;
  nn::DecoderPart part_;
  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Prefetcher> prefetch_;  // made at the first step
  std::unique_ptr<ColocatedEncoder> encoder_;
  FillRules fill_;
  runtime::Communicator* comm_ = nullptr;
  std::optional<runtime::Communicator> llm_tp_, vision_tp_, projector_tp_, llm_dp_, vision_dp_, projector_dp_;
  // The same groups on the device, when its collectives run there (DP: without ZeRO).
  std::unique_ptr<DeviceGroup> llm_dp_device_, vision_dp_device_, projector_dp_device_;
  std::unique_ptr<DeviceGroup> llm_tp_device_, vision_tp_device_, projector_tp_device_;  // TP groups, likewise
  nn::TensorParallel llm_group_, vision_group_, projector_group_;  // each module's TP group, when split
  std::vector<TrainedParameter> params_;
  std::unique_ptr<ZeroModule> llm_zero_, vision_zero_, projector_zero_;  // ZeRO >= 1 over a DP group of 2+
  // Per step.
  StepResult* result_ = nullptr;
  std::vector<data::Sample> samples_;  // the served llm replica's share of the step
  std::int64_t normalizer_ = 0;
  double loss_ = 0;
  TokenStore store_;
  std::map<int, Microbatch> in_flight_;  // llm microbatches between forward and backward
  std::map<int, Encoded> encoded_;       // encoder work between its forward and backward
  PendingSends sends_;
  CommBytes reduction_bytes_;                       // the DP all-reduces' buffers (without ZeRO)
  int llm_backwards_ = 0, llm_backwards_left_ = 0;  // llm backwards of the stage's program, and still to run
  Pending early_llm_reduce_;
};

}  // namespace braid::train
