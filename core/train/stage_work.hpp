// What the reference trainer runs for the instructions of one rank's stage: one StageWork
// per kind of reference model (ClipStage for dual encoders, ChainStage for an encoder ->
// projector -> llm chain). A work installs a handler for each opcode it runs in the
// interpreter's table; the executor (executor.hpp) owns the step, the optimizer and the
// clock. Shared here: what a step reports and the parameters a rank trains.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/nn/modules/parameter.hpp"
#include "core/nn/modules/tensor_parallel_group.hpp"
#include "core/nn/optim.hpp"
#include "core/runtime/communicator.hpp"
#include "core/sim/simulator.hpp"
#include "core/spec/run.hpp"
#include "core/train/agree.hpp"
#include "core/train/comm_buffer.hpp"
#include "core/train/interpreter.hpp"
#include "core/train/prefetcher.hpp"

namespace braid::train {

class MemoryMeter;
class DeviceGroup;
class ZeroModule;

struct StepResult {
  double loss = 0;          // the global batch's loss (every rank gets it)
  double grad_norm = 0;     // global L2 norm before clipping
  double seconds = 0;       // wall time of the step on this rank
  double wait_seconds = 0;  // blocked in receives and collectives (the sum of idle)
  // Taking the step's samples (take_samples): waiting for them, making them when no worker
  // does, and a woken worker's turn on this rank's core.
  double data_seconds = 0;
  std::array<double, sim::kCauseCount> idle{};  // blocked seconds by cause, as the simulator counts them
  // Seconds of compute by pipeline::WorkKind (forward, backward, other): what the
  // instructions took, less what they waited.
  std::array<double, pipeline::kComputeKinds> compute{};
  std::int64_t samples = 0;  // the global batch
  // Per microbatch of this rank's stage (the program's numbering), the image side and caption
  // length of the samples this rank ran in it: what the step's work depended on
  // (trained_load.hpp).
  std::vector<std::vector<cost::TrainedSample>> microbatch_samples;
  // The same of a colocated encoder's microbatches.
  std::vector<std::vector<cost::TrainedSample>> encoder_microbatch_samples;
  // The samples made for this rank's step (by its data worker ahead of it, or in take_samples):
  // the image sides of those rendered, and how many were described (no image).
  std::vector<int> rendered_sides;
  std::int64_t described = 0;
};

// How a stage work gets its samples: which, and from how many workers ahead of training.
struct DataOptions {
  bool reorder = true;       // DistTrain intra-step reordering over DP replicas
  PrefetchOptions prefetch;  // rendering workers and how far ahead they go
  std::int64_t last_step = std::numeric_limits<std::int64_t>::max();  // the run's last (the workers stop there)
};

// A held parameter and its optimizer state. Under ZeRO (zero.hpp) this rank steps only the
// elements [begin, end) of the parameter's value (flattened): the optimizer state, the reduced
// gradient (`grad_shard`) and, at stage 3, the weights (`value_shard`) are of those alone.
struct TrainedParameter {
  nn::Parameter* param = nullptr;
  nn::AdamWState state;
  bool counted = false;              // contributes to the global gradient norm (one rank per distinct tensor)
  std::int64_t begin = 0, end = -1;  // ZeRO: the elements this rank steps; end < 0: all of them
  nn::Tensor grad_shard;             // ZeRO: the gradient of [begin, end), summed over the DP group
  nn::Tensor value_shard;            // ZeRO-3: the weights of [begin, end) (value is gathered only for use)
  bool weights_sharded = false;      // ZeRO-3: value_shard holds the weights this rank keeps
  int group = 0;                     // the gradient reduction it is summed in: nn::FlatMember::group
  bool sharded() const { return end >= 0; }
};

class StageWork {
 public:
  virtual ~StageWork() = default;
  // Before the step's instructions: its samples and per-step state. `r` collects the step's
  // loss and the waits that happen inside compute (TP collectives).
  virtual void begin_step(std::int64_t step, StepResult& r) = 0;
  // A handler for every opcode of the program this work runs (optimizer_step is the executor's).
  virtual void install(Interpreter& interpreter) = 0;
  // What may run ahead of a wait (optimus-online); null: nothing.
  virtual const FillRules* fill_rules() const { return nullptr; }
  // The parameters this rank trains, with their optimizer state (and ZeRO shards); the work
  // keeps them, the executor steps them.
  virtual std::vector<TrainedParameter>& parameters() = 0;
  // Every parameter of the parts this rank holds, trained or frozen: what its ops read.
  virtual std::vector<nn::Parameter*> held_parameters() const = 0;
  // Every parameter from the rank that trains it to every rank (collective over the world),
  // so that one rank can evaluate the whole model.
  virtual void gather_parameters() = 0;
  // Turns tensor parallelism off (true) for a whole-model evaluation on one rank, or back on.
  virtual void single_process(bool) {}
  // Registers the memory this work holds beyond its parameters (its messages in flight) with
  // the executor's meter.
  virtual void add_memory_sources(MemoryMeter&) {}
  // For checkpoints and gradient dumps: every ZeRO-sharded parameter's whole `kind` of state
  // ("param", "adam_m", "adam_v", "grad"; zero.hpp gather_sharded), gathered over its DP group
  // (collective over the world's ranks, every rank calls it). Parameters not sharded are absent.
  virtual std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::string&) { return {}; }
  virtual void after_optimizer_step() {}
  // After the step's instructions: `r` of begin_step is gone.
  virtual void end_step() = 0;
};

