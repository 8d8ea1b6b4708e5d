// The per-stage arithmetic every layout shares: what one pipeline stage of a
// module grid costs per microbatch, what it holds in memory, and how a list of
// stages turns into a pipelined step.
#pragma once

#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"

namespace braid::plan {

// One pipeline stage on one device: its work per microbatch and its state.
struct StageLoad {
  cost::BlockCost work;     // per microbatch
  double p2p_s = 0;         // sends + receives per microbatch on the critical path
  double shard_comm_s = 0;  // ZeRO-2/3 DP collectives per microbatch
  double dp_sync_s = 0;     // DP collectives once per step
  double dp_gather_s = 0;   // ... of which the parameter all-gather (ZeRO-1/2)
  double optimizer_s = 0;
  MemoryBreakdown memory;  // static part: weights, gradients, optimizer, reserved
  // What ZeRO-2/3 hold beyond it inside a forward or backward (whole gradients, gathered
  // weights): the most of the stage's modules whose instructions run one at a time; for one
  // that shares another's instructions, the sum where both are held at once
  // (cost::CostModel::held_beside).
  MemoryBreakdown in_instruction;
  // ZeRO's collective buffers after the last backward (MemoryBreakdown::step_end_buffers): the
  // most of the stage's modules, which reduce and gather one after another.
  double step_end_buffers = 0;
  const std::string* module = nullptr;  // for messages: "llm stage 3"; null in monolithic grids
  int stage = 0;
  StageDevices devices;  // the devices holding this stage, one per TP rank of each DP replica

  std::string label() const;

