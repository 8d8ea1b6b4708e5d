// Plans as text: JSON (machine-readable contract), YAML (writable by hand, read
// back by --plan: what to_yaml prints parses back to the same plan), and a table.
#pragma once

#include <string>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"
#include "core/spec/yaml_reader.hpp"

namespace braid::plan {

struct PlanReport {
  PlanReport(const PlanResult* r, Strategy req, const cost::CostModel* c) : result(r), requested(req), cost(c) {}

  const PlanResult* result;
  Strategy requested = Strategy::automatic;
  const cost::CostModel* cost;
  double simulated_step_s = 0;   // the best plan's simulated step (0: not simulated)
  std::string simulation_error;  // why it could not be simulated, if it could not
  std::string schedule;          // what the best plan runs by default, as simulate --schedule names it
};

std::string to_json(const PlanReport& report);
std::string to_yaml(const PlanReport& report);
std::string to_table(const PlanReport& report);

// Reads a plan written as to_yaml prints it (estimate and notes are ignored).
// Errors name the file, line and field, and check module names against the model.
Plan parse_plan(const spec::Node& root, const spec::RunSpec& run);
Plan load_plan(const std::string& path, const spec::RunSpec& run);
Plan parse_plan_text(const std::string& text, const spec::RunSpec& run, const std::string& source = "<string>");

}  // namespace braid::plan
