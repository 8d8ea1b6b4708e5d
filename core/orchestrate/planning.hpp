// Planning as braid's callers do it (the CLI, the C ABI, the trainer, the benchmarks):
// the planner with optimus plans re-scored by the bubble scheduler, and the report of a
// plan with its simulated step next to the closed form.
#pragma once

#include <optional>
#include <string>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan_io.hpp"
#include "core/plan/planner.hpp"

namespace braid::orchestrate {

// What a caller may change of a run's training settings for one plan, as the run file's
// training section would (the C ABI's braid_plan_options); "" and 0 keep the run's own.
struct PlanOverrides {
  std::string schedule;     // any schedule name: the programs' default (planned_schedule)
  int virtual_stages = 0;   // training.virtual_stages
  int microbatch_size = 0;  // training.microbatch
};

// `run` as the overrides make it. The run file's schedules (1f1b, interleaved, gpipe) set
// training.schedule, which megatron plans with (with 1f1b or gpipe, virtual_stages
// becomes 1 unless given); the other schedules leave the run as it is. The result is
// checked as a run file's training section is (spec::check_training). Throws
// Error(Status::invalid_argument) whose message starts with the PlanOverrides member at
// fault ("microbatch_size: global batch 64 is not divisible by the microbatch size 3
// (training.global_batch)"; "schedule: " and spec::schedule_named's message for a name
// that is no schedule).
spec::RunSpec overridden_run(const spec::RunSpec& run, const PlanOverrides& overrides);

// The schedule the overrides name, for programs of `plan` (planned from the overridden
// run): nullopt when they name none; Error(Status::unsupported) with
// pipeline::schedule_refusal's message when the plan does not run it.
std::optional<spec::Schedule> planned_schedule(const cost::CostModel& cost, const plan::Plan& plan,
                                               const PlanOverrides& overrides);

// plan::make_plan with PlanRequest::rescore_colocated set to bubble::best_scheduled
// (unless the request brings its own): an optimus plan's step is its fine schedule's.
// Throws as plan::make_plan does.
plan::PlanResult make_plan(const cost::CostModel& cost, plan::PlanRequest request);

// The report of `result` (for plan::to_json, to_yaml, to_table) with its best plan's
// simulated step, or why it could not be simulated. It points to `result` and `cost`.
// `schedule`: what the plan's programs run when none is named (nullopt: the plan's default).
plan::PlanReport plan_report(const cost::CostModel& cost, const plan::PlanResult& result, plan::Strategy requested,
                             std::optional<spec::Schedule> schedule = std::nullopt);

}  // namespace braid::orchestrate
