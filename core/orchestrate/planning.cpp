#include "core/orchestrate/planning.hpp"

#include <algorithm>

#include "core/bubble/score.hpp"
#include "core/common/error.hpp"
#include "core/orchestrate/program.hpp"
#include "core/orchestrate/simulate_plan.hpp"

namespace braid::orchestrate {

spec::RunSpec overridden_run(const spec::RunSpec& run, const PlanOverrides& o) {
  spec::RunSpec out = run;
  auto& t = out.training;
  if (!o.schedule.empty()) {
    const spec::Schedule s = [&] {
      try {
        return spec::schedule_named(o.schedule);
      } catch (const Error& e) {
        throw Error(e.status(), std::string("schedule: ") + e.what());
      }
    }();
    const auto names = spec::run_schedule_names();
    if (std::find(names.begin(), names.end(), o.schedule) != names.end()) {
      t.schedule = s;
      if (s != spec::Schedule::interleaved) t.virtual_stages = 1;
    }
  }
  if (o.virtual_stages != 0) t.virtual_stages = o.virtual_stages;
  if (o.microbatch_size != 0) t.microbatch = o.microbatch_size;
  const auto problem = spec::check_training(t, out.model);
  if (!problem) return out;
  // The run was valid: an override caused it.
  const std::string& f = problem->field;
  const bool batch = f == "training.microbatch" || f == "training.global_batch" || f == "training.contrastive_batch";
  const char* member = batch && o.microbatch_size != 0 ? "microbatch_size"
                       : o.virtual_stages != 0         ? "virtual_stages"
                       : !o.schedule.empty()           ? "schedule"
                                                       : "microbatch_size";
  throw Error(Status::invalid_argument, std::string(member) + ": " + problem->message + " (" + f + ")");
}

std::optional<spec::Schedule> planned_schedule(const cost::CostModel& cost, const plan::Plan& plan,
                                               const PlanOverrides& overrides) {
  return parse_schedule_for(cost, plan, overrides.schedule);
}

plan::PlanResult make_plan(const cost::CostModel& cost, plan::PlanRequest request) {
  if (!request.rescore_colocated) request.rescore_colocated = bubble::best_scheduled;
  return plan::make_plan(cost, request);
}

plan::PlanReport plan_report(const cost::CostModel& cost, const plan::PlanResult& result, plan::Strategy requested,
                             std::optional<spec::Schedule> schedule) {
  plan::PlanReport report{&result, requested, &cost};
  report.simulated_step_s = simulated_step(cost, result.best, &report.simulation_error);
  report.schedule = spec::schedule_name(schedule.value_or(schedules_for(cost, result.best).front()));
  return report;
}

}  // namespace braid::orchestrate