// A module's tensor-parallel group over `group` (this rank `rank` of it): all-reduce, and with
// `sequence_parallel` all-gather and reduce-scatter, through the communication plugin; every
// wait goes to `waited` (the step's TP idle time). Tensors `ops` keeps on a device are
// all-reduced there through `on_device` when given (device_collectives.hpp), else cross
// through host memory, as the sequence-parallel collectives always do.
nn::TensorParallel tensor_parallel_group(nn::Ops& ops, runtime::Communicator& group, int rank, bool sequence_parallel,
                                         std::function<void(double)> waited, DeviceGroup* on_device = nullptr);

// Sets the handlers of the four point-to-point opcodes: receives through `receive` (which
// posts them and returns them pending), sends through `send` (non-blocking).
void install_messages(Interpreter& interpreter, std::function<Pending(const pipeline::Instruction&)> receive,
                      std::function<void(const pipeline::Instruction&)> send);
// `step`'s samples from `prefetch`, recorded in `r`: the seconds the call took (data_seconds)
// and the samples made (rendered_sides, described).
std::vector<data::Sample> take_samples(Prefetcher& prefetch, std::int64_t step, StepResult& r);

// A Pending for work a handler did itself after blocking `seconds` in it.
Pending blocked_for(double seconds);
// A Pending over posted requests: test() when all completed, finish() waits for them, then
// runs `then` and returns the seconds blocked.
Pending pending_requests(std::vector<runtime::Request> requests, std::function<void()> then = {});
// Sums the gradients of `params` (the trainable ones) over `comm` in one all-reduce, in
// nn::layout_order: in place where they lie end to end in host memory (laid out by
// nn::FlatParameters), else through a host buffer reported to `bytes` (comm_buffer.hpp).
// Returns the seconds blocked.
double allreduce_gradients(nn::Ops& ops, runtime::Communicator& comm, const std::vector<nn::Parameter*>& params,
                           CommBytes& bytes);
// The same all-reduce posted: finish() waits for it (and copies the sums back from a buffer).
Pending post_allreduce_gradients(nn::Ops& ops, runtime::Communicator& comm, std::vector<nn::Parameter*> params,
                                 CommBytes& bytes);
// A data-parallel module's gradient reduction over `dp`, the one place that picks its path:
// ZeRO's reduce-scatter when `zero`, else the all-reduce on the device when `on_device`,
// else allreduce_gradients. Returns the seconds blocked.
double reduce_module_gradients(nn::Ops& ops, ZeroModule* zero, DeviceGroup* on_device, runtime::Communicator& dp,
                               const std::vector<nn::Parameter*>& params, CommBytes& bytes);

}  // namespace braid::train
