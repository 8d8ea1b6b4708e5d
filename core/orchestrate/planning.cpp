#include "core/orchestrate/planning.hpp"

#include "core/bubble/score.hpp"
#include "core/orchestrate/simulate_plan.hpp"

namespace braid::orchestrate {

plan::PlanResult make_plan(const cost::CostModel& cost, plan::PlanRequest request) {
  if (!request.rescore_colocated) request.rescore_colocated = bubble::best_scheduled;
  return plan::make_plan(cost, request);
}

plan::PlanReport plan_report(const cost::CostModel& cost, const plan::PlanResult& result, plan::Strategy requested) {
  plan::PlanReport report{&result, requested, &cost};
  report.simulated_step_s = simulated_step(cost, result.best, &report.simulation_error);
  return report;
}

}  // namespace braid::orchestrate
