// The planner strategies. Each searches its own layout's space with the one
// cost model and returns the fastest feasible plan, or nothing with a reason.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/plan/plan.hpp"

namespace braid::plan {

// User constraints on the search (0 = free). Megatron applies them to its one
// grid; disttrain and optimus to the llm; distmm to the largest encoder.
struct Constraints {
  int tp = 0, pp = 0, dp = 0;
  // Pipeline stages of an MLLM's modules other than its llm (encoders, projectors) under
  // disttrain and optimus; 0: any. `braid train` sets 1 (train::trainable).
  int encoder_pp = 0;
  // Under distmm, every tower of a contrastive model in the same tp (the trainer's batch-sync
  // pairs each TP rank with the same TP rank of the other tower). `braid train` sets it.
  bool towers_share_tp = false;
  // Every device of the cluster in the plan (disttrain and distmm may leave some idle when
  // that is as fast): `braid train` sets it, as each of its ranks is one device.
  bool all_devices = false;
};

// Counts how much of the space a search visited, for benchmarks and tests.
struct SearchStats {
  long long evaluated = 0;
  // Brute force only: stop after this many seconds (0 = never) and set `stopped`.
  double time_limit_s = 0;
  bool stopped = false;
};

std::optional<Plan> search_megatron(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                    std::string* why);
std::optional<Plan> search_distmm(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                  std::string* why);
std::optional<Plan> search_disttrain(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                     std::string* why);
// Optimus' closed form scores encoder-first execution; `shortlist`, when given,
// receives the best kOptimusShortlist candidates by it (best first) for the bubble
// scheduler to re-score (PlanRequest::rescore_colocated, as orchestrate::make_plan sets it).
inline constexpr std::size_t kOptimusShortlist = 4;
std::optional<Plan> search_optimus(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                   std::string* why, std::vector<Plan>* shortlist = nullptr);

// The Megatron plan for one (tp, pp, dp): encoders and projectors in the first
// stage, the llm split evenly, generators in the last stage; models without an
// llm split all their layers evenly in model order. Not evaluated yet.
Plan megatron_plan(const cost::CostModel& cost, int tp, int pp, int dp);

// Whether the run's model fits a strategy's layout at all (and if not, why not).
bool strategy_applies(const spec::ModelSpec& model, Strategy s, std::string* why);

// A placement of module `m` as a (tp, pp, dp) grid, layers split evenly.
ModulePlacement grid_placement(const cost::CostModel& cost, int m, int tp, int pp, int dp, int microbatch);
// Places every projector on the devices of its encoder's last stage (chain layouts),
// replacing projector placements already there; call after the encoders are packed.
void attach_projectors(const cost::CostModel& cost, std::vector<ModulePlacement>& placements);
// Evaluates a search's chosen plan; one that does not evaluate is a bug (Status::internal).
Plan finish_plan(const cost::CostModel& cost, Plan plan);

// Every grid of module `m` on exactly `devices` devices: tp dividing the node,
// pp up to its layers (split evenly), dp the rest; constraints (0 = free) narrow it.
std::vector<ModulePlacement> module_grids(const cost::CostModel& cost, int m, int devices, int microbatch,
                                          const Constraints& c);
// The module of `role` with the most parameters (where user tp/pp constraints apply), or -1.
int largest_module(const cost::CostModel& cost, spec::Role role);

// Rejects constraints no layout can meet (tp not dividing a node, a product not
// dividing the devices), saying which.
bool check_constraints(const cost::CostModel& cost, const Constraints& c, std::string* why);

// Divisors of n in increasing order.
std::vector<int> divisors(int n);

// True when a is a strictly better plan than b: faster by more than a relative
// 1e-9, or as fast with fewer devices. Every search and the brute force use it.
bool better(const Plan& a, const Plan& b);

}  // namespace braid::plan
