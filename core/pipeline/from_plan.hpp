// The program a plan runs: its stages (one per pipeline stage of each module grid,
// replicated over DP), the work and communication times of each from the cost
// model, and the instructions of its schedule.
#pragma once

#include <string>
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
//   colocated:  optimus-fine, optimus-coarse, encoder-first (core/bubble/scheduler.hpp)
std::vector<std::string> schedules_for(const cost::CostModel& cost, const plan::Plan& plan);

// Throws Error(Status::bad_config) when the plan cannot run (with the evaluator's
// reason), or Status::unsupported for a schedule the plan's layout cannot run.
Program build_program(const cost::CostModel& cost, const plan::Plan& plan, const std::string& schedule = "");

}  // namespace braid::pipeline
