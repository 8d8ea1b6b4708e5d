// The program a plan runs: its stages (one per pipeline stage of each module grid,
// replicated over DP), the work and communication times of each from the cost
// model, and the instructions of its schedule. Monolithic, branches and chain plans
// only: a colocated plan's programs come from the bubble scheduler, which builds on
// these (orchestrate::build_program picks the right one for any plan).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"

namespace braid::pipeline {

// Schedules a plan can run, the first being its default:
//   monolithic: 1f1b, gpipe (+ interleaved when the plan has virtual stages); contrastive
//               models: batch-sync, distmm-pipe, two-phase
//   branches:   distmm-pipe, batch-sync, two-phase
//   chain:      1f1b, gpipe
// Throws Error(Status::internal) for a colocated plan.
std::vector<spec::Schedule> schedules_for(const cost::CostModel& cost, const plan::Plan& plan);

// Why a plan does not run the schedule a caller named: "a <layout> plan of this model
// runs <allowed>, not '<name>'" (for the Error(Status::unsupported) of build_program).
std::string schedule_refusal(const plan::Plan& plan, const std::vector<spec::Schedule>& allowed, std::string_view name);

// Module stage `module_stage` of placement `m` as a stage part: its layer range from the
// plan's layers_per_stage.
StagePart stage_part(const plan::ModulePlacement& m, int module_stage);

// `schedule` nullopt: the plan's default. Throws Error(Status::bad_config) when the plan
// cannot run (with the evaluator's reason), Status::unsupported for a schedule the plan's
// layout cannot run, Status::internal for a colocated plan.
Program build_program(const cost::CostModel& cost, const plan::Plan& plan,
                      std::optional<spec::Schedule> schedule = std::nullopt);

}  // namespace braid::pipeline
