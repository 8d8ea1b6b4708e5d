// Planning as braid's callers do it (the CLI, the C ABI, the trainer, the benchmarks):
// the planner with optimus plans re-scored by the bubble scheduler, and the report of a
// plan with its simulated step next to the closed form.
#pragma once

#include "core/cost/cost_model.hpp"
#include "core/plan/plan_io.hpp"
#include "core/plan/planner.hpp"

namespace braid::orchestrate {

// plan::make_plan with PlanRequest::rescore_colocated set to bubble::best_scheduled
// (unless the request brings its own): an optimus plan's step is its fine schedule's.
// Throws as plan::make_plan does.
plan::PlanResult make_plan(const cost::CostModel& cost, plan::PlanRequest request);

// The report of `result` (for plan::to_json, to_yaml, to_table) with its best plan's
// simulated step, or why it could not be simulated. It points to `result` and `cost`.
plan::PlanReport plan_report(const cost::CostModel& cost, const plan::PlanResult& result, plan::Strategy requested);

}  // namespace braid::orchestrate