  double time() const { return work.forward_time() + work.backward_time() + p2p_s + shard_comm_s; }
  double compute() const { return work.compute_time(); }
  // The state at its peak: memory with in_instruction's weights, gradients and buffers, and
  // the step-end buffers.
  MemoryBreakdown peak_state() const;
  // Activation bytes on each of its devices with `held` microbatches' kept: those, and during a
  // backward what recomputation re-creates of one layer.
  double activations(double held) const { return work.activation_bytes * held + work.recompute_bytes; }
  // Device-seconds a step keeps each of `devices` devices computing: `microbatches` of work and
  // the optimizer step (the simulator counts both busy, and the bubble fraction of the plan and
  // of its simulation are one figure).
  double busy_seconds(double microbatches, int devices) const {
    return (microbatches * compute() + optimizer_s) * devices;
  }
  // The DP collectives of a step left exposed after the pipeline: the gradient reduction
  // hidden behind the last microbatch's backward with `overlap_grad_reduce` (Megatron-Core
  // launches each bucket's reduction as its gradients are ready), the parameter
  // all-gather behind the next step's first forward with `overlap_param_gather` (issued
  // bucket by bucket, waited on in each module's forward pre-hook).
  double exposed_dp_sync(const spec::TrainingSpec& training) const;
  // ... of which the gradient reduction (without the parameter all-gather).
  double exposed_dp_reduce(const spec::TrainingSpec& training) const;
  // Whether a module added to a stage runs its forwards and backwards in instructions of its
  // own (ZeRO holds one module's state at a time) or inside those of the modules added before
  // it (a projector riding with its encoder, train::ChainStage::encode).
  enum class Instructions { own, shared };
  // Adds `layers` layers of module `m` (+ its first/last extras) at (tp, dp, microbatch).
  void add(const cost::CostModel& cost, int m, int layers, bool first, bool last, int tp, int samples,
           const cost::GroupShape& dp_group, Instructions instructions = Instructions::own);
};

// Microbatches whose activations a stage keeps at once (in layer-equivalents of
// that stage), by schedule. 1F1B: p - stage (Narayanan et al. 2021, sec. 2.2);
// interleaved: Megatron's warm-up count in chunks, divided by v; GPipe: all.
double in_flight(int stage, int stages, int microbatches, int virtual_stages, spec::Schedule schedule);

// Pipelined step over stages with per-microbatch times `t` (1F1B, GPipe and
// interleaved have the same fill/drain: (p-1)/v stage times): m * max + (sum - max) / v.
double pipeline_span(const std::vector<double>& t, int microbatches, int virtual_stages);

// Fills the rates and ratios of `e` from its iteration time and totals.
void finish_estimate(Estimate& e, const cost::CostModel& cost, int devices, double hardware_flops,
                     double busy_device_seconds);

// One contrastive batch-sync as braid's trainer runs it (core/train/clip_work.cpp), one per
// TP index: each of `group`'s members (the towers' last-stage replicas, one TP rank of each)
// adds a record of both towers' rows of width `dim`, padded to the most rows a member holds (a
// contrastive batch over the `fewest_replicas` of the tower with the fewest), and the records
// are all-gathered; `loss_replicas` replicas each compute the loss on their share of the rows;
// the gradients of every row are all-reduced.
struct BatchSyncCost {
  double comm_s = 0;  // the all-gather and the all-reduce
  double loss_s = 0;  // the loss's forward and backward
  double seconds() const { return comm_s + loss_s; }
};
BatchSyncCost batch_sync_cost(const cost::CostModel& cost, double dim, const cost::GroupShape& group,
                              int fewest_replicas, int loss_replicas);
// The width of the towers' embeddings, which the contrastive loss compares (the last tower's).
double towers_embed_dim(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers);
// The batch-sync of towers sharing one grid of `tp` x `dp` x `stages` (monolithic layout).
BatchSyncCost grid_batch_sync_cost(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers, int tp,
                                   int dp, int stages);
// FLOPs of one contrastive loss over `rows` samples of width `dim`: logits, and
// their gradients with respect to both sides.
inline double contrastive_loss_flops(double rows, double dim) { return 3 * 2.0 * rows * rows * dim; }

// Critical-path figures of `e` from the slowest stage over `microbatches`
// microbatches (call after setting dp_comm_s to the step's DP tail).
void record_slowest_stage(Estimate& e, const StageLoad& worst, double microbatches);

// Largest device memory over `loads`, each keeping `acts[i]` bytes of activations beside its
// state (`states[i]` where given, else its peak_state()); records the breakdown and label of
// the peak in `e`. With `per_device` (sized to the cluster's devices), also sets the breakdown
// of every device each load lies on.
void record_peak_memory(Estimate& e, const std::vector<StageLoad>& loads, const std::vector<double>& acts,
                        std::vector<MemoryBreakdown>* per_device = nullptr,
                        const std::vector<MemoryBreakdown>* states = nullptr);
// An Optimus llm stage's state (StageLoad::peak_state) as its devices hold it: the bubble
// scheduler fills its DP wait with encoder tasks, which may run while its gradient reduction
// (posted as the first of them starts) or its parameter gather is in flight, so its step-end
// buffers are held beside activations too.
MemoryBreakdown colocated_llm_state(MemoryBreakdown llm);
// Adds a colocated (Optimus) encoder stage to `on`, the state of the llm stage whose devices
// host it (StageLoad::peak_state): the training state adds up; the collective buffers are the
// larger, the modules reducing and gathering one after another. The plan and the bubble
// scheduler's program both count it so. (Its in-instruction state is not counted: braid's
// trainer runs a colocated encoder at ZeRO-1 at most.)
void host_colocated_encoder(MemoryBreakdown& on, const StageLoad& encoder);

// Stage loads of one module grid (ranks tp-dp-pp from its first device) for
// microbatches of `samples`, with the pipeline sends between its own stages.
std::vector<StageLoad> grid_loads(const cost::CostModel& cost, const ModulePlacement& p, int samples);
// The grid loads of an Optimus colocated encoder, for its microbatches, priced as the run's
// kernels run it (cost::CostModel::colocated_encoder_model): the plan's and the bubble
// scheduler's alike.
std::vector<StageLoad> colocated_encoder_loads(const cost::CostModel& cost, const ModulePlacement& p);

// One microbatch's hand-over from a colocated encoder to the llm's first stage (its gradient
// comes back the same way): a point-to-point send, across nodes whenever the grid spans
// several; none when the llm is one stage of the encoder's tp, whose every device feeds
// itself (each encoder replica is the llm replica on its devices).
double colocated_handover_seconds(const cost::CostModel& cost, const ModulePlacement& encoder, int llm_tp,
                                  int llm_stages);

// The DP group of a pipeline stage: its replicas' devices with the same TP rank.
cost::GroupShape dp_group_of(const cost::CostModel& cost, const StageDevices& stage);
// Whether stage `stage` and the next one of that grid are on different nodes.
bool stage_boundary_crosses_nodes(const cost::CostModel& cost, int first, int tp, int dp, int stage);

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace braid::plan
