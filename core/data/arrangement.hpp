// How one global batch runs on a plan: the grid cell of every sample (which fixes its DP
// rank in every module) and the microbatch slot it runs in, with no reordering, with
// intra-microbatch reordering (LPT over the cells) or with both intra and inter
// (each pipeline group's microbatches in the order that minimises its 1F1B step).
// Also the per-(replica, microbatch) loads that scale the program's work in the simulator.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/data/microbatch_order.hpp"
#include "core/data/reorder.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"

namespace braid::data {

// A module whose layers a program stage holds, and the share of its layers there.
struct StageShare {
  int module = 0;
  double share = 1;
};

// Where a plan's program takes its samples from.
struct BatchLayout {
  long long samples = 0;                            // per step
  int modules = 0;                                  // model modules: the columns of a cost matrix
  int slots = 1;                                    // microbatches per pipeline and step
  int cell_slot = 1;                                // samples per cell and microbatch
  CellGrid grid;                                    // over the DP widths of every stage
  std::vector<std::vector<StageShare>> stage_work;  // per program stage
  std::vector<int> module_dp;                       // per model module; 0 where no stage holds it
  bool orderable = false;                           // the program runs 1F1B: inter ordering applies
  std::string unordered_why;                        // why not, when not
};

// Throws Error(unsupported) for programs whose microbatches do not form one stream per
// pipeline (contrastive batch-sync schedules), and Error(invalid_argument) when `samples`
// does not split into whole microbatches of every cell.
// Colocated plans: encoder tasks keep their nominal work (only forwards and backwards scale).
BatchLayout batch_layout(const spec::RunSpec& run, const plan::Plan& plan, const pipeline::Program& program,
                         long long samples);

enum class Reordering { none, intra, intra_inter };
const char* reordering_name(Reordering r);

struct Arrangement {
  std::vector<int> cell;  // per sample: its grid cell; its DP rank in module m is grid.rank_of(cell, dp of m)
  std::vector<int> slot;  // per sample: the position in the schedule of its microbatch
  std::vector<std::vector<int>> orders;  // per pipeline group: orders[g][k] = the microbatch run k-th
  std::vector<double> cell_load;         // per cell: the sum of its samples' costs
  long long evaluations = 0;             // 1F1B step times computed by the inter search
};

// `costs`: samples x modules, row-major; `reference`: per module, the cost of a sample
// whose load is 1 (nominal sizes, or the batch mean). Deterministic.
Arrangement arrange(const BatchLayout& layout, const pipeline::Program& program, std::span<const double> costs,
                    std::span<const double> reference, Reordering how, const OrderOptions& options = {});

// Per program stage, StageProgram::work_scale for `a`: replica r, slot k -> the work of
// its samples over the work of as many reference samples, summed over the stage's modules
// weighted by their share of layers there. Empty for a stage that holds no module.
std::vector<std::vector<double>> work_scales(const BatchLayout& layout, const pipeline::Program& program,
                                             std::span<const double> costs, std::span<const double> reference,
                                             const Arrangement& a);

// Each replica's compute time over the step on each stage with `scales`; the straggler
// of the stage whose slowest replica lags the mean most. `stage` is its index (-1: none).
struct StageStraggler {
  Straggler straggler;
  int stage = -1;
};
StageStraggler worst_stage(const pipeline::Program& program, const std::vector<std::vector<double>>& scales);

}  // namespace braid::data
