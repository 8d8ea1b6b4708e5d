// The plan-selection options `braid plan`, `simulate`, `groups` and `train` share: the run
// file (and a cluster file to price it on), a strategy or a plan file, tp/pp/dp constraints.
#pragma once

#include <boost/program_options.hpp>
#include <string>

#include "core/cost/cost_model.hpp"
#include "core/plan/planner.hpp"

namespace braid::cli {

struct PlanOptions {
  std::string config, strategy = "auto", plan_file, cluster_file;
  int tp = 0, pp = 0, dp = 0;

  void add_to(boost::program_options::options_description& opts);
  // The usage problem with these options, or "" when they are fine.
  std::string problem(const boost::program_options::variables_map& vm) const;
  // The run file, on the --cluster file when one is given (the run's node count kept).
  spec::RunSpec load_run() const;
  // What to ask the planner (reads the plan file against `run`).
  plan::PlanRequest request(const spec::RunSpec& run) const;
};

}  // namespace braid::cli
