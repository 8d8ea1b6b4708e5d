// Pipeline programs: per stage, the ordered instructions its devices execute in
// one training step. The same programs drive the simulator and (later) the runtime,
// and host frameworks read them through the C ABI to drive their own engines.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/spec/schedule.hpp"

namespace braid::pipeline {

// The most a stage's work may be scaled for one microbatch (Stage::work_scale): a load, not a
// size gone astray.
constexpr double kMaxWorkScale = 1e9;

enum class Op : std::uint8_t {
  load_microbatch,  // take the next microbatch's inputs (first stages)
  forward,          // forward of `microbatch` through model chunk `chunk`
  backward,         // backward (with recomputation, when the run recomputes)
  send_activation,  // to stage `peer`
  recv_activation,  // from stage `peer`
  send_grad,        // to stage `peer`
  recv_grad,        // from stage `peer`
  batch_sync,       // contrastive group `group`: all-gather embeddings, loss, gradients split back
  reduce_grads,     // DP gradient reduction of this stage
  optimizer_step,
  encoder_task,  // colocated encoder work (unit `unit`), placed by the bubble scheduler
};
constexpr int kOpCount = 11;
const char* op_name(Op op);

// What a step's compute time goes to, by instruction: forwards (a colocated encoder's forward
// tasks too; a two-phase recompute is a forward), backwards (and its backward tasks), the rest
// (loading a microbatch, the optimizer step); communication is none of them.
enum class WorkKind : std::uint8_t { forward, backward, other, communication };
constexpr int kComputeKinds = 3;  // the kinds before `communication`
const char* work_kind_name(WorkKind kind);

// Bits of Instruction::flags.
enum : std::uint8_t {
  kNoStore = 1,       // two-phase batch-sync: forward that keeps no activations
  kRecompute = 2,     // two-phase batch-sync: the forward re-run before its backward
  kBackwardTask = 4,  // encoder_task: a backward task (else forward)
  kSyncOnly = 8,      // a send/receive that only orders work; its transfer is charged inside that work
  kInTpBubble = 16,   // encoder_task: runs while the preceding forward/backward waits on its TP collectives
  // encoder_task in a colocated stage's DP waits (the bubble scheduler's coarse and fine
  // passes): a backward task after the stage's last llm backward runs while the llm's
  // gradient reduction, issued when that backward ends, is in flight (reduce_grads waits for
  // it, then reduces the encoders' gradients); a forward task before the stage's first llm
  // instruction runs while the llm's parameter all-gather (gather_s) is in flight.
  kInDpWait = 32,
};

struct Instruction {
  Op op = Op::forward;
  std::int32_t microbatch = -1;  // -1 where not per microbatch
  std::int32_t chunk = 0;        // model chunk on this stage (interleaved schedules)
  std::int32_t peer = -1;        // the other stage of a send or receive
  std::int32_t group = -1;       // contrastive group of a batch_sync
  std::int32_t unit = 0;         // which WorkUnit of the stage a forward/backward/task runs
  std::uint8_t flags = 0;
};
WorkKind work_kind(const Instruction& i);

// What a work unit runs, for an executor (the simulator needs only its times).
enum class UnitKind : std::uint8_t {
  model,              // forward/backward: the stage's part of the model (a chunk)
  encoder_embedding,  // colocated encoder task: the encoder's embedding (its first stage)
  encoder_kernel,     // one kernel of a transformer layer (WorkUnit::kernel, cost::kLayerKernels order)
  encoder_head,       // the encoder's final norm and head (its last stage)
  encoder_transfer,   // the hand-over of a microbatch's output (or the send to the next encoder stage)
  encoder_shard,      // ZeRO-2/3 gradient traffic of the encoder
};

// The work one compute instruction stands for on one device of a stage, per microbatch.
struct WorkUnit {
  std::string label;  // "llm stage 3", "vit stage 0"
  UnitKind kind = UnitKind::model;
  int module = -1;          // encoder units: the encoder's index in the model file
  int kernel = -1;          // encoder_kernel: which kernel of the layer
  double forward_s = 0;     // compute
  double forward_tp_s = 0;  // exposed tensor-parallel collectives
  double backward_s = 0;    // compute, recomputation included
  double backward_tp_s = 0;
  double recompute_s = 0;           // the forward a kRecompute forward re-runs (two-phase)
  double shard_comm_s = 0;          // ZeRO-2/3 DP traffic per microbatch
  double activation_bytes = 0;      // kept from forward to backward
  double input_bytes = 0;           // kept by a kNoStore forward (its input, for the recompute)
  double recompute_bytes = 0;       // re-created by recomputation and held during its backward
  double hardware_flops = 0;        // forward + backward (+ recompute) per device
  int forward_tp_collectives = 0;   // TP collectives in one forward: its TP bubbles
  int backward_tp_collectives = 0;  // ... in one backward
  bool communication = false;       // encoder kernel that is itself a collective or transfer

