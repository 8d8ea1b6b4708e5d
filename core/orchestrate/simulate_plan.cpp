#include "core/orchestrate/simulate_plan.hpp"

#include "core/common/error.hpp"
#include "core/orchestrate/program.hpp"

namespace braid::orchestrate {

sim::Result simulate_plan(const cost::CostModel& cost, const plan::Plan& plan) {
  return sim::simulate(build_program(cost, plan));
}

double simulated_step(const cost::CostModel& cost, const plan::Plan& plan, std::string* why) {
  try {
    return simulate_plan(cost, plan).step_time_s;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return 0;
  }
}

}  // namespace braid::orchestrate
