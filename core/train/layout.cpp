#include "core/train/layout.hpp"

#include <algorithm>

#include "core/common/error.hpp"

namespace braid::train {

bool single_stage_only(const spec::ModelSpec& model, const spec::ModuleSpec& module) {
  return model.topology != spec::Topology::contrastive && module.role != spec::Role::llm;
}

plan::Constraints trainable(const spec::ModelSpec& model, plan::Constraints asked) {
  for (const auto& m : model.modules) {
    if (single_stage_only(model, m) && m.role != spec::Role::loss) asked.encoder_pp = 1;
  }
  if (model.topology == spec::Topology::contrastive) asked.towers_share_tp = true;
  asked.all_devices = true;  // one rank per device: a device left out is a rank with nothing to run
  return asked;
}

int ModuleRole::rank_at(int stage_, int tp_rank_, int replica_) const {
  if (!grid) throw Error(Status::internal, "layout: '" + name + "' has no grid");
  runtime::Coords c{};
  c[static_cast<std::size_t>(runtime::Axis::pp)] = stage_;
  c[static_cast<std::size_t>(runtime::Axis::tp)] = tp_rank_;
  c[static_cast<std::size_t>(runtime::Axis::dp)] = replica_;
  return grid->rank_at(c);
}

bool ModuleRole::counts_in_norm(const nn::Parameter& p, int zero_stage) const {
  const bool sharded = zero_stage > 0 && replicas > 1;
  return (sharded || replica == 0) && (tp_rank == 0 || !p.slice.whole());
}

const ModuleRole* RankLayout::find(const std::string& name) const {
  for (const auto& m : modules)
    if (m.name == name) return &m;
  return nullptr;
}

const ModuleRole& RankLayout::module(const std::string& name) const {
  if (const ModuleRole* m = find(name)) return *m;
  throw Error(Status::invalid_argument, "layout: no module '" + name + "'");
}

RankLayout layout_for(const spec::ModelSpec& model, const runtime::Topology& topology, int rank) {
  if (rank < 0 || rank >= topology.world_size)
    throw Error(Status::invalid_argument,
                "layout: rank " + std::to_string(rank) + " outside a world of " + std::to_string(topology.world_size));
  RankLayout layout;
  layout.rank = rank;
  layout.world = topology.world_size;
  layout.topology = model.topology;
  for (const auto& spec_module : model.modules) {
    ModuleRole role;
    role.name = spec_module.name;
    role.role = spec_module.role;
    const int index = topology.module_index(spec_module.name);
    if (index < 0) {
      // The loss module has no weights of its own besides CLIP's temperature, which every
      // rank of the batch-sync keeps (see Executor).
      if (spec_module.role == spec::Role::loss) {
        layout.modules.push_back(role);
        continue;
      }
      throw Error(Status::bad_config, "the plan does not place module '" + spec_module.name + "'");
    }
    const runtime::ModuleGrid& grid = topology.modules[static_cast<std::size_t>(index)];
    const int tp = grid.grid.size_of(runtime::Axis::tp), pp = grid.grid.size_of(runtime::Axis::pp);
    if (single_stage_only(model, spec_module) && pp != 1)
      throw Error(Status::unsupported, "the CPU trainer runs '" + spec_module.name +
                                           "' in one pipeline stage: the plan gives it pp " + std::to_string(pp) +
                                           " (only the llm of an MLLM is pipelined)");
    role.replicas = grid.grid.size_of(runtime::Axis::dp);
    role.stages = pp;
    role.tp = tp;
    role.grid = grid.grid;
    for (const auto& h : topology.holdings[static_cast<std::size_t>(rank)]) {
      if (h.module != index) continue;
      role.held = true;
      role.replica = h.dp;
      role.stage = h.stage;
      role.tp_rank = h.tp;
      role.dp_ranks = grid.group_of(rank, runtime::Axis::dp).ranks;
      role.tp_ranks = grid.group_of(rank, runtime::Axis::tp).ranks;
    }
    layout.modules.push_back(std::move(role));
  }
  if (!topology.batch_syncs.empty()) {
    layout.sync_ranks = topology.batch_syncs.front().ranks;
    std::sort(layout.sync_ranks.begin(), layout.sync_ranks.end());
  }
  layout.summary = "rank " + std::to_string(rank) + ":";
  bool any = false;
  for (const auto& m : layout.modules) {
    if (!m.held) continue;
    layout.summary += std::string(any ? ";" : "") + " " + m.name;
    if (m.stages > 1) layout.summary += " pp " + std::to_string(m.stage) + "/" + std::to_string(m.stages);
    if (m.tp > 1) layout.summary += " tp " + std::to_string(m.tp_rank) + "/" + std::to_string(m.tp);
    layout.summary += " dp " + std::to_string(m.replica) + "/" + std::to_string(m.replicas);
    any = true;
  }
  if (!any) layout.summary += " nothing";
  return layout;
}

}  // namespace braid::train