  // Of a forward or a backward instruction (`op`) running this unit.
  double tp_seconds(Op op) const { return op == Op::forward ? forward_tp_s : backward_tp_s; }
  int tp_collectives(Op op) const { return op == Op::forward ? forward_tp_collectives : backward_tp_collectives; }
};

// What a stage runs of one module: one of the module's own pipeline stages, as a range of
// the module's layers (the plan's layers_per_stage split, counted from the module's first layer).
struct StagePart {
  int module = -1;       // model module index (as StageProgram::module)
  int module_stage = 0;  // the module's own pipeline stage
  int first_layer = 0;   // layers [first_layer, first_layer + layer_count) of the module
  int layer_count = 0;
};

struct StageProgram {
  std::string name;             // "llm stage 3"
  int module = -1;              // model module index; -1 when a stage holds several
  int replicas = 1;             // data-parallel replicas running this program
  int devices_per_replica = 1;  // tensor-parallel width
  int first_device = 0;         // replica r holds devices [first + r*tp, first + (r+1)*tp) of its stage
  int device_stride = 0;        // devices between replicas (tp for tp-dp-pp grids)
  std::vector<int> prev, next;  // stage graph: where activations come from / go to
  int depth = 0;                // position in the pipeline (0 = first)
  std::vector<WorkUnit> units;  // unit 0..v-1: the model chunks; then encoder units (colocated)
  double send_activation_s = 0, send_grad_s = 0;  // one p2p message each
  double reduce_grads_s = 0;                      // the DP collective
  // Of reduce_grads_s, the gradient reduction of the stage's own grid (reduce-scatter or
  // all-reduce, no parameter all-gather; a colocated stage's encoders not included): what a
  // colocated stage issues early when it runs kInDpWait tasks.
  double early_reduce_s = 0;
  // A colocated stage: the llm's parameter all-gather (ZeRO-1/2, not overlapped), charged at
  // the start of the step rather than inside reduce_grads_s: in the steady state it ends one
  // step and precedes the next one's first llm forward, and kInDpWait forward tasks run
  // behind it.
  double gather_s = 0;
  double optimizer_s = 0;
  // What each device holds besides activations, as the plan counts it (plan::StageLoad::
  // peak_state): its peak with the activations held is memory.total() with them in.
  plan::MemoryBreakdown memory;
  int group_microbatches = 0;  // contrastive: this stage's microbatches per group (0: the program's)
  // Optional per-sample load (data heterogeneity): when non-empty, of size replicas x slots,
  // the compute and TP time of a forward/backward of microbatch mb on replica r is
  // multiplied by work_scale[r * slots + mb], slots = work_scale.size() / replicas.
  std::vector<double> work_scale;  // each in [0, kMaxWorkScale)
  // The same for a colocated encoder's tasks (encoder_task, not its ZeRO shard traffic): the
  // compute and TP time of a task of encoder microbatch mb on replica r is multiplied by
  // task_scale[r * slots + mb], slots = task_scale.size() / replicas.
  std::vector<double> task_scale;
  // Optional, per replica: seconds its ranks spend making the step's samples before their
  // first instruction (braid train's samples rendered in the step's time: no data worker, or
  // no core left for one). Empty: none.
  std::vector<double> data_s;
  std::vector<Instruction> instructions;
  // Every module stage this stage runs: its own grid's (several on a monolithic stage),
  // a chain encoder's projector on its last stage, a colocated stage's encoder stages.
  std::vector<StagePart> parts;

