// Layouts where each module has its own devices (branches, chain) decompose: a
// module's cost depends only on its own grid (TP, PP, DP, microbatch), and the
// step combines the modules' figures. Searches analyze each module option once
// and combine the survivors with the same arithmetic the evaluators use.
#pragma once

#include <string>
#include <vector>

#include "core/plan/stage_load.hpp"

namespace braid::plan {

// One module grid on its own devices, run for `microbatches` microbatches per step.
struct ModuleAnalysis {
  ModulePlacement placement;
  std::vector<StageLoad> loads;
  std::vector<double> held;  // activations kept per stage, in microbatches
  double sum = 0;            // sum of stage times (one microbatch through the module)
  double longest = 0;        // slowest stage time
  double span = 0;           // branches: the module's own pipelined step
  double tail = 0;           // exposed DP sync + optimizer after the step
  double tail_dp = 0, tail_optimizer = 0;
  double hardware_flops = 0, busy_seconds = 0;  // whole grid, whole step
  double peak_memory = 0;                       // bytes on its fullest device
  bool fits = false;                            // peak memory within the device
  double handover_s = 0;                        // chain: one hand-over message to a consuming module
};

// Fills sum, longest, tail, FLOPs, busy time and peak memory of `out` from its
// loads and held counts, for `microbatches` microbatches per step.
void summarize_module(const cost::CostModel& cost, ModuleAnalysis& out, double microbatches);

// Branches (contrastive): module `p` with DistMM-Pipe over `groups` groups of
// contrastive batch / (dp x microbatch) microbatches.
bool analyze_branch(const cost::CostModel& cost, const ModulePlacement& p, ModuleAnalysis& out, std::string* why);
// One contrastive batch-sync of towers on their own devices (batch_sync_cost): the
// group is the towers' last-stage replicas, and the image tower's last-stage replicas (the first
// tower's, if none sees images) compute the loss, as in the trainer.
BatchSyncCost branches_batch_sync_cost(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers);
// Step time of branches combined: slowest module + batch-sync per group + slowest tail, the
// batch-sync where `placed` (the modules' placements, packed onto devices) puts it.
double combine_branches(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& modules,
                        const std::vector<ModulePlacement>& placed, double* sync_seconds = nullptr);

// Chain: module `p` as part of a 1F1B pipeline of `microbatches` slots, with
// `stages_after` chain stages after its last one (members of a section are aligned
// to the section's end: encoders all hand over to the llm at once). Projectors in
// `riders` run on its last stage; `consumers` modules take its output (one hand-over each).
bool analyze_chain_module(const cost::CostModel& cost, const ModulePlacement& p,
                          const std::vector<const ModulePlacement*>& riders, int microbatches, int stages_after,
                          int consumers, spec::Schedule schedule, ModuleAnalysis& out, std::string* why);
// How many modules of the plan take module `m`'s output across devices (chain layouts).
int chain_consumers(const spec::ModelSpec& model, const spec::ModuleSpec& m);
// 1F1B over the chain: encoders, the llm and generators as three sections whose
// members run side by side: sum of the sections' sums + (m - 1) x slowest stage + tail.
double combine_chain(const std::vector<const ModuleAnalysis*>& encoders, const ModuleAnalysis& llm,
                     const std::vector<const ModuleAnalysis*>& generators, int microbatches);

// Device counts a disaggregated module may take: a divisor of the node size, or
// whole nodes, so placements pack without splitting groups across nodes needlessly.
bool allowed_module_size(int devices, int devices_per_node);
// That rule in words, for the reason a search gives when no split of the devices follows it.
std::string module_size_rule(int devices_per_node);
// Gives each placement (projectors aside) its first device: whole-node modules on
// node boundaries, largest first; smaller ones inside one node each, first fit,
// starting at a multiple of their tp. So a module costs where it lands what it costs
// at device 0, which is where searches analyse it. False when they do not all fit.
bool pack_placements(const cost::CostModel& cost, std::vector<ModulePlacement>& placements);
// Whether the modules of `picks` pack onto the cluster (pack_placements on copies).
bool packs(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& picks);
// Same, leaving the packed placements in `placed`.
bool packs(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& picks,
           std::vector<ModulePlacement>& placed);

}  // namespace braid::plan
