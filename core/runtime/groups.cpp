#include "core/runtime/groups.hpp"

#include <algorithm>

#include "core/common/error.hpp"

namespace braid::runtime {
namespace {

using plan::Layout;
using plan::ModulePlacement;

[[noreturn]] void bad_plan(const std::string& why) { throw Error(Status::bad_config, why); }

std::string rank_range(int first, int last) {
  return first == last ? "rank " + std::to_string(first)
                       : "ranks " + std::to_string(first) + ".." + std::to_string(last);
}

ModuleGrid grid_of(const spec::ModelSpec& model, const ModulePlacement& p, int index, int world_size) {
  if (p.module < 0 || static_cast<std::size_t>(p.module) >= model.modules.size() ||
      model.modules[static_cast<std::size_t>(p.module)].name != p.name) {
    bad_plan("the plan's module '" + p.name + "' is not module " + std::to_string(p.module) + " of model " +
             model.name + ": the plan belongs to another model");
  }
  const long long last = static_cast<long long>(p.first_device) + p.devices - 1;
  if (p.first_device < 0 || p.devices < 1 || last >= world_size) {
    bad_plan(p.name + ": devices " + std::to_string(p.first_device) + ".." + std::to_string(last) +
             " lie outside the world's ranks 0.." + std::to_string(world_size - 1));
  }
  ModuleGrid m{p.name,
               p.role,
               p.module,
               Grid(p.name, GridSizes{p.tp, 1, p.dp, p.pp}, "tp-dp-pp", p.first_device, p.devices),
               {}};
  for (Axis axis : kGroupAxes) {
    for (auto& ranks : m.grid.groups({axis})) {
      std::string name = m.grid.group_name(ranks.front(), {axis});
      m.groups.push_back(Group{std::move(name), index, axis, std::move(ranks)});
    }
  }
  return m;
}

// A program stage on the devices the plan gives it (as pipeline::build_program puts it).
void place(ProgramStage& st, const plan::StageDevices& d) {
  st.replicas = d.replicas;
  st.devices_per_replica = d.devices_per_replica;
  st.device_stride = d.stride;
  st.first_device = d.first_device;
}

// Monolithic grids (the whole model, or a colocated plan's llm with its projectors
// and generators): one program stage per global pipeline stage.
void add_global_stages(Topology& t, const plan::Plan& plan, bool skip_encoders) {
  std::vector<std::size_t> members;
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    if (!(skip_encoders && plan.modules[i].role == spec::Role::encoder)) members.push_back(i);
  }
  if (members.empty()) bad_plan("a colocated plan needs an llm grid besides its encoders");
  const ModulePlacement& head = plan.modules[members.front()];
  const int tp = head.tp, dp = head.dp, width = tp * dp;
  for (std::size_t i : members) {
    const ModulePlacement& p = plan.modules[i];
    if (p.tp != tp || p.dp != dp) {
      bad_plan(std::string("a ") + plan::layout_name(plan.layout) +
               " plan runs one tp and dp across its grid: " + head.name + " has tp " + std::to_string(tp) + ", dp " +
               std::to_string(dp) + " and " + p.name + " tp " + std::to_string(p.tp) + ", dp " + std::to_string(p.dp));
    }
  }
  if (t.world_size % width != 0) {
    bad_plan("tp " + std::to_string(tp) + " x dp " + std::to_string(dp) + " does not divide the " +
             std::to_string(t.world_size) + " ranks into pipeline stages");
  }
  const int stages = t.world_size / width;
  for (std::size_t i : members) {
    const ModulePlacement& p = plan.modules[i];
    const long long last = static_cast<long long>(p.first_stage) + p.pp - 1;
    if (p.first_stage < 0 || last >= stages ||
        p.first_device != plan::grid_stage_devices(tp, dp, p.first_stage).first_device) {
      bad_plan(p.name + ": stages " + std::to_string(p.first_stage) + ".." + std::to_string(last) + " from device " +
               std::to_string(p.first_device) + " do not lie on the " + std::to_string(stages) + " stages of " +
               std::to_string(width) + " devices each");
    }
  }
  for (int s = 0; s < stages; ++s) {
    ProgramStage st;
    std::string names;
    int count = 0;
    for (std::size_t i : members) {
      const ModulePlacement& p = plan.modules[i];
      if (p.first_stage <= s && s < p.first_stage + p.pp) {
        names += (names.empty() ? "" : ", ") + p.name;
        st.module = static_cast<int>(i);
        ++count;
      }
    }
    if (count != 1) st.module = -1;
    st.name = "stage " + std::to_string(s) + " (" + names + ")";
    place(st, plan::grid_stage_devices(tp, dp, s));
    t.stages.push_back(std::move(st));
  }
}

// Disaggregated layouts: each module's pipeline stages in plan order (chain
// projectors run on their encoder's last stage and have none of their own).
void add_module_stages(Topology& t, const plan::Plan& plan) {
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    const ModulePlacement& p = plan.modules[i];
    if (plan.layout == Layout::chain && p.role == spec::Role::projector) continue;
    for (int s = 0; s < p.pp; ++s) {
      ProgramStage st;
      st.name = p.name + " stage " + std::to_string(s);
      st.module = static_cast<int>(i);
      place(st, plan::module_stage_devices(p, s));
      t.stages.push_back(std::move(st));
    }
  }
}