  // The device that runs tensor-parallel rank `tp` of DP replica `replica`; a device's replica.
  int device(int replica, int tp = 0) const { return first_device + replica * device_stride + tp; }
  int replica_of(int device) const { return (device - first_device) / device_stride; }

  int microbatches_per_group(int program_default) const {
    return group_microbatches > 0 ? group_microbatches : program_default;
  }
};

// Where one device runs a program: its stage, its DP replica of the stage, its place in
// the replica's tensor-parallel group.
struct DevicePlace {
  int stage = 0;
  int replica = 0;
  int tp_rank = 0;
};

struct Program {
  spec::Schedule schedule = spec::Schedule::one_f_one_b;  // set by the generator that fills the instructions
  int microbatches = 1;                                   // per pipeline
  int virtual_stages = 1;
  int groups = 1;  // contrastive groups per step
  int group_microbatches = 0;
  double batch_sync_s = 0;       // one batch-sync
  double batch_sync_comm_s = 0;  // ... of which its collectives (the rest: the loss)
  double model_flops = 0;        // per step, all devices (MFU numerator)
  double peak_flops = 0;         // per device
  int devices = 0;
  // Devices that share their node's CPU cores (spec::ClusterSpec::cores_per_node): the
  // simulator slows a compute instruction by the threads busy beside it. 0: no sharing.
  int devices_per_node = 0;
  int cores_per_node = 0;
  int threads_per_device = 1;
  double shared_core_efficiency = 1;
  // The link the DP groups reduce over (between nodes when the cluster has several): the
  // simulator slows a ReduceGrads, and a BatchSync's collectives, by its after_compute rows,
  // at the compute its ranks ran since they last communicated.
  spec::LinkSpec dp_link;
  std::vector<StageProgram> stages;

  // The stage that device `device` (a rank of the plan's world) runs. Throws
  // Error(Status::invalid_argument) for a device outside 0..devices-1 or on no stage.
  DevicePlace place_of(int device) const;
};

// The factor that turns the sum of a stage's per-replica gradients over its DP group (what
// ReduceGrads all-reduces) into the single-process gradient of the step's loss: 1 for
// every stage of every program. Why: braid's programs define the loss a replica
// backpropagates for a microbatch as its share of the step's loss, already divided by the
// whole step's count (the reference trainer, core/train: chain_stage.cpp normalises the LM
// loss by the counted tokens all-reduced over every replica and microbatch of the step;
// clip_work.cpp's batch-sync gives each rank its share of a group's mean loss times 1/groups).
// The shares of every microbatch and replica sum to the step's loss, so their gradients sum
// (stage_work.cpp's allreduce_gradients is a plain sum) to its gradient. A producer fed back
// by a consumer of another DP width (fan-in) gets gradients of a loss that already spans all
// its producers: summed too, never averaged. Throws Error(Status::invalid_argument) for a
// stage out of range.
double gradient_scale(const Program& program, std::size_t stage);

// The stages a stage exchanges messages with, from its instructions' peers: `prev`, those
// it receives activations from or sends gradients to; `next`, those it sends activations
// to or receives gradients from; each ascending, once. Unlike StageProgram::prev/next (the
// module graph the generators follow), they include an interleaved pipeline's wrap-around
// (last stage -> first) and a colocated program's ordering messages (kSyncOnly).
struct MessagePeers {
  std::vector<int> prev, next;
};
MessagePeers message_peers(const StageProgram& stage);

// Appends `i` to stage `s`.
inline void emit(Program& p, int s, const Instruction& i) {
  p.stages[static_cast<std::size_t>(s)].instructions.push_back(i);
}

}  // namespace braid::pipeline
