// ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", SC 2020) over one module's data-parallel group on this rank, as the run file's
// training.zero_stage says:
//
//   1  optimizer state sharded: at reduce_grads each unit's gradient is reduce-scattered, each
//      rank steps its shard, and the updated shards are all-gathered back into the weights
//   2  also the gradients: a unit's gradient is reduce-scattered into the shard as soon as its
//      backward is done (every microbatch) and the whole gradient freed
//   3  also the weights: a unit's weights are all-gathered just before its forward (a backward
//      gathers every unit as it starts) and freed after its last use; between uses a rank keeps
//      its shard only
//
// A unit is a transformer block (the module calls the BlockHooks around each), or the rest of
// the module part this rank holds (embeddings, position tables, final norm, heads, a whole
// projector), which the stage work brackets around its calls into the module (before_call,
// after_call). Each unit is its own flat buffer of its parameters' values (this rank's
// tensor-parallel slices), in order, padded to a multiple of the group size; DP rank r owns
// the r-th equal piece. Every collective goes through the plugin's non-blocking calls, waited
// on at once (the wait is what the step reports).
//
// One instruction may call the module several times (once per image-side group of a
// microbatch), and replicas see different groups; yet every rank of the DP group must run the
// same collectives. So the work announces the calls an instruction makes (Calls), and a unit
// is gathered at its first use in the instruction (a stage-3 backward gathers every unit at
// its start: ZeroModule::begin_instruction says why) and reduced and freed after its last: one
// all-gather and one reduce-scatter per unit and instruction on every replica, in one order.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/nn/modules/transformer.hpp"
#include "core/runtime/communicator.hpp"
#include "core/train/comm_buffer.hpp"
#include "core/train/stage_work.hpp"

namespace braid::train {

class MemoryMeter;

// One unit's parameters, and the block it is (null: the rest of the module part).
struct ZeroUnitSpec {
  const nn::TransformerBlock* block = nullptr;
  std::vector<nn::Parameter*> params;
};

// A module part's units: each of `blocks` one, with its trainable parameters; the trainable
// parameters of `part` in no block (embeddings, norms, heads) one more.
std::vector<ZeroUnitSpec> zero_units(const std::vector<nn::Parameter*>& part,
                                     const std::vector<const nn::TransformerBlock*>& blocks);

class ZeroModule : public nn::BlockHooks {
 public:
  // `params` holds a TrainedParameter for every parameter of the units (they must outlive this);
  // their shards are set up here: begin/end, value_shard at stage 3 (the weights freed).
  // `in_pipeline_wait` gets the seconds blocked in each collective of a forward or backward
  // (ZeRO-2 and 3 traffic). The tensors live where `ops` keeps them; the collectives stage
  // them through host memory (host_staging.hpp).
  ZeroModule(std::string name, int stage, runtime::Communicator& dp, nn::Ops& ops, std::vector<ZeroUnitSpec> units,
             std::vector<TrainedParameter>& params, std::function<void(double seconds)> in_pipeline_wait);
  ZeroModule(const ZeroModule&) = delete;
  ZeroModule& operator=(const ZeroModule&) = delete;

  int stage() const { return stage_; }
  nn::Ops& ops() const { return ops_; }
  // Before a step: the gradient shards zero (stage 2/3: the whole gradients freed).
  void begin_step();
  // One forward or backward instruction runs each block `block_calls` times and brackets
  // `rest_calls` calls with before_call / after_call (see Calls).
  void begin_instruction(int block_calls, int rest_calls, bool backward);
  void end_instruction();
  // Around each call of the instruction: the rest unit's uses, as the hooks count blocks'.
  void before_call();
  void after_call();
  // reduce_grads: stage 1 reduce-scatters every unit's gradient into the shards (2 and 3 did
  // as they went). Returns the seconds blocked.
  double reduce();
  // The same, posted (stage 1; empty at 2 and 3, which have nothing left to reduce): one unit
  // at a time, each copied out as it is posted and its sums copied in when it completes; the
  // next is posted by the Pending's test or finish.
  Pending post_reduce();
  // After the optimizer stepped the shards: stages 1 and 2 all-gather the updated weights.
  // Returns the seconds blocked.
  double after_step();
  // Stage 3: every weight gathered and kept (for an evaluation on one rank), or freed again.
  void materialize(bool whole);
  // Has `meter` (which must outlive this) also sample inside forwards and backwards and in the
  // step's last collectives (not in an evaluation's or a checkpoint's gathers), where ZeRO holds
  // the most: after each all-gather (the unit's whole weights beside the shards; a stage-3
  // backward holds every unit's), as a unit's whole gradient is copied out for its
  // reduce-scatter, and once stage 1 has posted every unit's. The collectives' buffers count as
  // communication.
  void measure_with(MemoryMeter& meter);
  // For checkpoints and gradient dumps: each parameter's whole tensor (its tensor-parallel
  // slice) of the state `shard_of` picks (the elements of [begin, end) of its reduced gradient,
  // AdamW moments or stage-3 weights; nullopt: none yet), every rank's shard gathered
  // (collective over the DP group).
  // A parameter whose state does not exist yet maps to an empty tensor.
  std::map<const nn::Parameter*, nn::Tensor> gather(
      const std::function<std::optional<std::span<const float>>(const TrainedParameter&)>& shard_of);

