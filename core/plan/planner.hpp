// The planner's entry point: run one strategy, or all of them (auto) and rank
// them, or evaluate a plan the user wrote. The CLI, the C ABI and the benchmarks call it
// through orchestrate::make_plan, which lets the bubble scheduler re-score optimus plans.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"
#include "core/plan/strategies.hpp"

namespace braid::plan {

struct PlanRequest {
  Strategy strategy = Strategy::automatic;
  Constraints constraints;
  std::optional<Plan> fixed;  // the plan to evaluate, with Strategy::fixed
  // Re-scores a colocated plan's candidates (best first by the closed form, never empty)
  // and returns the best; empty: the closed form stands. Set by orchestrate::make_plan.
  // (`= {}` lets PlanRequest{strategy, constraints, fixed} leave it out without a warning.)
  std::function<Plan(const cost::CostModel&, std::vector<Plan>)> rescore_colocated = {};
};

// Runs one strategy's search.
std::optional<Plan> search(const cost::CostModel& cost, Strategy s, const Constraints& c, SearchStats* stats,
                           std::string* why);

// Throws Error: Status::infeasible when nothing fits (the message says why and
// what would fit), Status::bad_config for an invalid fixed plan or constraint.
PlanResult make_plan(const cost::CostModel& cost, const PlanRequest& request);

// What would make an infeasible run fit, as one sentence (or "" when nothing found), each
// checked with megatron's search: megatron on these devices when `requested` was another
// strategy, the fewest nodes above these it fits on, the most below (a batch too small for
// these), or a recomputation, ZeRO or microbatch setting.
std::string suggest_fit(const spec::RunSpec& run, Strategy requested);

}  // namespace braid::plan
