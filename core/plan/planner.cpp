#include "core/plan/planner.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/common/error.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/stage_load.hpp"

namespace braid::plan {

std::optional<Plan> search(const cost::CostModel& cost, Strategy s, const Constraints& c, SearchStats* stats,
                           std::string* why) {
  switch (s) {
    case Strategy::megatron:
      return search_megatron(cost, c, stats, why);
    case Strategy::distmm:
      return search_distmm(cost, c, stats, why);
    case Strategy::disttrain:
      return search_disttrain(cost, c, stats, why);
    case Strategy::optimus:
      return search_optimus(cost, c, stats, why);
    default:
      break;
  }
  if (why) *why = std::string("'") + strategy_name(s) + "' is not a search strategy";
  return std::nullopt;
}

namespace {

bool fits_with(spec::RunSpec run) {
  cost::CostModel cost(run);
  return search_megatron(cost, Constraints{}, nullptr, nullptr).has_value();
}

std::string ratio(double a, double b) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2fx the step time of ", a / b);
  return text;
}

// Where in the plan's file `why` points: the placement it opens with ("vision: tp 3 ..."),
// else the file; "" for a plan the planner made.
std::string location(const Plan& plan, const std::string& why) {
  for (std::size_t i = 0; i < plan.modules.size() && i < plan.source.modules.size(); ++i) {
    if (why.rfind(plan.modules[i].name + ":", 0) == 0) return plan.source.modules[i] + ": ";
  }
  return plan.source.file.empty() ? "" : plan.source.file + ": ";
}

Plan evaluate_fixed(const cost::CostModel& cost, Plan plan) {
  plan.strategy = Strategy::fixed;
  plan.cluster_devices = cost.run().devices();
  std::string why;
  if (evaluate(cost, plan, &why)) {
    if (plan.source.devices > 0 && plan.source.devices != plan.devices)
      throw Error(Status::bad_config, plan.source.devices_where + ": the file says " +
                                          std::to_string(plan.source.devices) + " devices, its modules use " +
                                          std::to_string(plan.devices) + " (leave the field out, or correct it)");
    return plan;
  }
  // A plan that is well formed but over memory is infeasible; anything else is bad input.
  bool over_memory =
      plan.estimate.iteration_time_s > 0 && plan.estimate.peak_memory_gib * kGiB > cost.run().cluster.memory_bytes;
  throw Error(over_memory ? Status::infeasible : Status::bad_config,
              location(plan, why) + "the given plan cannot run: " + why);
}

// A strategy's best plan as the runtime will execute it: optimus plans run with
// the bubble scheduler's fine schedule, so the request's hook re-scores their shortlist.
std::optional<Plan> search_scored(const cost::CostModel& cost, Strategy s, const PlanRequest& request,
                                  std::string* why) {
  if (s != Strategy::optimus || !request.rescore_colocated) return search(cost, s, request.constraints, nullptr, why);
  std::vector<Plan> shortlist;
  if (!search_optimus(cost, request.constraints, nullptr, why, &shortlist)) return std::nullopt;
  return request.rescore_colocated(cost, std::move(shortlist));
}

}  // namespace

std::string suggest_fit(const spec::RunSpec& run, Strategy requested) {
  // Every hint is checked with megatron, the one search that always uses every device.
  const int per_node = run.cluster.devices_per_node, nodes = run.cluster.nodes;
  if (requested != Strategy::megatron && requested != Strategy::automatic && fits_with(run))
    return "a megatron layout fits these devices (--strategy megatron, or auto)";
  const auto on_nodes = [&](int n) {
    spec::RunSpec r = run;
    r.cluster.nodes = n;
    return fits_with(r);
  };
  // The nearest node count that fits, either way: more for memory (up to 16x: beyond, the
  // request is another run), fewer for a batch too small to split over these (down to one).
  for (int d = 1; nodes - d >= 1 || nodes + d <= nodes * 16; ++d) {
    if (const int n = nodes - d; n >= 1 && on_nodes(n))
      return "it fits on " + std::to_string(n) + " node" + (n > 1 ? "s (" : " (") + std::to_string(n * per_node) +
             " devices) with a megatron layout: the batch does not split over more";
    if (const int n = nodes + d; n <= nodes * 16 && on_nodes(n))
      return "it fits from " + std::to_string(n) + " nodes (" + std::to_string(n * per_node) +
             " devices) with a megatron layout";
  }
  const auto with = [&](const std::string& setting, const std::function<void(spec::TrainingSpec&)>& change) {
    spec::RunSpec r = run;
    change(r.training);
    return fits_with(r) ? "with '" + setting + "' a megatron layout fits these devices" : std::string();
  };
  if (run.training.recompute != spec::Recompute::full) {
    if (auto hint = with("recompute: full", [](auto& t) { t.recompute = spec::Recompute::full; }); !hint.empty())
      return hint;
  }
  if (run.training.zero_stage < 3) {
    if (auto hint = with("zero_stage: 3", [](auto& t) { t.zero_stage = 3; }); !hint.empty()) return hint;
  }
  for (int mb = run.training.microbatch / 2; mb >= 1; mb /= 2) {
    if (auto hint = with("microbatch: " + std::to_string(mb), [mb](auto& t) { t.microbatch = mb; }); !hint.empty())
      return hint;
  }
  return "";
}

