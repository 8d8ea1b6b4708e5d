// What one rank runs of a reference model under a plan: for each module of the model
// whether this rank holds it, as which data-parallel replica of how many, and the ranks
// it reduces gradients with; for a contrastive model the batch-sync group. Derived from
// the process groups of core/runtime (build_groups), so `braid groups` prints the layout
// the trainer executes.
//
// What the CPU trainer executes: CLIP towers with any tp x pp x dp (both towers of one tp),
// on the same ranks (colocated DP) or on disjoint ones (DistMM); an MLLM's llm with any
// tp x pp x dp grid, its encoder with any tp x dp on its own ranks or on the llm's (DistTrain,
// Optimus and Megatron layouts), the projector with the encoder or with the llm's first
// stage, with any tp. Every module with tp > 1 holds only its tensor-parallel slices.
// layout_for refuses anything else, naming the module and the reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/nn/modules/parameter.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategies.hpp"
#include "core/runtime/groups.hpp"
#include "core/spec/model.hpp"

namespace braid::train {

struct ModuleRole {
  std::string name;
  spec::Role role = spec::Role::encoder;
  bool held = false;
  int replica = 0, replicas = 1;      // this rank's DP replica of the module's grid, and how many
  int stage = 0, stages = 1;          // pipeline stage
  int tp_rank = 0, tp = 1;            // tensor-parallel rank
  std::vector<int> dp_ranks;          // the module's DP group holding this rank (gradients all-reduce here)
  std::vector<int> tp_ranks;          // its TP group holding this rank
  std::optional<runtime::Grid> grid;  // the module's rank grid (none for a loss)

  // The rank holding (stage, tp rank, replica) of this module.
  int rank_at(int stage, int tp_rank, int replica) const;
  // Whether this rank counts parameter `p` of the module in the global gradient norm, so that
  // every distinct element counts once: a tensor-parallel slice on every TP rank, a replicated
  // tensor on the first; under ZeRO (zero_stage > 0 over 2+ replicas) each replica its shard,
  // else the first replica.
  bool counts_in_norm(const nn::Parameter& p, int zero_stage) const;
};

struct RankLayout {
  int rank = 0, world = 1;
  spec::Topology topology = spec::Topology::llm_only;
  std::vector<ModuleRole> modules;  // in the model file's module order
  // Contrastive models: the ranks of the batch-sync (every rank holding a tower), ascending.
  std::vector<int> sync_ranks;
  std::string summary;  // "rank 1: image_encoder dp 1/2; text_encoder dp 1/2"

  const ModuleRole& module(const std::string& name) const;  // Error(invalid_argument) when absent
  const ModuleRole* find(const std::string& name) const;
};

// Throws Error(Status::unsupported) naming the module when the plan places it in a way the
// CPU trainer does not execute (tensor or pipeline parallel), Error(bad_config) when the
// plan's modules do not cover the model's trainable ones.
RankLayout layout_for(const spec::ModelSpec& model, const runtime::Topology& topology, int rank);

// True when the CPU trainer runs `module` of `model` only in one pipeline stage (an MLLM's
// modules other than its llm): the one rule layout_for checks and trainable asks the planner for.
bool single_stage_only(const spec::ModelSpec& model, const spec::ModuleSpec& module);
// `asked` with what the CPU trainer needs of a plan it searches for (`braid train`), so the
// planner never picks a layout layout_for would refuse.
plan::Constraints trainable(const spec::ModelSpec& model, plan::Constraints asked);

}  // namespace braid::train
