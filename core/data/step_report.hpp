// The data report of `braid simulate --data`: for a plan and its run's size
// distributions, each step's straggler and simulated step time with no reordering,
// intra-microbatch reordering, and intra + inter-microbatch reordering.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/data/arrangement.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"

namespace braid::data {

struct StepData {
  long long step = 0;
  // Per reordering (none, intra, intra_inter): the stage whose slowest replica lags its
  // mean most, in compute seconds over the step; inter ordering moves no sample between
  // ranks, so its straggler is intra's.
  StageStraggler straggler[3];
  double step_time_s[3] = {0, 0, 0};  // simulated, per reordering
};

struct DataReport {
  bool heterogeneous = false;  // false: every sample at its nominal size, all variants equal
  std::uint64_t seed = 0;
  long long samples = 0;           // per step
  int cells = 0, groups = 0;       // DP grid cells (lcm of widths) and pipeline groups (gcd)
  int microbatches = 0;            // per pipeline
  bool inter_ordered = false;      // false: intra + inter = intra (see note)
  double nominal_step_time_s = 0;  // every sample at its nominal size (the plain simulation)
  std::vector<std::string> stage_names;
  std::vector<StepData> steps;
  StepData mean;              // over the steps
  long long evaluations = 0;  // 1F1B step times the inter search computed
  int cost_models = 0;        // built to price other sample sizes
  std::vector<std::string> notes;
  double seconds = 0;  // wall time of the report
};

// For `plan` running `program` (built from it); `progress(done, total)` is called after
// each step when given.
DataReport data_report(const cost::CostModel& cost, const plan::Plan& plan, const pipeline::Program& program,
                       const std::function<void(int, int)>& progress = {});

}  // namespace braid::data