  void before_block(const nn::TransformerBlock& block, bool backward) override;
  void after_block(const nn::TransformerBlock& block, bool backward) override;

 private:
  struct Unit {
    std::vector<TrainedParameter*> params;
    std::vector<std::int64_t> offsets;  // of each parameter in the flat buffer
    std::int64_t numel = 0, shard = 0;  // the parameters' elements; each rank's piece (padded)
    int used = 0, done = 0;             // calls of the current instruction begun and finished
    int calls = 0;                      // ... and how many it makes
    bool gathered = false;              // stage 3: all-gathered for the current instruction
  };
  void acquire(Unit& u);
  void release(Unit& u);
  double reduce_scatter(Unit& u);
  // Posts the reduce-scatter of `u` (which has parameters) into `requests`; returns what
  // copies its sums into the gradients once that request has completed.
  std::function<void()> post_reduce_scatter(Unit& u, std::vector<runtime::Request>& requests);
  double all_gather(Unit& u);  // owned shards -> every parameter's value
  void sample_inside();        // a sample of the meter's while an instruction or the step's end runs
  void free_weights(Unit& u);
  Unit& unit_of(const nn::TransformerBlock& block);

  std::string name_;
  int stage_;
  runtime::Communicator& dp_;
  nn::Ops& ops_;
  std::vector<Unit> units_;  // units_[0]: the rest (may be empty)
  std::map<const nn::TransformerBlock*, std::size_t> by_block_;
  std::function<void(double)> in_pipeline_wait_;
  CommBytes comm_bytes_;   // the CommBuffers alive; measure_with's meter
  bool running_ = false;   // an instruction is running
  bool step_end_ = false;  // reduce_grads' reduce-scatters or the post-step gathers run
  bool backward_ = false;  // it is a backward
  bool whole_ = false;     // stage 3: materialized, every weight kept
};

// The shape of the tensor a parameter's value has when held (its tensor-parallel slice).
nn::Shape held_shape(const nn::Parameter& p);

// Sets a trained parameter's weights and optimizer state from its whole tensors (its
// tensor-parallel slice): under ZeRO the optimizer state of its shard only, and at stage 3 the
// weights too (value_shard; the value stays freed).
void hold_state(TrainedParameter& t, nn::Tensor value, nn::AdamWState adam);

// Every ZeRO-sharded parameter's whole `kind` of state ("param": stage 3 only, "adam_m",
// "adam_v", "grad"), from the modules given, in their order (collective over each DP group).
std::map<const nn::Parameter*, nn::Tensor> gather_sharded(const std::vector<ZeroModule*>& modules,
                                                          const std::string& kind);

// While alive, the calls of one forward or backward instruction into a ZeroModule (nothing
// when it is null).
class Calls {
 public:
  Calls(ZeroModule* z, int calls, bool backward) : Calls(z, calls, calls, backward) {}
  Calls(ZeroModule* z, int block_calls, int rest_calls, bool backward) : z_(z) {
    if (z_) z_->begin_instruction(block_calls, rest_calls, backward);
  }
  ~Calls() {
    if (z_) z_->end_instruction();
  }
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;

 private:
  ZeroModule* z_;
};

// f() between z's before_call and after_call; f() alone when z is null.
template <class F>
decltype(auto) within(ZeroModule* z, F&& f) {
  if (z) z->before_call();
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    if (z) z->after_call();
  } else {
    auto result = f();
    if (z) z->after_call();
    return result;
  }
}

}  // namespace braid::train
