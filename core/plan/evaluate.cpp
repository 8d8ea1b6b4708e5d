#include "core/plan/evaluate.hpp"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/common/error.hpp"
#include "core/plan/stage_load.hpp"

namespace braid::plan {

bool reject(std::string* why, const std::string& message) {
  if (why) *why = message;
  return false;
}

std::string gib(double bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << bytes / kGiB << " GiB";
  return s.str();
}

bool check_memory(const cost::CostModel& cost, const Estimate& e, std::string* why) {
  double capacity = cost.run().cluster.memory_bytes;
  double need = e.peak_memory_gib * kGiB;
  if (need <= capacity) return true;
  if (!why) return false;
  return reject(why, "needs " + gib(need) + " on " + e.peak_memory_at + " (weights " + gib(e.memory.weights) +
                         ", gradients " + gib(e.memory.gradients) + ", optimizer " + gib(e.memory.optimizer) +
                         ", activations " + gib(e.memory.activations) +
                         (e.memory.communication() > 0 ? ", collective buffers " + gib(e.memory.communication()) : "") +
                         ") but a device has " + gib(capacity));
}

std::vector<int> even_split(int layers, int stages) {
  std::vector<int> out(static_cast<std::size_t>(stages), layers / stages);
  for (int i = 0; i < layers % stages; ++i) ++out[static_cast<std::size_t>(i)];
  return out;
}

bool check_tp(const cost::CostModel& cost, const ModulePlacement& p, std::string* why) {
  const int per_node = cost.run().cluster.devices_per_node;
  const auto& m = cost.run().model.modules[static_cast<std::size_t>(p.module)];
  if (p.tp < 1 || p.pp < 1 || p.dp < 1) {
    return reject(why, p.name + ": tp, pp and dp must be at least 1");
  }
  if (p.tp > per_node || per_node % p.tp != 0) {
    return why ? reject(why, p.name + ": tp " + std::to_string(p.tp) + " must divide the " + std::to_string(per_node) +
                                 " devices of a node (tensor parallelism stays on NVLink)")
               : false;
  }
  if (p.first_device % p.tp != 0) {
    return why ? reject(why, p.name + ": first_device " + std::to_string(p.first_device) + " is not a multiple of tp " +
                                 std::to_string(p.tp) + ", so a tensor-parallel group would straddle two nodes")
               : false;
  }
  if (m.heads > 0 && (m.heads % p.tp != 0 || m.kv_groups % p.tp != 0)) {
    return why ? reject(why, p.name + ": tp " + std::to_string(p.tp) + " does not divide its " +
                                 std::to_string(m.heads) + " heads and " + std::to_string(m.kv_groups) + " kv groups")
               : false;
  }
  return true;
}

bool check_stages(const cost::CostModel& cost, const ModulePlacement& p, std::string* why) {
  const auto& m = cost.run().model.modules[static_cast<std::size_t>(p.module)];
  if (static_cast<int>(p.layers_per_stage.size()) != p.pp) {
    return why ? reject(why, p.name + ": layers_per_stage lists " + std::to_string(p.layers_per_stage.size()) +
                                 " stages but pp is " + std::to_string(p.pp))
               : false;
  }
  int sum = 0;
  for (int n : p.layers_per_stage) {
    if (n < 1 && m.role != spec::Role::projector) {
      return reject(why, p.name + ": every pipeline stage needs at least one layer");
    }
    sum += n;
  }
  if (sum != m.layers) {
    return why ? reject(why, p.name + ": layers_per_stage adds up to " + std::to_string(sum) + ", the module has " +
                                 std::to_string(m.layers) + " layers")
               : false;
  }
  return true;
}

void ClosestMiss::note(const Plan& plan) {
  // Rejected before memory was counted: infinitely far from fitting.
  double need = plan.estimate.peak_memory_gib > 0 ? plan.estimate.peak_memory_gib : 1e300;
  if (!plan_ || need < need_) {
    plan_ = plan;
    need_ = need;
  }
}

std::string ClosestMiss::reason(const cost::CostModel& cost) const {
  if (!plan_) return "";
  Plan copy = *plan_;
  std::string why;
  evaluate(cost, copy, &why);
  return describe_grids(copy) + ": " + why;
}

std::string describe_grids(const Plan& plan) {
  if (plan.layout == Layout::monolithic) {
    const auto& p = plan.modules.front();
    int stages = 0;
    for (const auto& m : plan.modules) stages = std::max(stages, m.first_stage + m.pp);
    return "tp " + std::to_string(p.tp) + ", pp " + std::to_string(stages) + ", dp " + std::to_string(p.dp);
  }
  std::string out;
  for (const auto& p : plan.modules) {
    if (p.role == spec::Role::projector) continue;
    out += (out.empty() ? "" : ", ") + p.name + " tp " + std::to_string(p.tp) + " pp " + std::to_string(p.pp) + " dp " +
           std::to_string(p.dp);
  }
  return out;
}

namespace {

// Checks what every layout needs before any arithmetic: each trained or used module
// placed exactly once, and grid numbers within the cluster (so products cannot overflow).
bool check_placements(const cost::CostModel& cost, const Plan& plan, std::string* why) {
  const auto& model = cost.run().model;
  const int n = cost.run().devices();
  if (plan.modules.empty()) return reject(why, "the plan places no modules");
  std::vector<int> placed(model.modules.size(), 0);
  for (const auto& p : plan.modules) {
    if (p.module < 0 || p.module >= static_cast<int>(model.modules.size()) ||
        model.modules[static_cast<std::size_t>(p.module)].name != p.name) {
      return reject(why, "plan module '" + p.name + "' is not a module of the model");
    }
    if (model.modules[static_cast<std::size_t>(p.module)].role == spec::Role::loss) {
      return reject(why, p.name + ": a loss is computed where its inputs are, it takes no placement");
    }
    if (++placed[static_cast<std::size_t>(p.module)] > 1) return reject(why, "the plan places '" + p.name + "' twice");
    if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.microbatch_size < 1) {
      return reject(why, p.name + ": tp, pp, dp and the microbatch size must be at least 1");
    }
    if (p.tp > n || p.pp > n || p.dp > n || p.first_device < 0 || p.first_device >= n || p.first_stage < 0 ||
        p.first_stage >= n) {
      return reject(why, p.name + ": tp, pp, dp, first_device and first_stage must lie within the cluster's " +
                             std::to_string(n) + " devices");
    }
  }
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    if (model.modules[i].role != spec::Role::loss && placed[i] == 0) {
      return reject(why, "the plan does not place module '" + model.modules[i].name + "'");
    }
  }
  return true;
}

}  // namespace

bool evaluate(const cost::CostModel& cost, Plan& plan, std::string* why, std::vector<MemoryBreakdown>* per_device) {
  plan.estimate = Estimate{};
  if (!check_placements(cost, plan, why)) return false;
  switch (plan.layout) {
    case Layout::monolithic:
      return evaluate_monolithic(cost, plan, why, per_device);
    case Layout::branches:
      return evaluate_branches(cost, plan, why, per_device);
    case Layout::chain:
      return evaluate_chain(cost, plan, why, per_device);
    case Layout::colocated:
      return evaluate_colocated(cost, plan, why, per_device);
  }
  return reject(why, "unknown layout");
}

std::vector<MemoryBreakdown> device_memory(const cost::CostModel& cost, const Plan& plan) {
  Plan copy = plan;
  std::vector<MemoryBreakdown> out(static_cast<std::size_t>(cost.run().devices()));
  std::string why;
  // Memory is the evaluators' last check: a plan that only fails it has its figures.
  if (!evaluate(cost, copy, &why, &out) && copy.estimate.peak_memory_gib <= 0)
    throw Error(Status::bad_config, "the plan's memory cannot be predicted: " + why);
  return out;
}

}  // namespace braid::plan
