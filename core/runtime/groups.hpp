// Heterogeneous process groups derived from a plan: per module a rank grid on the
// plan's devices (rank = device id, the numbering of pipeline stages' first_device
// and device_stride, so a runtime executing a program finds its peers), its tp, dp
// and pp groups, which rank holds which module stage (several in colocated and
// monolithic layouts), the cross-module activation links with their DP fan-in /
// fan-out, and the groups a contrastive batch-sync gathers over. Pure arithmetic:
// built once, in milliseconds even for thousands of ranks.
#pragma once

#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/runtime/grid.hpp"
#include "core/spec/model.hpp"

namespace braid::runtime {

// The axes a module has groups along, in the order ModuleGrid::groups lists them.
constexpr std::array<Axis, 3> kGroupAxes = {Axis::tp, Axis::dp, Axis::pp};

struct Group {
  std::string name;  // "vision.dp[pp=0,tp=1]"
  int module = 0;    // index into Topology::modules
  Axis axis = Axis::tp;
  std::vector<int> ranks;  // in grid order
};

struct ModuleGrid {
  std::string name;
  spec::Role role = spec::Role::encoder;
  int module = 0;             // index into the model's modules
  Grid grid;                  // order tp-dp-pp, first rank = the placement's first device
  std::vector<Group> groups;  // every tp group, then every dp group, then every pp group

  // The `axis` group (tp, dp or pp) that holds `rank`.
  const Group& group_of(int rank, Axis axis) const;
  // The ranks of pipeline stage `stage`, DP replica `replica` (its tp group).
  std::vector<int> replica_ranks(int stage, int replica) const;
};

// One stage of the plan's pipeline program (pipeline::build_program), on the same devices.
struct ProgramStage {
  std::string name;  // as the program names it: "vision stage 0", "stage 1 (llm)"
  int module = -1;   // index into Topology::modules when the stage runs one module
  int replicas = 1;
  int devices_per_replica = 1;
  int first_device = 0;
  int device_stride = 1;

  std::vector<int> replica_ranks(int replica) const;
};

// What one rank holds of one module.
struct Holding {
  int module = 0;  // index into Topology::modules
  int stage = 0;   // the module's pipeline stage
  int tp = 0;      // tensor-parallel rank
  int dp = 0;      // data-parallel replica
};

struct LinkPair {
  int from_replica = 0, to_replica = 0;
  std::vector<int> from_ranks, to_ranks;
};

// Activations of `from`'s last stage go to `to`'s first stage (gradients come back).
// With A replicas sending and B receiving, replica r exchanges with r/(A/B) when
// A > B (fan-in) and with r*(B/A) .. r*(B/A)+B/A-1 when A < B (fan-out), as
// braid/pipeline.h documents.
struct Link {
  int from = 0, to = 0;  // indices into Topology::modules
  int from_stage = 0, to_stage = 0;
  bool local = false;  // every pair's ranks are the same: the hand-over stays on the device
  std::vector<LinkPair> pairs;
};

struct BatchSyncMember {
  int module = 0;  // index into Topology::modules
  int stage = 0;   // its last stage, which produces the embeddings
  int replica = 0;
  std::vector<int> ranks;
};

// A contrastive loss: every DP replica of every tower's embedding stage gathers here.
struct BatchSyncGroup {
  std::string name;                      // "<loss module>.batch_sync"
  std::vector<BatchSyncMember> members;  // by tower (the loss's inputs in order), then replica
  std::vector<int> ranks;                // the members' ranks, each once, in member order
};

// Where one rank runs the program: its stage, its DP replica of that stage, its place in
// the replica's tensor-parallel group.
struct RankPlace {
  int stage = 0;  // index into Topology::stages
  int replica = 0;
  int tp_rank = 0;
};

struct Topology {
  plan::Strategy strategy = plan::Strategy::megatron;
  plan::Layout layout = plan::Layout::monolithic;
  int world_size = 0;
  std::vector<ModuleGrid> modules;             // in plan order
  std::vector<ProgramStage> stages;            // in program order
  std::vector<int> stage_of_rank;              // index into stages, per rank
  std::vector<std::vector<Holding>> holdings;  // per rank, by module
  std::vector<Link> links;
  std::vector<BatchSyncGroup> batch_syncs;

  int module_index(const std::string& name) const;  // -1 when absent
  // Throws Error(Status::invalid_argument) for a rank outside 0..world_size-1.
  RankPlace place_of(int rank) const;
};

// Throws Error(Status::invalid_argument) when `world_size` differs from the plan's
// device count, and Error(Status::bad_config) when the plan's placements do not form
// grids on ranks 0..world_size-1 (a module outside the world, a rank holding nothing,
// DP widths that neither divide the other across a link, a plan of another model).
Topology build_groups(const spec::ModelSpec& model, const plan::Plan& plan, int world_size);

}  // namespace braid::runtime
