// Strategy `distmm`: each encoder of a contrastive model on its own devices with
// its own (TP, PP, DP); device counts balance the branches (min-max step time).
// Small encoders end up with DP only because TP only adds collectives to them.
#include <functional>

#include "core/common/error.hpp"

#include "core/plan/disaggregated.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/strategies.hpp"

namespace braid::plan {

bool strategy_applies(const spec::ModelSpec& model, Strategy s, std::string* why) {
  switch (s) {
    case Strategy::megatron:
    case Strategy::fixed:
    case Strategy::automatic:
      return true;
    case Strategy::distmm:
      if (model.topology == spec::Topology::contrastive) return true;
      return reject(why, "distmm balances parallel encoders joined by a contrastive loss; this model is a " +
                             std::string(spec::topology_name(model.topology)));
    case Strategy::disttrain:
    case Strategy::optimus:
      if (model.topology == spec::Topology::chain) return true;
      return reject(why, std::string(strategy_name(s)) + " needs encoders feeding an llm; this model is a " +
                             spec::topology_name(model.topology));
  }
  return false;
}

// Every grid of module `m` on `devices` devices: tp inside a node, any pp up to its
// layers (split evenly), dp the rest. Constraints (0 = free) narrow it.
ModulePlacement grid_placement(const cost::CostModel& cost, int m, int tp, int pp, int dp, int microbatch) {
  const auto& spec = cost.run().model.modules[static_cast<std::size_t>(m)];
  ModulePlacement p;
  p.name = spec.name;
  p.role = spec.role;
  p.module = m;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.devices = tp * pp * dp;
  p.microbatch_size = microbatch;
  p.layers_per_stage = even_split(spec.layers, pp);
  return p;
}

Plan finish_plan(const cost::CostModel& cost, Plan plan) {
  std::string reason;
  if (!evaluate(cost, plan, &reason)) {
    throw Error(Status::internal, std::string("the ") + strategy_name(plan.strategy) +
                                      " search chose a plan that does not evaluate: " + reason);
  }
  return plan;
}

std::vector<ModulePlacement> module_grids(const cost::CostModel& cost, int m, int devices, int microbatch,
                                          const Constraints& c) {
  const auto& spec = cost.run().model.modules[static_cast<std::size_t>(m)];
  std::vector<ModulePlacement> out;
  for (int tp : divisors(cost.run().cluster.devices_per_node)) {
    if ((c.tp && tp != c.tp) || devices % tp != 0) continue;
    for (int pp = 1; pp <= std::min(spec.layers, devices / tp); ++pp) {
      if ((c.pp && pp != c.pp) || devices % (tp * pp) != 0) continue;
      out.push_back(grid_placement(cost, m, tp, pp, devices / (tp * pp), microbatch));
    }
  }
  return out;
}

// The module with the most parameters: where user tp/pp constraints apply.
int largest_module(const cost::CostModel& cost, spec::Role role) {
  int best = -1;
  for (std::size_t i = 0; i < cost.run().model.modules.size(); ++i) {
    if (cost.run().model.modules[i].role != role) continue;
    if (best < 0 || cost.parameters(static_cast<int>(i)) > cost.parameters(best)) best = static_cast<int>(i);
  }
  return best;
}

std::optional<Plan> search_distmm(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                  std::string* why) {
  const auto& run = cost.run();
  if (!strategy_applies(run.model, Strategy::distmm, why)) return std::nullopt;
  const int n = run.devices(), per_node = run.cluster.devices_per_node;
  std::vector<int> encoders;
  for (std::size_t i = 0; i < run.model.modules.size(); ++i) {
    if (run.model.modules[i].role == spec::Role::encoder) encoders.push_back(static_cast<int>(i));
  }
  const int constrained = largest_module(cost, spec::Role::encoder);
  const int reserve = static_cast<int>(encoders.size()) - 1;  // every other encoder needs a device
  if (n <= reserve) {
    if (why)
      *why = "distmm puts each of the " + std::to_string(encoders.size()) +
             " encoders on devices of its own: it needs " + std::to_string(encoders.size()) +
             " devices, the cluster has " + std::to_string(n);
    return std::nullopt;
  }
  std::vector<std::vector<ModuleAnalysis>> options;
  for (int m : encoders) {
    Constraints mc = m == constrained ? c : Constraints{};
    std::vector<ModuleAnalysis> all;
    for (int d = 1; d <= n - reserve; ++d) {
      if (!allowed_module_size(d, per_node)) continue;
      for (auto& p : module_grids(cost, m, d, run.training.microbatch, mc)) {
        if (mc.dp && p.dp != mc.dp) continue;
        if (stats) ++stats->evaluated;
        ModuleAnalysis a;
        if (analyze_branch(cost, p, a, nullptr) && a.fits) all.push_back(std::move(a));
      }
    }
    if (all.empty()) {
      if (why)
        *why = "encoder '" + run.model.modules[static_cast<std::size_t>(m)].name + "' fits no grid of up to " +
               std::to_string(n - reserve) + " devices";
      return std::nullopt;
    }
    // No pruning: the batch-sync depends on every figure of a grid (its last stage's width, the
    // loss tower's replicas, where packing puts it by devices and tp), so no grid of a module
    // dominates another whatever the other towers' grids.
    options.push_back(std::move(all));
  }
  // Exact combination of the options, devices within the cluster.
  std::vector<const ModuleAnalysis*> pick(options.size()), best_pick;
  double best_time = 0;
  int best_devices = 0;
  std::vector<ModulePlacement> placed;  // each combination's, packed (reused: the loop is hot)
  std::function<void(std::size_t, int)> combine = [&](std::size_t k, int used) {
    if (k == options.size()) {
      if (c.all_devices && used != n) return;
      if (!packs(cost, pick, placed)) return;
      double t = combine_branches(cost, pick, placed);
      if (best_pick.empty() || t < best_time * (1 - 1e-9) || (t <= best_time * (1 + 1e-9) && used < best_devices)) {
        best_time = t;
        best_devices = used;
        best_pick = pick;
      }
      return;
    }
    for (const auto& a : options[k]) {
      if (used + a.placement.devices > n) continue;
      if (c.towers_share_tp && k > 0 && a.placement.tp != pick[0]->placement.tp) continue;
      pick[k] = &a;
      combine(k + 1, used + a.placement.devices);
    }
  };
  combine(0, 0);
  if (best_pick.empty()) {
    if (why) {
      *why = c.all_devices ? "no combination of the encoders' grids that fit memory uses all " + std::to_string(n) +
                                 " devices (" + module_size_rule(per_node) + ")"
                           : "the encoders' smallest grids that fit memory need more than " + std::to_string(n) +
                                 " devices together";
    }
    return std::nullopt;
  }
  Plan plan;
  plan.strategy = Strategy::distmm;
  plan.layout = Layout::branches;
  plan.cluster_devices = n;
  plan.schedule =
      spec::Schedule::gpipe;  // batch-sync: a group's forwards, then its backwards (DistMM-Pipe across groups)
  for (const auto* a : best_pick) plan.modules.push_back(a->placement);
  pack_placements(cost, plan.modules);
  return finish_plan(cost, std::move(plan));
}

}  // namespace braid::plan