PlanResult make_plan(const cost::CostModel& cost, const PlanRequest& request) {
  const auto& run = cost.run();
  PlanResult result;
  if (request.strategy == Strategy::fixed) {
    if (!request.fixed) throw Error(Status::invalid_argument, "strategy 'fixed' needs a plan to evaluate");
    result.best = evaluate_fixed(cost, *request.fixed);
    if (result.best.layout == Layout::colocated && request.rescore_colocated)
      result.best = request.rescore_colocated(cost, {result.best});
    return result;
  }
  std::vector<Strategy> order;
  if (request.strategy == Strategy::automatic) {
    order = {Strategy::megatron, Strategy::distmm, Strategy::disttrain, Strategy::optimus};
  } else {
    std::string why;
    if (!strategy_applies(run.model, request.strategy, &why)) {
      throw Error(Status::unsupported,
                  std::string("strategy '") + strategy_name(request.strategy) + "' does not apply: " + why);
    }
    order = {request.strategy};
  }
  for (Strategy s : order) {
    Alternative alt;
    alt.strategy = s;
    std::string why;
    if (!strategy_applies(run.model, s, &why)) {
      alt.reason = "not applicable: " + why;
    } else if (auto plan = search_scored(cost, s, request, &why)) {
      alt.feasible = true;
      alt.iteration_time_s = plan->estimate.iteration_time_s;
      alt.plan = std::move(plan);
    } else {
      alt.reason = "infeasible: " + why;
    }
    result.alternatives.push_back(std::move(alt));
  }
  // Feasible first, fastest first; the rest keep their order.
  std::stable_sort(result.alternatives.begin(), result.alternatives.end(),
                   [](const Alternative& a, const Alternative& b) {
                     if (a.feasible != b.feasible) return a.feasible;
                     if (!a.feasible) return false;
                     return better(*a.plan, *b.plan);
                   });
  const Alternative& winner = result.alternatives.front();
  if (!winner.feasible) {
    std::string msg = "no plan fits " + std::to_string(run.devices()) + " x " + run.cluster.device_name;
    for (const auto& a : result.alternatives) msg += std::string("\n  ") + strategy_name(a.strategy) + ": " + a.reason;
    const auto& c = request.constraints;
    if (c.tp || c.pp || c.dp) {
      // The other constraints stay: they are what the caller can run (braid train's).
      Constraints free = c;
      free.tp = free.pp = free.dp = 0;
      if (auto plan = search_megatron(cost, free, nullptr, nullptr)) {
        std::string asked;
        for (auto [name, v] : {std::pair{"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}})
          if (v) asked += (asked.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(v);
        msg += "\n  without " + asked + " megatron finds " + describe_grids(*plan);
      }
    } else if (std::string hint = suggest_fit(run, request.strategy); !hint.empty()) {
      msg += "\n  " + hint;
    }
    throw Error(Status::infeasible, msg);
  }
  for (auto& a : result.alternatives) {
    if (&a == &winner || !a.feasible) continue;
    a.reason = ratio(a.iteration_time_s, winner.iteration_time_s) + strategy_name(winner.strategy);
  }
  result.alternatives.front().reason = "fastest";
  result.best = *winner.plan;
  if (request.strategy == Strategy::automatic) {
    result.best.notes.push_back(std::string("auto chose ") + strategy_name(winner.strategy) + " out of " +
                                std::to_string(std::count_if(result.alternatives.begin(), result.alternatives.end(),
                                                             [](const Alternative& a) { return a.feasible; })) +
                                " feasible strategies");
  } else {
    result.alternatives.clear();
  }
  return result;
}

}  // namespace braid::plan
