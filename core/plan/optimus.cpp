// Strategy `optimus`: every device holds the llm and the encoders. Fix the llm's
// 3D grid, enumerate encoder grids with TP dividing the llm's TP and PP dividing
// its PP, and score each with the colocated closed form (encoder work before and
// after the llm). The closed form ranks the whole space; the bubble scheduler then
// re-scores a shortlist (orchestrate::make_plan), as it is too slow to run on every grid.
#include <algorithm>
#include <functional>

#include "core/plan/evaluate.hpp"
#include "core/plan/strategies.hpp"

namespace braid::plan {

// The llm grid of a colocated plan: llm split evenly, projectors in the first
// stage, generators in the last; encoders are added by the caller.
Plan colocated_llm_grid(const cost::CostModel& cost, int tp, int pp, int dp) {
  Plan plan = megatron_plan(cost, tp, pp, dp);
  std::erase_if(plan.modules, [](const ModulePlacement& p) { return p.role == spec::Role::encoder; });
  plan.strategy = Strategy::optimus;
  plan.layout = Layout::colocated;
  plan.schedule = spec::Schedule::one_f_one_b;
  plan.virtual_stages = 1;
  return plan;
}

// Encoder grids compatible with an llm grid of (tp, pp) over `devices`.
std::vector<ModulePlacement> colocated_encoder_grids(const cost::CostModel& cost, int m, int devices, int llm_tp,
                                                     int llm_pp, int encoder_pp) {
  std::vector<ModulePlacement> out;
  for (auto& p : module_grids(cost, m, devices, cost.run().training.microbatch, Constraints{0, encoder_pp, 0})) {
    if (llm_tp % p.tp == 0 && llm_pp % p.pp == 0) out.push_back(std::move(p));
  }
  return out;
}

namespace {

// Inserts `plan` into `list` (best first) when it is among the kOptimusShortlist best.
void keep_best(std::vector<Plan>& list, const Plan& plan) {
  auto at = std::find_if(list.begin(), list.end(), [&](const Plan& p) { return better(plan, p); });
  if (at == list.end() && list.size() >= kOptimusShortlist) return;
  list.insert(at, plan);
  if (list.size() > kOptimusShortlist) list.pop_back();
}

}  // namespace

std::optional<Plan> search_optimus(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                   std::string* why, std::vector<Plan>* shortlist) {
  const auto& run = cost.run();
  if (!strategy_applies(run.model, Strategy::optimus, why)) return std::nullopt;
  const int n = run.devices();
  const int llm = run.model.llm_index();
  const auto& llm_spec = run.model.modules[static_cast<std::size_t>(llm)];
  std::vector<int> encoders;
  for (std::size_t i = 0; i < run.model.modules.size(); ++i) {
    if (run.model.modules[i].role == spec::Role::encoder) encoders.push_back(static_cast<int>(i));
  }
  std::optional<Plan> best;
  ClosestMiss miss;
  for (int tp : divisors(run.cluster.devices_per_node)) {
    if (c.tp && tp != c.tp) continue;
    for (int pp = 1; pp <= std::min(llm_spec.layers, n / tp); ++pp) {
      if ((c.pp && pp != c.pp) || n % (tp * pp) != 0) continue;
      const int dp = n / (tp * pp);
      if (c.dp && dp != c.dp) continue;
      Plan base = colocated_llm_grid(cost, tp, pp, dp);
      std::vector<std::vector<ModulePlacement>> grids;
      for (int e : encoders) grids.push_back(colocated_encoder_grids(cost, e, n, tp, pp, c.encoder_pp));
      std::function<void(std::size_t, Plan&)> pick = [&](std::size_t k, Plan& plan) {
        if (k == grids.size()) {
          if (stats) ++stats->evaluated;
          if (!evaluate(cost, plan, nullptr)) {
            miss.note(plan);
            return;
          }
          if (!best || better(plan, *best)) best = plan;
          if (shortlist) keep_best(*shortlist, plan);
          return;
        }
        for (const auto& g : grids[k]) {
          plan.modules.push_back(g);
          pick(k + 1, plan);
          plan.modules.pop_back();
        }
      };
      pick(0, base);
    }
  }
  if (!best) {
    if (why) {
      *why = miss.reason(cost);
      if (why->empty()) *why = "no llm grid divides " + std::to_string(n) + " devices";
    }
    return std::nullopt;
  }
  return best;
}

}  // namespace braid::plan
