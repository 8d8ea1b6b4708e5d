// `braid simulate --data`: the data-reordering report (core/data/step_report.hpp) of the
// simulated plan, as JSON under `data_report` and as a table.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "core/cost/cost_model.hpp"
#include "core/data/step_report.hpp"
#include "core/plan/plan.hpp"

namespace braid::cli {

// Computes the report, showing progress on stderr once it has taken more than a second.
data::DataReport simulate_data(const cost::CostModel& cost, const plan::Plan& plan, const pipeline::Program& program);

// The `data_report` object of `braid simulate --format json --data`.
nlohmann::ordered_json data_report_json(const data::DataReport& report);
// The table `braid simulate --data` prints after the step.
void print_data_report(std::ostream& out, const data::DataReport& report);

}  // namespace braid::cli
