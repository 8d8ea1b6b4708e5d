// Strategy `megatron`: one TP x PP x DP for the whole model, the baseline.
#include <algorithm>

#include "core/common/error.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/strategies.hpp"

namespace braid::plan {

bool check_constraints(const cost::CostModel& cost, const Constraints& c, std::string* why) {
  const int n = cost.run().devices(), per_node = cost.run().cluster.devices_per_node;
  if (c.tp && per_node % c.tp != 0) {
    return reject(why, "tp " + std::to_string(c.tp) + " must divide the " + std::to_string(per_node) +
                           " devices of a node (tensor parallelism stays on NVLink)");
  }
  const int product = std::max(c.tp, 1) * std::max(c.pp, 1) * std::max(c.dp, 1);
  if (n % product != 0) {
    std::string what;
    for (auto [name, v] : {std::pair{"tp", c.tp}, std::pair{"pp", c.pp}, std::pair{"dp", c.dp}}) {
      if (v) what += (what.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(v);
    }
    return reject(why, what + " does not divide the " + std::to_string(n) + " devices");
  }
  return true;
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

bool better(const Plan& a, const Plan& b) {
  double ta = a.estimate.iteration_time_s, tb = b.estimate.iteration_time_s;
  if (ta < tb * (1 - 1e-9)) return true;
  if (tb < ta * (1 - 1e-9)) return false;
  return a.devices < b.devices;
}

namespace {

ModulePlacement placement_for(const spec::ModelSpec& model, int index) {
  const auto& m = model.modules[static_cast<std::size_t>(index)];
  ModulePlacement p;
  p.name = m.name;
  p.role = m.role;
  p.module = index;
  return p;
}

}  // namespace

Plan megatron_plan(const cost::CostModel& cost, int tp, int pp, int dp) {
  const auto& run = cost.run();
  const auto& model = run.model;
  Plan plan;
  plan.strategy = Strategy::megatron;
  plan.layout = Layout::monolithic;
  plan.cluster_devices = run.devices();
  plan.schedule = run.training.schedule;
  plan.virtual_stages = pp > 1 ? run.training.virtual_stages : 1;
  const int llm = model.llm_index();
  auto place = [&](int index, int first_stage, std::vector<int> layers) {
    ModulePlacement p = placement_for(model, index);
    p.tp = tp;
    p.dp = dp;
    p.pp = static_cast<int>(layers.size());
    p.first_stage = first_stage;
    p.layers_per_stage = std::move(layers);
    p.devices = tp * dp * p.pp;
    p.first_device = grid_stage_devices(tp, dp, first_stage).first_device;
    p.microbatch_size = run.training.microbatch;
    plan.modules.push_back(std::move(p));
  };
  if (llm >= 0) {
    for (std::size_t i = 0; i < model.modules.size(); ++i) {
      const auto& m = model.modules[i];
      const int idx = static_cast<int>(i);
      if (m.role == spec::Role::llm) {
        place(idx, 0, even_split(m.layers, pp));
      } else if (m.role == spec::Role::generator) {
        place(idx, pp - 1, {m.layers});
      } else if (m.role != spec::Role::loss) {
        place(idx, 0, {m.layers});  // encoders and projectors share the first stage
      }
    }
  } else {
    // No backbone: every layer of every module, in model order, split evenly.
    int total = 0;
    for (const auto& m : model.modules) total += m.role == spec::Role::loss ? 0 : m.layers;
    std::vector<int> per_stage = even_split(total, std::min(pp, total));
    int stage = 0, left_in_stage = per_stage.front();
    for (std::size_t i = 0; i < model.modules.size(); ++i) {
      const auto& m = model.modules[i];
      if (m.role == spec::Role::loss) continue;
      int first = stage, left = m.layers;
      std::vector<int> layers;
      while (left > 0) {
        int take = std::min(left, left_in_stage);
        layers.push_back(take);
        left -= take;
        left_in_stage -= take;
        if (left_in_stage == 0 && stage + 1 < static_cast<int>(per_stage.size())) {
          left_in_stage = per_stage[static_cast<std::size_t>(++stage)];
        }
      }
      place(static_cast<int>(i), first, std::move(layers));
    }
  }
  plan.devices = tp * pp * dp;
  return plan;
}

std::optional<Plan> search_megatron(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                    std::string* why) {
  const auto& run = cost.run();
  const int n = run.devices();
  if (!check_constraints(cost, c, why)) return std::nullopt;
  std::optional<Plan> best;
  ClosestMiss miss;
  int min_layers = 1 << 30;  // pipeline depth is bounded by the split module
  for (const auto& m : run.model.modules) {
    if (m.role == spec::Role::llm) min_layers = m.layers;
  }
  if (run.model.llm_index() < 0) {
    min_layers = 0;
    for (const auto& m : run.model.modules) min_layers += m.role == spec::Role::loss ? 0 : m.layers;
  }
  for (int tp : divisors(run.cluster.devices_per_node)) {
    if (c.tp && tp != c.tp) continue;
    for (int pp = 1; pp <= std::min(n / tp, min_layers); ++pp) {
      if (c.pp && pp != c.pp) continue;
      if (n % (tp * pp) != 0) continue;
      int dp = n / (tp * pp);
      if (c.dp && dp != c.dp) continue;
      Plan plan = megatron_plan(cost, tp, pp, dp);
      if (stats) ++stats->evaluated;
      if (!evaluate(cost, plan, nullptr)) {
        miss.note(plan);
        continue;
      }
      if (!best || better(plan, *best)) best = std::move(plan);
    }
  }
  if (!best && why) {
    *why = miss.reason(cost);
    if (why->empty()) {
      *why = (c.tp || c.pp || c.dp) ? "no tp x pp x dp matches the constraints on " + std::to_string(n) + " devices"
                                    : "no tp x pp x dp layout divides " + std::to_string(n) + " devices";
    }
  }
  return best;
}

}  // namespace braid::plan
