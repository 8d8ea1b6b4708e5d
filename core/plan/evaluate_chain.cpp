// Chain layout (DistTrain): encoders, the llm and generators on disjoint device
// sets, each with its own (TP, PP, DP), forming one 1F1B pipeline. Each slot of
// the pipeline carries dp_llm x microbatch samples; a module with another DP
// width takes that slot as dp_llm x mb / dp_module samples per replica (fan-in/out).
#include <algorithm>

#include "core/plan/disaggregated.hpp"
#include "core/plan/evaluate.hpp"

namespace braid::plan {

bool analyze_chain_module(const cost::CostModel& cost, const ModulePlacement& p,
                          const std::vector<const ModulePlacement*>& riders, int m, int stages_after, int consumers,
                          spec::Schedule schedule, ModuleAnalysis& out, std::string* why) {
  const auto& model = cost.run().model;
  if (!check_tp(cost, p, why) || !check_stages(cost, p, why)) return false;
  out.placement = p;
  out.loads = grid_loads(cost, p, p.microbatch_size);
  double out_bytes = cost.module(p.module, p.tp, p.microbatch_size).output_bytes;
  for (const auto* q : riders) {
    if (q->first_device != module_stage_devices(p, p.pp - 1).first_device || q->tp != p.tp || q->dp != p.dp ||
        q->microbatch_size != p.microbatch_size) {
      return reject(
          why, q->name + ": a projector runs on the devices of its encoder's last stage (same tp, dp, microbatch)");
    }
    out.loads.back().add(cost, q->module, model.modules[static_cast<std::size_t>(q->module)].layers, true, true, p.tp,
                         p.microbatch_size, dp_group_of(cost, module_stage_devices(p, p.pp - 1)),
                         StageLoad::Instructions::shared);
    out_bytes = cost.module(q->module, p.tp, p.microbatch_size).output_bytes;
  }
  // Modules sit on disjoint devices, so hand-overs leave the node; TP ranks split them.
  out.handover_s = consumers > 0 ? cost.comm().p2p(out_bytes / p.tp, true) : 0;
  out.loads.back().p2p_s += 2 * consumers * out.handover_s;
  out.held.clear();
  const bool gpipe = schedule == spec::Schedule::gpipe;
  for (int s = 0; s < p.pp; ++s) out.held.push_back(gpipe ? m : std::min(p.pp - s + stages_after, m));
  summarize_module(cost, out, m);
  return true;
}

int chain_consumers(const spec::ModelSpec& model, const spec::ModuleSpec& m) {
  if (m.role == spec::Role::encoder) return 1;  // its projector rides along; the llm takes the output
  if (m.role != spec::Role::llm) return 0;
  int n = 0;
  for (const auto& g : model.modules) n += g.role == spec::Role::generator;
  return n;
}

double combine_chain(const std::vector<const ModuleAnalysis*>& encoders, const ModuleAnalysis& llm,
                     const std::vector<const ModuleAnalysis*>& generators, int m) {
  double enc = 0, gen = 0, longest = llm.longest, tail = llm.tail;
  for (const auto* a : encoders) {
    enc = std::max(enc, a->sum);
    longest = std::max(longest, a->longest);
    tail = std::max(tail, a->tail);
  }
  for (const auto* a : generators) {
    gen = std::max(gen, a->sum);
    longest = std::max(longest, a->longest);
    tail = std::max(tail, a->tail);
  }
  return enc + llm.sum + gen + (m - 1) * longest + tail;
}

bool evaluate_chain(const cost::CostModel& cost, Plan& plan, std::string* why,
                    std::vector<MemoryBreakdown>* per_device) {
  const auto& run = cost.run();
  const auto& train = run.training;
  const auto& model = run.model;
  if (model.topology != spec::Topology::chain) return reject(why, "the chain layout needs an encoder -> llm model");
  if (!check_disjoint(cost, plan, why)) return false;
  const ModulePlacement* llm = nullptr;
  int gen_depth = 0;
  for (const auto& p : plan.modules) {
    if (p.role == spec::Role::llm) llm = &p;
    if (p.role == spec::Role::generator) gen_depth = std::max(gen_depth, p.pp);
  }
  if (!llm) return reject(why, "the plan does not place the llm");
  const long long slot = samples_per_microbatch(*llm);  // samples per pipeline slot
  if (train.global_batch % slot != 0) {
    return why ? reject(why, "global batch " + std::to_string(train.global_batch) + " does not split into llm dp " +
                                 std::to_string(llm->dp) + " x microbatch " + std::to_string(llm->microbatch_size))
               : false;
  }
  const int m = microbatches_per_step(train, *llm);
  std::vector<ModuleAnalysis> analyses;
  analyses.reserve(plan.modules.size());
  std::vector<const ModuleAnalysis*> encoders, generators;
  const ModuleAnalysis* backbone = nullptr;
  for (const auto& p : plan.modules) {
    if (p.role == spec::Role::projector) continue;
    if ((p.dp % llm->dp != 0 && llm->dp % p.dp != 0)) {
      return why ? reject(why, p.name + ": dp " + std::to_string(p.dp) + " and the llm's dp " +
                                   std::to_string(llm->dp) +
                                   " must divide one another, so activations fan in or out evenly")
                 : false;
    }
    if (slot % p.dp != 0 || p.microbatch_size != slot / p.dp) {
      return why ? reject(why, p.name + ": dp " + std::to_string(p.dp) + " with microbatch " +
                                   std::to_string(p.microbatch_size) + " does not take a slot of " +
                                   std::to_string(slot) +
                                   " samples (llm dp x microbatch); its microbatch must be slot / dp")
                 : false;
    }
    std::vector<const ModulePlacement*> riders;
    for (const auto& q : plan.modules) {
      if (q.role == spec::Role::projector &&
          model.modules[static_cast<std::size_t>(q.module)].inputs.front() == p.name) {
        riders.push_back(&q);
      }
    }
    int after = p.role == spec::Role::encoder ? llm->pp + gen_depth : p.role == spec::Role::llm ? gen_depth : 0;
    const int sends = chain_consumers(model, model.modules[static_cast<std::size_t>(p.module)]);
    analyses.emplace_back();
    if (!analyze_chain_module(cost, p, riders, m, after, sends, plan.schedule, analyses.back(), why)) return false;
    const ModuleAnalysis* a = &analyses.back();
    if (p.role == spec::Role::encoder) encoders.push_back(a);
    if (p.role == spec::Role::llm) backbone = a;
    if (p.role == spec::Role::generator) generators.push_back(a);
  }
  for (const auto& p : plan.modules) {
    if (p.role == spec::Role::projector && std::none_of(encoders.begin(), encoders.end(), [&](const ModuleAnalysis* a) {
          return a->placement.name == model.modules[static_cast<std::size_t>(p.module)].inputs.front();
        })) {
      return reject(why, p.name + ": its encoder is not placed");
    }
  }
  Estimate& e = plan.estimate;
  e.iteration_time_s = combine_chain(encoders, *backbone, generators, m);
  double hardware = 0, busy = 0;
  int devices = 0;
  std::vector<StageLoad> loads;
  std::vector<double> acts;
  const ModuleAnalysis* slowest = backbone;
  const ModuleAnalysis* last_out = backbone;
  for (const auto& a : analyses) {
    hardware += a.hardware_flops;
    busy += a.busy_seconds;
    devices += a.placement.devices;
    if (a.longest > slowest->longest) slowest = &a;
    if (a.tail > last_out->tail) last_out = &a;
    for (std::size_t s = 0; s < a.loads.size(); ++s) {
      loads.push_back(a.loads[s]);
      acts.push_back(a.loads[s].activations(a.held[s]));
    }
  }
  const auto worst = std::max_element(slowest->loads.begin(), slowest->loads.end(),
                                      [](const StageLoad& a, const StageLoad& b) { return a.time() < b.time(); });
  e.dp_comm_s = last_out->tail_dp;
  e.optimizer_s = last_out->tail_optimizer;
  record_slowest_stage(e, *worst, m);
  e.pipeline_bubble_s = e.iteration_time_s - last_out->tail - m * slowest->longest;
  record_peak_memory(e, loads, acts, per_device);
  finish_estimate(e, cost, devices, hardware, busy);
  plan.devices = devices;
  plan.microbatches = m;
  plan.virtual_stages = 1;
  return check_memory(cost, e, why);
}

}  // namespace braid::plan
