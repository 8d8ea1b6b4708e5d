// Branches layout (DistMM): each encoder on its own devices with its own
// (TP, PP, DP); a contrastive batch meets in one batch-sync per group.
#include <algorithm>
#include <map>

#include "core/plan/disaggregated.hpp"
#include "core/plan/evaluate.hpp"

namespace braid::plan {

bool check_disjoint(const cost::CostModel& cost, const Plan& plan, std::string* why) {
  std::vector<std::pair<int, int>> ranges;
  for (const auto& p : plan.modules) {
    if (p.role == spec::Role::projector) continue;  // projectors ride on their encoder's devices
    if (p.devices != static_cast<long long>(p.tp) * p.pp * p.dp) {
      return reject(why, p.name + ": devices must equal tp x pp x dp");
    }
    if (p.first_device < 0 || p.first_device + p.devices > cost.run().devices()) {
      return why ? reject(why, p.name + ": devices " + std::to_string(p.first_device) + ".." +
                                   std::to_string(p.first_device + p.devices - 1) + " are outside the cluster of " +
                                   std::to_string(cost.run().devices()))
                 : false;
    }
    ranges.emplace_back(p.first_device, p.first_device + p.devices);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return reject(why, "two modules share devices in a disaggregated plan");
  }
  return true;
}

bool allowed_module_size(int devices, int per_node) {
  return devices > 0 && (per_node % devices == 0 || devices % per_node == 0);
}

std::string module_size_rule(int per_node) {
  return "a module takes a divisor of a node's " + std::to_string(per_node) + " devices or whole nodes";
}

bool pack_placements(const cost::CostModel& cost, std::vector<ModulePlacement>& placements) {
  const int per_node = cost.run().cluster.devices_per_node, total = cost.run().devices();
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < placements.size(); ++i) {
    if (placements[i].role != spec::Role::projector) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return placements[a].devices > placements[b].devices; });
  int next_node = 0;      // first node no module has touched
  std::vector<int> fill;  // devices used in each partly filled node, by node
  for (std::size_t i : order) {
    auto& p = placements[i];
    if (p.devices >= per_node) {
      p.first_device = next_node * per_node;
      next_node += (p.devices + per_node - 1) / per_node;
      continue;
    }
    bool placed = false;
    for (std::size_t n = 0; n < fill.size() && !placed; ++n) {
      int start = (fill[n] + p.tp - 1) / p.tp * p.tp;
      if (start + p.devices <= per_node) {
        p.first_device = (next_node + static_cast<int>(n)) * per_node + start;  // partly filled nodes follow whole ones
        fill[n] = start + p.devices;
        placed = true;
      }
    }
    if (!placed) {
      fill.push_back(p.devices);
      p.first_device = (next_node + static_cast<int>(fill.size()) - 1) * per_node;
    }
  }
  return (next_node + static_cast<int>(fill.size())) * per_node <= total;
}

bool packs(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& picks,
           std::vector<ModulePlacement>& placed) {
  placed.clear();
  placed.reserve(picks.size());
  for (const auto* a : picks) placed.push_back(a->placement);
  return pack_placements(cost, placed);
}

bool packs(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& picks) {
  std::vector<ModulePlacement> placed;
  return packs(cost, picks, placed);
}

void summarize_module(const cost::CostModel& cost, ModuleAnalysis& out, double microbatches) {
  const auto& p = out.placement;
  out.sum = out.longest = out.tail = out.hardware_flops = out.busy_seconds = out.peak_memory = 0;
  for (std::size_t s = 0; s < out.loads.size(); ++s) {
    const auto& l = out.loads[s];
    out.sum += l.time();
    out.longest = std::max(out.longest, l.time());
    double dp = l.exposed_dp_sync(cost.run().training);
    if (dp + l.optimizer_s > out.tail) {
      out.tail = dp + l.optimizer_s;
      out.tail_dp = dp;
      out.tail_optimizer = l.optimizer_s;
    }
    out.hardware_flops += microbatches * l.work.hardware_flops() * p.tp * p.dp;
    out.busy_seconds += l.busy_seconds(microbatches, p.tp * p.dp);
    MemoryBreakdown at_peak = l.peak_state();
    at_peak.activations = l.activations(out.held[s]);
    out.peak_memory = std::max(out.peak_memory, at_peak.total());
  }
  out.fits = out.peak_memory <= cost.run().cluster.memory_bytes;
}

