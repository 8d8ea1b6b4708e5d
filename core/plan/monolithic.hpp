// The per-stage analysis of a monolithic grid, shared by the monolithic
// evaluator and the colocated one (whose llm runs as a monolithic grid).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/plan/stage_load.hpp"

namespace braid::plan {

struct MonolithicStages {
  int tp = 1, dp = 1, stages = 0, microbatches = 1, virtual_stages = 1;
  int groups = 1, group_microbatches = 1;  // contrastive batch-sync groups
  bool contrastive = false;
  std::vector<StageLoad> loads;
  std::vector<double> times;   // per microbatch, per stage
  std::vector<double> held;    // microbatches whose activations a stage keeps
  std::vector<double> send_s;  // one p2p message from stage s to s+1 (and its gradient back)
  double wrap_send_s = 0;      // interleaved: one message from the last stage back to the first

  // Step time without the DP/optimizer tail.
  double span() const;
  // Exposed DP sync + optimizer after the pipeline, by stage.
  double tail(std::size_t stage, const spec::TrainingSpec& training) const;
};

// Validates the placements of `plan` as one grid and computes every stage's load. `grid`
// names the grid in a refusal (a colocated plan's llm grid is one too).
bool analyze_monolithic(const cost::CostModel& cost, const Plan& plan, MonolithicStages& out, std::string* why,
                        std::string_view grid = "a monolithic grid");

}  // namespace braid::plan
