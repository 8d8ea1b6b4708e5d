// Monolithic layout (Megatron-LM): one TP x PP x DP grid over all devices, ranks
// ordered tp-dp-pp; each module occupies a run of the global pipeline stages.
#include <algorithm>
#include <numeric>

#include "core/plan/evaluate.hpp"
#include "core/plan/monolithic.hpp"

namespace braid::plan {

double MonolithicStages::span() const {
  const double longest = *std::max_element(times.begin(), times.end());
  const double sum = std::accumulate(times.begin(), times.end(), 0.0);
  // A contrastive loss needs a whole group's embeddings: each group flushes the
  // pipeline (forwards, batch-sync, backwards), as a GPipe step per group.
  if (contrastive) return groups * ((group_microbatches - 1) * longest + sum);
  return pipeline_span(times, microbatches, virtual_stages);
}

double MonolithicStages::tail(std::size_t s, const spec::TrainingSpec& training) const {
  const auto& l = loads[s];
  return l.exposed_dp_sync(training) + l.optimizer_s;
}

bool analyze_monolithic(const cost::CostModel& cost, const Plan& plan, MonolithicStages& out, std::string* why,
                        std::string_view grid) {
  const auto& run = cost.run();
  const auto& train = run.training;
  const int tp = plan.modules.front().tp, dp = plan.modules.front().dp;
  int stages = 0;
  for (const auto& p : plan.modules) {
    if (p.tp != tp || p.dp != dp || p.microbatch_size != plan.modules.front().microbatch_size) {
      return reject(
          why, std::string(grid) + " uses one tp, dp and microbatch size for every module ('" + p.name + "' differs)");
    }
    if (!check_tp(cost, p, why) || !check_stages(cost, p, why)) return false;
    stages = std::max(stages, p.first_stage + p.pp);  // both below the device count: no overflow
  }
  const long long devices = static_cast<long long>(tp) * dp * stages;
  if (devices > run.devices()) {
    return why ? reject(why, "tp " + std::to_string(tp) + " x pp " + std::to_string(stages) + " x dp " +
                                 std::to_string(dp) + " needs " + std::to_string(devices) +
                                 " devices, the cluster has " + std::to_string(run.devices()))
               : false;
  }
  const ModulePlacement& head = plan.modules.front();  // every module has its tp, dp and microbatch size
  const int mb = head.microbatch_size;
  const long long per_step = samples_per_microbatch(head);
  if (train.global_batch % per_step != 0) {
    return why ? reject(why, "global batch " + std::to_string(train.global_batch) + " does not split into dp " +
                                 std::to_string(dp) + " x microbatch " + std::to_string(mb))
               : false;
  }
  out = MonolithicStages{};
  out.tp = tp;
  out.dp = dp;
  out.stages = stages;
  out.microbatches = microbatches_per_step(train, head);
  out.virtual_stages = plan.virtual_stages;
  out.contrastive = run.model.topology == spec::Topology::contrastive;
  out.group_microbatches = out.microbatches;
  if (out.contrastive) {
    if (train.contrastive_batch % per_step != 0)
      return reject(why, "contrastive batch does not split into dp x microbatch");
    out.group_microbatches = microbatches_per_group(train, head);
    out.groups = contrastive_groups(train);
  }
  const int v = plan.virtual_stages;
  if (v > 1) {
    if (out.contrastive) return reject(why, "the interleaved schedule does not apply to a contrastive loss");
    if (stages < 2) return reject(why, "the interleaved schedule needs at least two pipeline stages");
    if (out.microbatches % stages != 0)
      return reject(why, "the interleaved schedule needs microbatches divisible by pp");
    for (const auto& p : plan.modules) {
      for (int n : p.layers_per_stage) {
        if (n % v != 0) return reject(why, p.name + ": stage layers must divide into the virtual stages");
      }
    }
  }
  std::vector<int> occupied(static_cast<std::size_t>(stages), 0);
  for (const auto& p : plan.modules) {
    for (int k = 0; k < p.pp; ++k) ++occupied[static_cast<std::size_t>(p.first_stage + k)];
  }
  for (int s = 0; s < stages; ++s) {
    if (occupied[static_cast<std::size_t>(s)] == 0)
      return reject(why, "pipeline stage " + std::to_string(s) + " holds no module");
  }

  auto& loads = out.loads;
  loads.resize(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    loads[static_cast<std::size_t>(s)].stage = s;
    loads[static_cast<std::size_t>(s)].devices = grid_stage_devices(tp, dp, s);
    loads[static_cast<std::size_t>(s)].memory.reserved = run.cluster.reserved_memory_bytes;
  }
  for (const auto& p : plan.modules) {
    for (int k = 0; k < p.pp; ++k) {
      const int s = p.first_stage + k;
      loads[static_cast<std::size_t>(s)].add(cost, p.module, p.layers_per_stage[static_cast<std::size_t>(k)], k == 0,
                                             k == p.pp - 1, tp, mb, dp_group_of(cost, grid_stage_devices(tp, dp, s)));
    }
  }
  // Pipeline sends: hidden states of every module whose stages (or whose consumer)
  // continue past the boundary; scatter/gather splits each send over the TP ranks.
  const auto& modules = run.model.modules;
  for (int s = 0; s + 1 < stages; ++s) {
    double bytes = 0;
    for (const auto& p : plan.modules) {
      const int last = p.first_stage + p.pp - 1;
      const auto& spec = modules[static_cast<std::size_t>(p.module)];
      if (p.first_stage <= s && s < last) bytes += mb * cost.tokens(p.module) * spec.hidden * cost.element_bytes();
      for (const auto& c : plan.modules) {
        const auto& consumer = modules[static_cast<std::size_t>(c.module)];
        bool feeds = std::find(consumer.inputs.begin(), consumer.inputs.end(), p.name) != consumer.inputs.end();
        if (feeds && last <= s && s < c.first_stage) bytes += cost.module(p.module, tp, mb).output_bytes;
      }
    }
    double t = cost.comm().p2p(bytes / tp, stage_boundary_crosses_nodes(cost, 0, tp, dp, s));
    out.send_s.push_back(t);
    loads[static_cast<std::size_t>(s)].p2p_s += 2 * t * v;  // activation forward, gradient backward, per chunk
    // Interleaving: each chunk but the last also wraps from the last stage back to the first.
    if (v > 1 && s + 2 == stages) {
      out.wrap_send_s = cost.comm().p2p(bytes / tp, stages * tp * dp > run.cluster.devices_per_node);
      loads[static_cast<std::size_t>(s + 1)].p2p_s += 2 * out.wrap_send_s * (v - 1);
    }
  }
  for (int s = 0; s < stages; ++s) {
    out.times.push_back(loads[static_cast<std::size_t>(s)].time());
    out.held.push_back(out.contrastive ? out.group_microbatches
                                       : in_flight(s, stages, out.microbatches, v, plan.schedule));
  }
  return true;
}

bool evaluate_monolithic(const cost::CostModel& cost, Plan& plan, std::string* why,
                         std::vector<MemoryBreakdown>* per_device) {
  MonolithicStages g;
  if (!analyze_monolithic(cost, plan, g, why)) return false;
  const auto& train = cost.run().training;
  const int m = g.microbatches;
  const double span = g.span();
  Estimate& e = plan.estimate;
  double tail = 0, hardware = 0, busy = 0;
  std::vector<double> acts;
  for (std::size_t s = 0; s < g.loads.size(); ++s) {
    const auto& l = g.loads[s];
    double t = g.tail(s, train);
    if (t > tail) {
      tail = t;
      e.dp_comm_s = t - l.optimizer_s;
      e.optimizer_s = l.optimizer_s;
    }
    hardware += m * l.work.hardware_flops() * g.tp * g.dp;
    busy += l.busy_seconds(m, g.tp * g.dp);
    acts.push_back(l.activations(g.held[s]));
  }
  if (g.contrastive) {
    // Each DP replica computes the loss on its rows against the gathered embeddings.
    e.sync_s = g.groups * grid_batch_sync_cost(cost, plan.modules, g.tp, g.dp, g.stages).seconds();
    hardware +=
        g.groups * contrastive_loss_flops(double(train.contrastive_batch), towers_embed_dim(cost, plan.modules));
  }
  const auto slowest = static_cast<std::size_t>(std::max_element(g.times.begin(), g.times.end()) - g.times.begin());
  const auto& worst = g.loads[slowest];
  e.iteration_time_s = span + e.sync_s + tail;
  record_slowest_stage(e, worst, m);
  e.pipeline_bubble_s = span - m * g.times[slowest];
  record_peak_memory(e, g.loads, acts, per_device);
  const int devices = g.tp * g.dp * g.stages;
  finish_estimate(e, cost, devices, hardware, busy);
  plan.devices = devices;
  plan.microbatches = m;
  return check_memory(cost, e, why);
}

}  // namespace braid::plan
