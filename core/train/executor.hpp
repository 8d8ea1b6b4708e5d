// Runs training steps of a reference model on this rank: the plan's program for the
// rank's stage (rank_program.hpp), instruction by instruction through the one interpreter
// (interpreter.hpp), with the stage work of the model (ClipStage or ChainStage) in its
// dispatch table and the optimizer step here:
//
//   optimizer_step   global-norm clipping over all ranks, then AdamW on the held parameters
//
// Every message and collective goes through the communication plugin, non-blocking; the
// seconds this rank waited are reported per step by cause, as the simulator counts them
// (pp warm-up, cool-down and other pipeline waits, DP, TP, batch-sync), so a measured step
// reads next to its simulation. The instructions each step ran are kept (tests compare
// them with the program; traces show them), and so is the rank's peak memory by kind
// (memory_meter.hpp).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/data/shapes.hpp"
#include "core/nn/flat_parameters.hpp"
#include "core/nn/modules/model.hpp"
#include "core/plan/plan.hpp"
#include "core/runtime/groups.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/device_collectives.hpp"
#include "core/train/interpreter.hpp"
#include "core/train/layout.hpp"
#include "core/train/memory_meter.hpp"
#include "core/train/rank_program.hpp"
#include "core/train/stage_work.hpp"

namespace braid::train {

struct ExecutorOptions {
  DataOptions data;                                     // which samples, and the workers that render them ahead
  std::optional<spec::Schedule> schedule;               // one the plan runs (nullopt: its default)
  std::function<void(std::int64_t step)> after_reduce;  // called between reduce_grads and optimizer_step
  // An error inside a step, while its receives and sends are pending (see Interpreter::run).
  std::function<void(const std::exception_ptr&)> on_fatal;
  // Host memory the ops' backend holds but does not use (its pool's cached blocks), so the
  // measured activations are what is in use; null for none.
  std::function<std::size_t()> idle_heap;
  // With tensors resident on a device: its bytes in use, which activations are measured
  // from instead of the heap (the heap there holds the GPU runtime's own state); null: the heap.
  std::function<std::size_t()> device_in_use;
  // The device's data-parallel collectives, when they run there (device_collectives.hpp);
  // null: through host memory and the MPI plugin.
  const DeviceCollectives* collectives = nullptr;
  // The layout checks of this rank's program and stage work, before any group is made
  // (stage_work.hpp); null: thrown on this rank alone.
  Agree agree;
};

class Executor {
 public:
  // `model`, `dataset` and `plan` outlive the executor. Throws Error(bad_config) naming the
  // training field when the batch does not split as the plan says, Error(unsupported) for a
  // schedule the plan does not run (listing those it does) or a layout the reference modules
  // cannot run (naming the module).
  Executor(const spec::RunSpec& run, const cost::CostModel& cost, const plan::Plan& plan, nn::Model& model,
           const data::ShapesDataset& dataset, const runtime::Topology& topology, RankLayout layout,
           runtime::World& world, nn::Ops& ops, ExecutorOptions options = {});
  ~Executor();

  StepResult step(std::int64_t step, double learning_rate);

  const RankLayout& layout() const { return layout_; }
  const RankProgram& program() const { return program_; }
  // The last step's instructions as they ran (indices into program().instructions()).
  const std::vector<Executed>& executed() const { return executed_; }
  std::vector<TrainedParameter>& parameters() { return params_; }
  nn::Ops& ops() { return ops_; }  // where the parameters and their state live
  // Every parameter of the parts this rank holds (StageWork::held_parameters).
  std::vector<nn::Parameter*> held_parameters() const { return work_->held_parameters(); }
  // This rank's memory by kind, sampled at the start of every step and after each instruction.
  const MemoryMeter& memory() const { return memory_; }
  runtime::Communicator& world_communicator() { return *world_comm_; }
  // Every parameter from the rank that trains it to every rank, so that one rank can
  // evaluate the whole model (collective over the world). single_process(true), before it,
  // turns tensor parallelism off for that evaluation (gathering each split parameter whole
  // within its TP group); (false) slices them again.
  void gather_parameters();
  void single_process(bool on);
  // Every ZeRO-sharded parameter's whole `kind` of state (StageWork::gather_sharded).
  std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::string& kind) {
    return work_->gather_sharded(kind);
  }

 private:
  Pending optimizer_step(double lr, StepResult& r);
  // The held parameters laid out end to end (nn::FlatParameters), laid out anew first when
  // `lay_out` and most are no longer slices; null under ZeRO.
  nn::FlatParameters* flat_parameters(bool lay_out);
  sim::Cause cause_of(int index) const;

  const spec::RunSpec& run_;
  RankLayout layout_;
  nn::Ops& ops_;
  ExecutorOptions options_;
  runtime::Communicator* world_comm_;
  RankProgram program_;
  std::unique_ptr<StageWork> work_;
  Interpreter interpreter_;
  std::vector<TrainedParameter>& params_;  // the work's
  MemoryMeter memory_{params_};
  std::optional<nn::FlatParameters> flat_;
  int first_forward_ = 0, last_backward_ = 0;  // in this rank's instruction list
  // Per step.
  std::vector<Executed> executed_;
  StepResult* result_ = nullptr;
  std::int64_t step_ = 0;
  double lr_ = 0;
};

}  // namespace braid::train
