// Evaluation of a plan: check it is valid for the model and cluster, then
// predict its step time, throughput and memory with the cost model.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"

namespace braid::plan {

// Fills plan.estimate and returns true when the plan can run; otherwise returns
// false and, when `why` is not null, explains what is wrong. Planners call this
// in their inner loops with why == nullptr, so failures build no strings then.
// With `per_device` (sized to the cluster's devices), also sets each device's breakdown
// (see device_memory).
bool evaluate(const cost::CostModel& cost, Plan& plan, std::string* why,
              std::vector<MemoryBreakdown>* per_device = nullptr);

// Per-layout evaluators behind evaluate().
bool evaluate_monolithic(const cost::CostModel& cost, Plan& plan, std::string* why,
                         std::vector<MemoryBreakdown>* per_device = nullptr);
bool evaluate_branches(const cost::CostModel& cost, Plan& plan, std::string* why,
                       std::vector<MemoryBreakdown>* per_device = nullptr);
bool evaluate_chain(const cost::CostModel& cost, Plan& plan, std::string* why,
                    std::vector<MemoryBreakdown>* per_device = nullptr);
bool evaluate_colocated(const cost::CostModel& cost, Plan& plan, std::string* why,
                        std::vector<MemoryBreakdown>* per_device = nullptr);

// The memory the cost model predicts on each device of `plan` at its peak, by kind, indexed
// by device id (the rank that runs it; devices the plan leaves idle: zero): the per-stage
// figures evaluate() takes the peak of, so the largest total is estimate.peak_memory_gib
// and the peak device's breakdown is estimate.memory. A plan that needs more memory than a
// device has still gets its figures; Error(bad_config) with the reason for one that does
// not evaluate otherwise.
std::vector<MemoryBreakdown> device_memory(const cost::CostModel& cost, const Plan& plan);

// Shared validity checks; each returns false (and says why) on the first problem.
// A module's TP width: inside one node, dividing the node, its heads and KV groups.
bool check_tp(const cost::CostModel& cost, const ModulePlacement& p, std::string* why);
// A module's stage split: pp stages, each with at least one layer, summing to its layers.
bool check_stages(const cost::CostModel& cost, const ModulePlacement& p, std::string* why);
// Rejects plans whose peak device memory (from `e`) exceeds the device's.
bool check_memory(const cost::CostModel& cost, const Estimate& e, std::string* why);
// Separate-device layouts: each placement uses tp x pp x dp devices inside the
// cluster, and no two placements overlap.
bool check_disjoint(const cost::CostModel& cost, const Plan& plan, std::string* why);
// "12.3 GiB"
std::string gib(double bytes);
// Records `message` in *why when asked; always returns false.
bool reject(std::string* why, const std::string& message);

// Among the plans a search rejected, the one that came closest to fitting: the least
// device memory needed (plans rejected before memory was counted rank last). An
// infeasible search explains itself with this one, not with whichever failed first.
class ClosestMiss {
 public:
  // Call after evaluate() returned false for `plan`.
  void note(const Plan& plan);
  // "vit tp 8 pp 2 dp 4, llm ...: <why it fails>", or "" when nothing was noted.
  std::string reason(const cost::CostModel& cost) const;

 private:
  std::optional<Plan> plan_;
  double need_ = 0;
};

// "tp 8, pp 4, dp 2" for a one-grid plan, "image tp 1 pp 1 dp 56, text ..." otherwise.
std::string describe_grids(const Plan& plan);

// Layers of `layers` split over `stages` as evenly as possible, earlier stages taking the remainder.
std::vector<int> even_split(int layers, int stages);

}  // namespace braid::plan
