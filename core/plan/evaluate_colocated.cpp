// Colocated layout (Optimus): the llm (with projectors and generators) runs as one
// monolithic grid over all devices; every device also holds a stage of each
// encoder, whose own grid has TP dividing the llm's TP and PP dividing its PP.
//
// Coarse schedule, until the bubble scheduler lands: every device holds an equal
// share of the encoder work, and the llm's first stage has no warm-up bubble, so
// all encoder forwards run before the llm starts and all encoder backwards after
// it ends (they need the llm's input gradients), each device on its own encoder
// stage's tasks:
//   T = E_forward + llm pipeline + E_backward + DP/optimizer tails,
// E = (K + encoder pp - 1) x the slowest encoder stage's microbatch, plus K hand-overs to the llm.
// This is the program pipeline::build_program makes of the plan; the kernel-level
// scheduler (a later release) moves encoder kernels into the pipeline and TP bubbles.
#include <algorithm>

#include "core/plan/evaluate.hpp"
#include "core/plan/monolithic.hpp"

namespace braid::plan {

bool evaluate_colocated(const cost::CostModel& cost, Plan& plan, std::string* why,
                        std::vector<MemoryBreakdown>* per_device) {
  const auto& run = cost.run();
  const auto& train = run.training;
  if (run.model.topology != spec::Topology::chain)
    return reject(why, "the colocated layout needs an encoder -> llm model");
  Plan llm_grid = plan;
  std::erase_if(llm_grid.modules, [](const ModulePlacement& p) { return p.role == spec::Role::encoder; });
  MonolithicStages g;
  if (!analyze_monolithic(cost, llm_grid, g, why, "the colocated llm grid (the llm, its projectors and generators)"))
    return false;
  const int devices = g.tp * g.dp * g.stages;
  if (g.virtual_stages > 1) return reject(why, "the colocated estimate covers plain 1F1B llm pipelines");

  // The llm alone.
  const int m = g.microbatches;
  const double span = g.span();
  double tail = 0, hardware = 0, busy = 0;
  std::size_t tail_stage = 0;
  for (std::size_t s = 0; s < g.loads.size(); ++s) {
    double t = g.tail(s, train);
    if (t > tail) {
      tail = t;
      tail_stage = s;
    }
    hardware += m * g.loads[s].work.hardware_flops() * g.tp * g.dp;
    busy += g.loads[s].busy_seconds(m, g.tp * g.dp);
  }

  // Encoders, each a pipeline of its own over the same devices.
  double forward = 0, backward = 0, enc_tail = 0;
  std::vector<MemoryBreakdown> states;  // each llm stage's with the encoder stages it hosts
  for (const StageLoad& l : g.loads) states.push_back(colocated_llm_state(l.peak_state()));
  std::vector<double> enc_acts(static_cast<std::size_t>(g.stages), 0.0);
  std::vector<double> enc_recompute(static_cast<std::size_t>(g.stages), 0.0);  // one layer's, at a time
  for (const auto& p : plan.modules) {
    if (p.role != spec::Role::encoder) continue;
    if (!check_tp(cost, p, why) || !check_stages(cost, p, why)) return false;
    if (p.first_device != 0 || p.devices != devices || static_cast<long long>(p.tp) * p.pp * p.dp != devices) {
      return reject(why,
                    p.name + ": a colocated encoder spans all " + std::to_string(devices) + " devices of the llm grid");
    }
    if (g.tp % p.tp != 0 || g.stages % p.pp != 0) {
      return reject(why, p.name + ": encoder tp must divide the llm tp and encoder pp the llm pp");
    }
    if (train.global_batch % samples_per_microbatch(p) != 0) {
      return reject(why, p.name + ": global batch does not split into encoder dp x microbatch");
    }
    const double K = microbatches_per_step(train, p);
    const cost::CostModel& priced = cost.colocated_encoder_model();
    auto loads = colocated_encoder_loads(cost, p);
    const double handover = colocated_handover_seconds(cost, p, g.tp, g.stages);
    // Every pass of a microbatch recomputes a layer at once (bubble::decompose's tasks).
    const double recomputed = priced.module(p.module, p.tp, p.microbatch_size).recompute_bytes_all_passes;
    double f_max = 0, b_max = 0;
    for (std::size_t s = 0; s < loads.size(); ++s) {
      const auto& l = loads[s];
      const double f = l.work.forward_time() + l.p2p_s / 2;
      const double b = l.work.backward_time() + l.p2p_s / 2 + l.shard_comm_s;
      f_max = std::max(f_max, f);
      b_max = std::max(b_max, b);
      // Its DP collectives overlap as the llm's do: the reduction behind its own last backward.
      enc_tail = std::max(enc_tail, l.exposed_dp_sync(train) + l.optimizer_s);
      hardware += K * l.work.hardware_flops() * p.tp * p.dp;
      busy += l.busy_seconds(K, p.tp * p.dp);
      // Encoder stage s covers llm stages [s*L/p, (s+1)*L/p); the coarse schedule keeps all K forwards.
      const int span_stages = g.stages / p.pp;
      for (int k = 0; k < span_stages; ++k) {
        const auto at = static_cast<std::size_t>(static_cast<int>(s) * span_stages + k);
        host_colocated_encoder(states[at], l);
        enc_acts[at] += K * l.work.activation_bytes;
        if (l.work.recompute_bytes > 0) enc_recompute[at] = std::max(enc_recompute[at], recomputed);
      }
    }
    // The encoder's own pipeline fills before its last stage hands microbatches over.
    forward += (K + p.pp - 1) * f_max + K * handover;
    backward += (K + p.pp - 1) * b_max + K * handover;
  }

  Estimate& e = plan.estimate;
  e.iteration_time_s = forward + span + backward + tail + enc_tail;
  e.encoder_exposed_s = e.iteration_time_s - span - tail;
  e.dp_comm_s = tail - g.loads[tail_stage].optimizer_s;
  e.optimizer_s = g.loads[tail_stage].optimizer_s;
  const auto slowest = static_cast<std::size_t>(std::max_element(g.times.begin(), g.times.end()) - g.times.begin());
  record_slowest_stage(e, g.loads[slowest], m);
  // The encoder's work is on the critical path as encoder_exposed_s, not in compute_s (the
  // llm's slowest stage): the breakdown adds up to the step.
  e.pipeline_bubble_s = span - m * g.times[slowest];
  std::vector<double> acts;
  for (std::size_t s = 0; s < g.loads.size(); ++s) {
    // Each llm stage's devices also hold their encoder stages' activations (and state, above).
    // One backward runs at a time: the larger of the llm's and the encoders' recomputation.
    acts.push_back(g.loads[s].work.activation_bytes * g.held[s] + enc_acts[s] +
                   std::max(g.loads[s].work.recompute_bytes, enc_recompute[s]));
  }
  record_peak_memory(e, g.loads, acts, per_device, &states);
  finish_estimate(e, cost, devices, hardware, busy);
  plan.devices = devices;
  plan.microbatches = m;
  return check_memory(cost, e, why);
}

}  // namespace braid::plan
