// The simulated step of a plan: its program (default schedule, orchestrate::build_program)
// run through the simulator. Reports of a plan show it next to the planner's closed form.
#pragma once

#include <string>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"
#include "core/sim/simulator.hpp"

namespace braid::orchestrate {

sim::Result simulate_plan(const cost::CostModel& cost, const plan::Plan& plan);

// For reports: the simulated step, or 0 with `*why` set when the plan's program
// cannot be simulated (a report of the plan is still useful then).
double simulated_step(const cost::CostModel& cost, const plan::Plan& plan, std::string* why);

}  // namespace braid::orchestrate