void place_stages(Topology& t) {
  t.stage_of_rank.assign(static_cast<std::size_t>(t.world_size), -1);
  for (std::size_t s = 0; s < t.stages.size(); ++s) {
    const ProgramStage& st = t.stages[s];
    for (int r = 0; r < st.replicas; ++r) {
      for (int rank : st.replica_ranks(r)) {
        int& at = t.stage_of_rank[static_cast<std::size_t>(rank)];
        if (at >= 0) {
          bad_plan("rank " + std::to_string(rank) + " runs two pipeline stages, " + t.stages[std::size_t(at)].name +
                   " and " + st.name + ": the modules' devices overlap");
        }
        at = static_cast<int>(s);
      }
    }
  }
}

void hold(Topology& t) {
  t.holdings.assign(static_cast<std::size_t>(t.world_size), {});
  for (std::size_t m = 0; m < t.modules.size(); ++m) {
    const Grid& g = t.modules[m].grid;
    for (int rank = g.offset(); rank < g.offset() + g.size(); ++rank) {
      const Coords c = g.coords(rank);
      t.holdings[static_cast<std::size_t>(rank)].push_back(
          Holding{static_cast<int>(m), c[static_cast<std::size_t>(Axis::pp)], c[static_cast<std::size_t>(Axis::tp)],
                  c[static_cast<std::size_t>(Axis::dp)]});
    }
  }
  // Ranks that hold nothing, or no program stage, would wait forever: name the first run of them.
  auto problem = [&](int rank) {
    if (t.holdings[static_cast<std::size_t>(rank)].empty()) return 1;
    return t.stage_of_rank[static_cast<std::size_t>(rank)] < 0 ? 2 : 0;
  };
  for (int rank = 0; rank < t.world_size; ++rank) {
    const int kind = problem(rank);
    if (kind == 0) continue;
    int last = rank;
    while (last + 1 < t.world_size && problem(last + 1) == kind) ++last;
    const std::string verb = rank == last ? " holds" : " hold";
    bad_plan(rank_range(rank, last) + verb + (kind == 1 ? " no module" : " modules but no pipeline stage") +
             ": the plan's " + std::to_string(t.world_size) + " devices must each hold a stage");
  }
}

void link(Topology& t, int from, int to) {
  const ModuleGrid& a = t.modules[static_cast<std::size_t>(from)];
  const ModuleGrid& b = t.modules[static_cast<std::size_t>(to)];
  const int A = a.grid.size_of(Axis::dp), B = b.grid.size_of(Axis::dp);
  if (A % B != 0 && B % A != 0) {
    bad_plan(a.name + " (dp " + std::to_string(A) + ") feeds " + b.name + " (dp " + std::to_string(B) +
             "): neither DP width divides the other, so activations cannot fan in or out");
  }
  Link l;
  l.from = from;
  l.to = to;
  l.from_stage = a.grid.size_of(Axis::pp) - 1;
  l.to_stage = 0;
  l.local = true;
  for (int r = 0; r < A; ++r) {
    const int first = A >= B ? r / (A / B) : r * (B / A), count = A >= B ? 1 : B / A;
    for (int k = 0; k < count; ++k) {
      LinkPair pair{r, first + k, a.replica_ranks(l.from_stage, r), b.replica_ranks(0, first + k)};
      l.local = l.local && pair.from_ranks == pair.to_ranks;
      l.pairs.push_back(std::move(pair));
    }
  }
  t.links.push_back(std::move(l));
}

