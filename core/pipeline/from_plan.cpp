#include "core/pipeline/from_plan.hpp"

#include <algorithm>
#include <cmath>

#include "core/common/error.hpp"
#include "core/common/text.hpp"
#include "core/pipeline/schedules.hpp"
#include "core/plan/disaggregated.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/monolithic.hpp"

namespace braid::pipeline {
namespace {

using plan::Layout;
using plan::ModulePlacement;
using plan::StageLoad;

WorkUnit unit_of(const StageLoad& l, const std::string& label, double input_bytes, double scale = 1) {
  WorkUnit u;
  u.label = label;
  u.forward_s = l.work.forward_s * scale;
  u.forward_tp_s = l.work.comm_forward_s * scale;
  u.backward_s = (l.work.backward_s + l.work.recompute_s) * scale;
  u.backward_tp_s = l.work.comm_backward_s * scale;
  u.forward_tp_collectives = static_cast<int>(std::lround(l.work.collectives_forward * scale));
  u.backward_tp_collectives = static_cast<int>(std::lround(l.work.collectives_backward * scale));
  u.recompute_s = l.work.forward_s * scale;
  u.shard_comm_s = l.shard_comm_s * scale;
  u.activation_bytes = l.work.activation_bytes * scale;
  u.input_bytes = std::min(input_bytes, u.activation_bytes);
  u.recompute_bytes = l.work.recompute_bytes;  // one layer's, whatever share of the stage a chunk is
  u.hardware_flops = l.work.hardware_flops() * scale;
  return u;
}

// Hidden states one microbatch of `p` carries into a stage.
double input_bytes(const cost::CostModel& cost, const ModulePlacement& p) {
  const auto& m = cost.run().model.modules[static_cast<std::size_t>(p.module)];
  return p.microbatch_size * cost.tokens(p.module) * m.hidden * cost.element_bytes() / p.tp;
}

StageProgram stage_from(const cost::CostModel& cost, const StageLoad& l, const std::string& name,
                        const plan::StageDevices& devices) {
  StageProgram st;
  st.name = name;
  st.replicas = devices.replicas;
  st.devices_per_replica = devices.devices_per_replica;
  st.first_device = devices.first_device;
  st.device_stride = devices.stride;
  // Exposed DP reduction, as the evaluators charge it.
  st.reduce_grads_s = l.exposed_dp_sync(cost.run().training);
  st.early_reduce_s = l.exposed_dp_reduce(cost.run().training);
  st.optimizer_s = l.optimizer_s;
  st.memory = l.peak_state();
  st.send_activation_s = st.send_grad_s = l.p2p_s / 2;
  return st;
}

void link(Program& p, int from, int to) {
  p.stages[static_cast<std::size_t>(from)].next.push_back(to);
  p.stages[static_cast<std::size_t>(to)].prev.push_back(from);
}

// A gradient crosses the boundary its activation crossed: price a stage's gradient
// sends as its predecessors' activation sends (none for a first stage).
void gradients_mirror_activations(Program& p) {
  for (auto& st : p.stages) {
    st.send_grad_s = 0;
    for (int from : st.prev)
      st.send_grad_s = std::max(st.send_grad_s, p.stages[static_cast<std::size_t>(from)].send_activation_s);
  }
}

// Appends the stages of one module grid (its pipeline, linked in order) and
// returns the index of its first stage.
int add_grid(Program& p, const cost::CostModel& cost, const ModulePlacement& m, const plan::ModuleAnalysis& a,
             int depth_offset) {
  const int first = static_cast<int>(p.stages.size());
  for (int s = 0; s < m.pp; ++s) {
    const auto& l = a.loads[static_cast<std::size_t>(s)];
    StageProgram st = stage_from(cost, l, m.name + " stage " + std::to_string(s), plan::module_stage_devices(m, s));
    st.module = m.module;
    st.parts.push_back(stage_part(m, s));
    st.depth = depth_offset + s;
    st.units.push_back(unit_of(l, st.name, input_bytes(cost, m)));
    p.stages.push_back(std::move(st));
    if (s > 0) link(p, first + s - 1, first + s);
  }
  return first;
}

[[noreturn]] void cannot_run(const std::string& why) { throw Error(Status::bad_config, "the plan cannot run: " + why); }

bool contrastive(const cost::CostModel& cost) { return cost.run().model.topology == spec::Topology::contrastive; }

void finish(const cost::CostModel& cost, Program& p) {
  finish_step(p);
  p.model_flops = double(cost.run().training.global_batch) * cost.model_flops_per_sample();
  p.peak_flops = cost.device().peak_flops();
  p.devices = 0;
  for (const auto& s : p.stages) p.devices += s.replicas * s.devices_per_replica;
  const spec::ClusterSpec& cluster = cost.run().cluster;
  p.devices_per_node = cluster.devices_per_node;
  p.cores_per_node = cluster.cores_per_node;
  p.threads_per_device = cluster.threads_per_device;
  p.shared_core_efficiency = cluster.shared_core_efficiency;
  p.dp_link = cluster.nodes > 1 ? cluster.inter_node : cluster.intra_node;
}

Program monolithic(const cost::CostModel& cost, const plan::Plan& plan, spec::Schedule schedule) {
  plan::MonolithicStages g;
  std::string why;
  if (!plan::analyze_monolithic(cost, plan, g, &why)) cannot_run(why);
  const int v = schedule == spec::Schedule::interleaved ? g.virtual_stages : 1;
  Program p;
  p.stages.reserve(static_cast<std::size_t>(g.stages));
  for (int s = 0; s < g.stages; ++s) {
    const auto& l = g.loads[static_cast<std::size_t>(s)];
    std::string names;
    double input = 0;
    int module = -1, count = 0;
    std::vector<StagePart> parts;
    for (const auto& m : plan.modules) {
      if (m.first_stage <= s && s < m.first_stage + m.pp) {
        names += (names.empty() ? "" : ", ") + m.name;
        input = std::max(input, input_bytes(cost, m));
        module = m.module;
        parts.push_back(stage_part(m, s - m.first_stage));
        ++count;
      }
    }
    StageProgram st =
        stage_from(cost, l, "stage " + std::to_string(s) + " (" + names + ")", plan::grid_stage_devices(g.tp, g.dp, s));
    st.module = count == 1 ? module : -1;
    st.parts = std::move(parts);
    st.depth = s;
    st.send_activation_s = s + 1 < g.stages ? g.send_s[static_cast<std::size_t>(s)] : g.wrap_send_s;
    st.send_grad_s = s > 0 ? g.send_s[static_cast<std::size_t>(s - 1)] : g.wrap_send_s;
    st.reduce_grads_s = g.tail(static_cast<std::size_t>(s), cost.run().training) - l.optimizer_s;
    for (int c = 0; c < v; ++c) st.units.push_back(unit_of(l, st.name, input / v, 1.0 / v));
    p.stages.push_back(std::move(st));
  }
  for (int s = 0; s + 1 < g.stages; ++s) link(p, s, s + 1);
  if (g.contrastive) {
    const plan::BatchSyncCost sync = plan::grid_batch_sync_cost(cost, plan.modules, g.tp, g.dp, g.stages);
    p.batch_sync_s = sync.seconds();
    p.batch_sync_comm_s = sync.comm_s;
    batch_sync(p, g.groups, g.group_microbatches, schedule);
  } else if (schedule == spec::Schedule::gpipe) {
    gpipe(p, g.microbatches);
  } else if (schedule == spec::Schedule::interleaved) {
    interleaved(p, g.microbatches, v);
  } else {
    one_f_one_b(p, g.microbatches);
  }
  return p;
}

Program branches(const cost::CostModel& cost, const plan::Plan& plan, spec::Schedule schedule) {
  const auto& run = cost.run();
  std::string why;
  if (!plan::check_disjoint(cost, plan, &why)) cannot_run(why);
  Program p;
  int groups = 1, first_k = 0;
  for (const auto& m : plan.modules) {
    plan::ModuleAnalysis a;
    if (!plan::analyze_branch(cost, m, a, &why)) cannot_run(why);
    const int K = plan::microbatches_per_group(run.training, m);
    groups = plan::contrastive_groups(run.training);
    if (first_k == 0) first_k = K;
    const int first = add_grid(p, cost, m, a, 0);
    for (int st = first; st < first + m.pp; ++st) p.stages[static_cast<std::size_t>(st)].group_microbatches = K;
  }
  gradients_mirror_activations(p);
  const plan::BatchSyncCost sync = plan::branches_batch_sync_cost(cost, plan.modules);
  p.batch_sync_s = sync.seconds();
  p.batch_sync_comm_s = sync.comm_s;
  batch_sync(p, groups, first_k, schedule);
  return p;
}

Program chain(const cost::CostModel& cost, const plan::Plan& plan, spec::Schedule schedule) {
  const auto& run = cost.run();
  const auto& model = run.model;
  std::string why;
  // The evaluator checks what only the whole plan can: slots, riders, devices.
  plan::Plan copy = plan;
  if (!plan::evaluate(cost, copy, &why)) {
    if (copy.estimate.iteration_time_s <= 0) cannot_run(why);  // over memory still runs in simulation
  }
  const ModulePlacement* llm = nullptr;
  int enc_depth = 0, gen_depth = 0;
  for (const auto& m : plan.modules) {
    if (m.role == spec::Role::llm) llm = &m;
    if (m.role == spec::Role::encoder) enc_depth = std::max(enc_depth, m.pp);
    if (m.role == spec::Role::generator) gen_depth = std::max(gen_depth, m.pp);
  }
  const int m_slots = plan::microbatches_per_step(run.training, *llm);
  Program p;
  std::vector<int> enc_last, gen_first;
  int llm_first = -1, llm_last = -1;
  for (const auto& m : plan.modules) {
    if (m.role == spec::Role::projector) continue;
    std::vector<const ModulePlacement*> riders;
    for (const auto& q : plan.modules) {
      if (q.role == spec::Role::projector &&
          model.modules[static_cast<std::size_t>(q.module)].inputs.front() == m.name) {
        riders.push_back(&q);
      }
    }
    const int after = m.role == spec::Role::encoder ? llm->pp + gen_depth : m.role == spec::Role::llm ? gen_depth : 0;
    const int consumers = plan::chain_consumers(model, model.modules[static_cast<std::size_t>(m.module)]);
    plan::ModuleAnalysis a;
    if (!plan::analyze_chain_module(cost, m, riders, m_slots, after, consumers, schedule, a, &why)) cannot_run(why);
    const int offset = m.role == spec::Role::encoder ? enc_depth - m.pp
                       : m.role == spec::Role::llm   ? enc_depth
                                                     : enc_depth + llm->pp + gen_depth - m.pp;
    const int first = add_grid(p, cost, m, a, offset);
    for (const auto* q : riders)
      p.stages[static_cast<std::size_t>(first + m.pp - 1)].parts.push_back(stage_part(*q, 0));
    if (consumers > 0)
      p.stages[static_cast<std::size_t>(first + m.pp - 1)].send_activation_s = a.handover_s;  // per consumer
    if (m.role == spec::Role::encoder) enc_last.push_back(first + m.pp - 1);
    if (m.role == spec::Role::generator) gen_first.push_back(first);
    if (m.role == spec::Role::llm) {
      llm_first = first;
      llm_last = first + m.pp - 1;
    }
  }
  for (int e : enc_last) link(p, e, llm_first);
  for (int g : gen_first) link(p, llm_last, g);
  gradients_mirror_activations(p);
  if (schedule == spec::Schedule::gpipe) {
    gpipe(p, m_slots);
  } else {
    one_f_one_b(p, m_slots);
  }
  return p;
}

}  // namespace

StagePart stage_part(const plan::ModulePlacement& m, int module_stage) {
  StagePart part;
  part.module = m.module;
  part.module_stage = module_stage;
  const auto& layers = m.layers_per_stage;
  const auto k = static_cast<std::size_t>(module_stage);
  for (std::size_t i = 0; i < k && i < layers.size(); ++i) part.first_layer += layers[i];
  part.layer_count = k < layers.size() ? layers[k] : 0;
  return part;
}

std::vector<spec::Schedule> schedules_for(const cost::CostModel& cost, const plan::Plan& plan) {
  using spec::Schedule;
  switch (plan.layout) {
    case Layout::monolithic:
      if (contrastive(cost)) return {Schedule::batch_sync, Schedule::distmm_pipe, Schedule::two_phase};
      if (plan.virtual_stages > 1) return {Schedule::interleaved, Schedule::one_f_one_b, Schedule::gpipe};
      if (plan.schedule == Schedule::gpipe) return {Schedule::gpipe, Schedule::one_f_one_b};
      return {Schedule::one_f_one_b, Schedule::gpipe};
    case Layout::branches:
      return {Schedule::distmm_pipe, Schedule::batch_sync, Schedule::two_phase};
    case Layout::chain:
      return {Schedule::one_f_one_b, Schedule::gpipe};
    case Layout::colocated:
      break;
  }
  throw Error(Status::internal,
              "the programs of a colocated plan come from the bubble scheduler (orchestrate::build_program)");
}

std::string schedule_refusal(const plan::Plan& plan, const std::vector<spec::Schedule>& allowed,
                             std::string_view name) {
  return "a " + std::string(plan::layout_name(plan.layout)) + " plan of this model runs " +
         join_choices(spec::schedule_names(allowed)) + ", not '" + std::string(name) + "'";
}

Program build_program(const cost::CostModel& cost, const plan::Plan& plan, std::optional<spec::Schedule> requested) {
  const auto allowed = schedules_for(cost, plan);
  const spec::Schedule schedule = requested.value_or(allowed.front());
  if (std::find(allowed.begin(), allowed.end(), schedule) == allowed.end())
    throw Error(Status::unsupported, schedule_refusal(plan, allowed, spec::schedule_name(schedule)));
  Program p;
  switch (plan.layout) {
    case Layout::monolithic:
      p = monolithic(cost, plan, schedule);
      break;
    case Layout::branches:
      p = branches(cost, plan, schedule);
      break;
    case Layout::chain:
      p = chain(cost, plan, schedule);
      break;
    case Layout::colocated:
      break;  // refused by schedules_for
  }
  finish(cost, p);
  return p;
}

}  // namespace braid::pipeline
