#include "core/orchestrate/program.hpp"

#include <algorithm>

#include "core/bubble/scheduler.hpp"
#include "core/common/error.hpp"
#include "core/pipeline/from_plan.hpp"

namespace braid::orchestrate {

std::vector<spec::Schedule> schedules_for(const cost::CostModel& cost, const plan::Plan& plan) {
  if (plan.layout == plan::Layout::colocated) return bubble::colocated_schedules();
  return pipeline::schedules_for(cost, plan);
}

std::optional<spec::Schedule> parse_schedule_for(const cost::CostModel& cost, const plan::Plan& plan,
                                                 std::string_view name) {
  if (name.empty()) return std::nullopt;
  const spec::Schedule schedule = spec::schedule_named(name);  // invalid_argument for a name that is no schedule
  const auto allowed = schedules_for(cost, plan);
  if (std::find(allowed.begin(), allowed.end(), schedule) == allowed.end())
    throw Error(Status::unsupported, pipeline::schedule_refusal(plan, allowed, name));
  return schedule;
}

pipeline::Program build_program(const cost::CostModel& cost, const plan::Plan& plan,
                                std::optional<spec::Schedule> requested) {
  if (plan.layout != plan::Layout::colocated) return pipeline::build_program(cost, plan, requested);
  const auto allowed = bubble::colocated_schedules();
  const spec::Schedule schedule = requested.value_or(allowed.front());
  if (std::find(allowed.begin(), allowed.end(), schedule) == allowed.end())
    throw Error(Status::unsupported, pipeline::schedule_refusal(plan, allowed, spec::schedule_name(schedule)));
  // Complete programs from the bubble scheduler (the step's tail included).
  return bubble::program_named(bubble::schedule(cost, plan), schedule);
}

std::vector<pipeline::StagePart> plan_parts(const plan::Plan& plan, const pipeline::StageProgram& stage) {
  // Kept in the order the stage runs them (data flow: an encoder before its projector,
  // then the colocated encoders of its ENCODER_TASKs): a host runs them in this order.
  std::vector<pipeline::StagePart> out = stage.parts;
  for (auto& p : out) p.module = plan::placement_index(plan, p.module);
  return out;
}

}  // namespace braid::orchestrate