void batch_sync(Topology& t, const spec::ModuleSpec& loss) {
  BatchSyncGroup g;
  g.name = loss.name + ".batch_sync";
  std::vector<char> seen(static_cast<std::size_t>(t.world_size), 0);
  for (const auto& input : loss.inputs) {
    const int m = t.module_index(input);
    if (m < 0) continue;
    const ModuleGrid& tower = t.modules[static_cast<std::size_t>(m)];
    const int last = tower.grid.size_of(Axis::pp) - 1;
    for (int r = 0; r < tower.grid.size_of(Axis::dp); ++r) {
      BatchSyncMember member{m, last, r, tower.replica_ranks(last, r)};
      for (int rank : member.ranks) {
        if (!seen[static_cast<std::size_t>(rank)]) g.ranks.push_back(rank);
        seen[static_cast<std::size_t>(rank)] = 1;
      }
      g.members.push_back(std::move(member));
    }
  }
  if (!g.members.empty()) t.batch_syncs.push_back(std::move(g));
}

}  // namespace

const Group& ModuleGrid::group_of(int rank, Axis axis) const {
  std::size_t base = 0;
  for (Axis a : kGroupAxes) {
    if (a == axis) return groups[base + static_cast<std::size_t>(grid.group_index(rank, {axis}))];
    base += static_cast<std::size_t>(grid.size() / grid.size_of(a));
  }
  throw Error(Status::invalid_argument, name + ": no groups along " + axis_name(axis));
}

std::vector<int> ModuleGrid::replica_ranks(int stage, int replica) const {
  Coords c{};
  c[static_cast<std::size_t>(Axis::pp)] = stage;
  c[static_cast<std::size_t>(Axis::dp)] = replica;
  return grid.group_of(grid.rank_at(c), {Axis::tp});
}

std::vector<int> ProgramStage::replica_ranks(int replica) const {
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(devices_per_replica));
  for (int d = 0; d < devices_per_replica; ++d) out.push_back(first_device + replica * device_stride + d);
  return out;
}

int Topology::module_index(const std::string& name) const {
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

RankPlace Topology::place_of(int rank) const {
  if (rank < 0 || rank >= world_size) {
    throw Error(Status::invalid_argument, "rank " + std::to_string(rank) + " is out of range (the world has " +
                                              std::to_string(world_size) + (world_size == 1 ? " rank)" : " ranks)"));
  }
  const int s = stage_of_rank[static_cast<std::size_t>(rank)];
  const ProgramStage& st = stages[static_cast<std::size_t>(s)];
  const int offset = rank - st.first_device;
  return {s, offset / st.device_stride, offset % st.device_stride};
}

Topology build_groups(const spec::ModelSpec& model, const plan::Plan& plan, int world_size) {
  if (world_size != plan.devices) {
    throw Error(Status::invalid_argument, "the plan runs on " + std::to_string(plan.devices) +
                                              " devices but the world has " + std::to_string(world_size) +
                                              " ranks: start one rank per device");
  }
  if (world_size < 1) throw Error(Status::invalid_argument, "a world needs at least one rank");
  if (plan.modules.empty()) bad_plan("the plan places no module");
  Topology t;
  t.strategy = plan.strategy;
  t.layout = plan.layout;
  t.world_size = world_size;
  for (std::size_t i = 0; i < plan.modules.size(); ++i)
    t.modules.push_back(grid_of(model, plan.modules[i], static_cast<int>(i), world_size));
  switch (plan.layout) {
    case Layout::monolithic:
      add_global_stages(t, plan, false);
      break;
    case Layout::colocated:
      add_global_stages(t, plan, true);
      for (const auto& p : plan.modules) {
        if (p.role == spec::Role::encoder && (p.first_device != 0 || p.devices != world_size))
          bad_plan(p.name + ": a colocated encoder spans all " + std::to_string(world_size) + " devices");
      }
      break;
    case Layout::branches:
    case Layout::chain:
      add_module_stages(t, plan);
      break;
  }
  place_stages(t);
  hold(t);
  // Model order lists producers before consumers: links come out in pipeline order.
  for (const auto& consumer : model.modules) {
    const int to = t.module_index(consumer.name);
    for (const auto& input : consumer.inputs) {
      const int from = t.module_index(input);
      if (from >= 0 && to >= 0) link(t, from, to);
    }
  }
  for (const auto& m : model.modules) {
    if (m.role == spec::Role::loss && m.loss == "contrastive") batch_sync(t, m);
  }
  return t;
}

}  // namespace braid::runtime
