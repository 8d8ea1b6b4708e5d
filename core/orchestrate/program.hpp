// The program of any plan, as `braid simulate`, `braid train`, the C ABI and the
// reports run it: a colocated plan's from the bubble scheduler (core/bubble), every
// other plan's from pipeline::build_program.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"

namespace braid::orchestrate {

// The schedules `plan` runs, its default first: pipeline::schedules_for, or for a
// colocated plan bubble::colocated_schedules.
std::vector<spec::Schedule> schedules_for(const cost::CostModel& cost, const plan::Plan& plan);

// The schedule a caller names for `plan` (--schedule, the C ABI): nullopt for "" (the
// plan's default). Throws Error(Status::invalid_argument) for a name that is no schedule
// (spec::schedule_named: with the closest name), Error(Status::unsupported) with
// pipeline::schedule_refusal's message for a schedule the plan does not run.
std::optional<spec::Schedule> parse_schedule_for(const cost::CostModel& cost, const plan::Plan& plan,
                                                 std::string_view name);

// `schedule` nullopt: the plan's default. Throws as pipeline::build_program does (and,
// for a colocated plan, as bubble::schedule does).
pipeline::Program build_program(const cost::CostModel& cost, const plan::Plan& plan,
                                std::optional<spec::Schedule> schedule = std::nullopt);

// What `stage` of a program of `plan` runs (pipeline::StagePart), its modules numbered as
// the plan numbers them (indices into plan.modules, the C ABI's numbering), in the order
// the stage runs them.
std::vector<pipeline::StagePart> plan_parts(const plan::Plan& plan, const pipeline::StageProgram& stage);

}  // namespace braid::orchestrate