bool analyze_branch(const cost::CostModel& cost, const ModulePlacement& p, ModuleAnalysis& out, std::string* why) {
  const auto& train = cost.run().training;
  if (p.role != spec::Role::encoder) return reject(why, p.name + ": only encoders are placed in a branches plan");
  if (!check_tp(cost, p, why) || !check_stages(cost, p, why)) return false;
  const long long R = train.contrastive_batch;
  if (R % samples_per_microbatch(p) != 0) {
    return why ? reject(why, p.name + ": contrastive batch " + std::to_string(R) + " does not split into dp " +
                                 std::to_string(p.dp) + " x microbatch " + std::to_string(p.microbatch_size))
               : false;
  }
  const int groups = contrastive_groups(train);
  const int K = microbatches_per_group(train, p);  // microbatches per group per replica
  out.placement = p;
  out.loads = grid_loads(cost, p, p.microbatch_size);
  out.held.clear();
  for (int s = 0; s < p.pp; ++s) {
    // Batch-sync keeps a group's K forwards; the next group's forwards overlap the drain.
    out.held.push_back(K + (groups > 1 ? std::min(K, p.pp - 1 - s) : 0));
  }
  summarize_module(cost, out, double(groups) * K);
  // DistMM-Pipe: forwards of group g+1 fill the backward drain of group g, so the
  // pipeline fills and drains once per step.
  out.span = double(groups) * K * out.longest + (out.sum - out.longest);
  return true;
}

BatchSyncCost branches_batch_sync_cost(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers) {
  if (towers.empty()) return {};
  int fewest = towers.front().dp;
  std::vector<int> last_stages;
  const ModulePlacement* loss = &towers.front();
  for (const auto& p : towers) {
    const auto& m = cost.run().model.modules[static_cast<std::size_t>(p.module)];
    fewest = std::min(fewest, p.dp);
    const StageDevices last = module_stage_devices(p, p.pp - 1);
    for (int r = 0; r < last.replicas; ++r) last_stages.push_back(last.first_device + r * last.stride);
    if (m.modality == spec::Modality::image) loss = &p;
  }
  const auto group = cost::group_shape(last_stages, cost.run().cluster.devices_per_node);
  return batch_sync_cost(cost, towers_embed_dim(cost, towers), group, fewest, loss->dp);
}

double combine_branches(const cost::CostModel& cost, const std::vector<const ModuleAnalysis*>& modules,
                        const std::vector<ModulePlacement>& placed, double* sync_seconds) {
  double span = 0, tail = 0;
  for (const auto* a : modules) {
    span = std::max(span, a->span);
    tail = std::max(tail, a->tail);
  }
  const double sync = contrastive_groups(cost.run().training) * branches_batch_sync_cost(cost, placed).seconds();
  if (sync_seconds) *sync_seconds = sync;
  return span + sync + tail;
}

bool evaluate_branches(const cost::CostModel& cost, Plan& plan, std::string* why,
                       std::vector<MemoryBreakdown>* per_device) {
  const auto& run = cost.run();
  if (run.model.topology != spec::Topology::contrastive) {
    return reject(why, "the branches layout needs encoders joined by a contrastive loss");
  }
  if (!check_disjoint(cost, plan, why)) return false;
  std::vector<ModuleAnalysis> analyses(plan.modules.size());
  std::vector<const ModuleAnalysis*> parts;
  for (std::size_t i = 0; i < plan.modules.size(); ++i) {
    if (!analyze_branch(cost, plan.modules[i], analyses[i], why)) return false;
    parts.push_back(&analyses[i]);
  }
  Estimate& e = plan.estimate;
  e.iteration_time_s = combine_branches(cost, parts, plan.modules, &e.sync_s);
  double hardware = 0, busy = 0;
  int devices = 0;
  std::vector<StageLoad> loads;
  std::vector<double> acts;
  const ModuleAnalysis* slowest = parts.front();
  const ModuleAnalysis* last_out = parts.front();
  for (const auto* a : parts) {
    hardware += a->hardware_flops;
    busy += a->busy_seconds;
    devices += a->placement.devices;
    if (a->span > slowest->span) slowest = a;
    if (a->tail > last_out->tail) last_out = a;
    for (std::size_t s = 0; s < a->loads.size(); ++s) {
      loads.push_back(a->loads[s]);
      acts.push_back(a->loads[s].activations(a->held[s]));
    }
  }
  const double R = double(run.training.contrastive_batch);
  hardware += contrastive_groups(run.training) * contrastive_loss_flops(R, towers_embed_dim(cost, plan.modules));
  const auto& p = slowest->placement;
  const double mbs = microbatches_per_step(run.training, p);
  const auto worst = std::max_element(slowest->loads.begin(), slowest->loads.end(),
                                      [](const StageLoad& a, const StageLoad& b) { return a.time() < b.time(); });
  e.dp_comm_s = last_out->tail_dp;
  e.optimizer_s = last_out->tail_optimizer;
  record_slowest_stage(e, *worst, mbs);
  e.pipeline_bubble_s = slowest->span - mbs * slowest->longest;
  record_peak_memory(e, loads, acts, per_device);
  finish_estimate(e, cost, devices, hardware, busy);
  plan.devices = devices;
  plan.microbatches = 0;
  for (const auto& q : plan.modules) {
    plan.microbatches = std::max(plan.microbatches, microbatches_per_step(run.training, q));
  }
  return check_memory(cost, e, why);
}

}  // namespace braid::plan
