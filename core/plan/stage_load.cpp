#include "core/plan/stage_load.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace braid::plan {

void StageLoad::add(const cost::CostModel& cost, int m, int layers, bool first, bool last, int tp, int samples,
                    const cost::GroupShape& dp_group, Instructions instructions) {
  const cost::ModuleCost& mc = cost.module(m, tp, samples);
  cost::BlockCost block = mc.stage(layers, first, last);
  work += block;
  const double params = block.parameters;
  cost::StateBytes per = cost.state_bytes(m, dp_group.size);
  memory.weights += params * per.weights;
  memory.gradients += params * per.gradients;
  memory.optimizer += params * per.optimizer;
  dp_sync_s += cost.gradient_sync_seconds(m, params, dp_group);
  dp_gather_s += cost.param_gather_seconds(m, params, dp_group);
  shard_comm_s += cost.sharded_traffic_seconds(m, params, dp_group);
  optimizer_s += cost.optimizer_seconds(m, params, dp_group.size);
  const double layer = mc.layer.parameters, rest = params - layers * layer;
  const cost::StateBytes held = cost.in_instruction_bytes(m, samples, layers, layer, rest, dp_group.size);
  const cost::CostModel::HeldBeside beside =
      instructions == Instructions::shared ? cost.held_beside(m, samples) : cost::CostModel::HeldBeside{};
  auto hold = [](double& kind, double bytes, bool with) { kind = with ? kind + bytes : std::max(kind, bytes); };
  hold(in_instruction.weights, held.weights, beside.weights);
  hold(in_instruction.gradients, held.gradients, beside.gradients);
  // A ZeRO collective copies through one unit at a time, whichever module holds it.
  const cost::CostModel::CollectiveBuffers buffers =
      cost.collective_buffer_bytes(m, layers, layer, rest, dp_group.size);
  in_instruction.buffers = std::max(in_instruction.buffers, buffers.inside);
  step_end_buffers = std::max(step_end_buffers, buffers.step_end);
}

MemoryBreakdown StageLoad::peak_state() const {
  MemoryBreakdown m = memory;
  m.weights += in_instruction.weights;
  m.gradients += in_instruction.gradients;
  m.buffers = in_instruction.buffers;
  m.step_end_buffers = step_end_buffers;
  return m;
}

double StageLoad::exposed_dp_reduce(const spec::TrainingSpec& training) const {
  const double reduce = dp_sync_s - dp_gather_s;
  return training.overlap_grad_reduce ? std::max(0.0, reduce - work.backward_time()) : reduce;
}

double StageLoad::exposed_dp_sync(const spec::TrainingSpec& training) const {
  const double exposed_gather =
      training.overlap_param_gather ? std::max(0.0, dp_gather_s - work.forward_time()) : dp_gather_s;
  return exposed_dp_reduce(training) + exposed_gather;
}

std::string StageLoad::label() const {
  return (module ? *module + " " : std::string()) + "stage " + std::to_string(stage);
}

double in_flight(int stage, int stages, int microbatches, int virtual_stages, spec::Schedule schedule) {
  if (schedule == spec::Schedule::gpipe) return microbatches;
  if (virtual_stages <= 1) return std::min(stages - stage, microbatches);
  // Megatron's interleaved warm-up: (p - rank - 1) * 2 + (v - 1) * p chunks, plus the one in flight.
  double chunks = (stages - stage - 1) * 2.0 + (virtual_stages - 1.0) * stages + 1.0;
  chunks = std::min(chunks, double(microbatches) * virtual_stages);
  return chunks / virtual_stages;
}

double pipeline_span(const std::vector<double>& t, int microbatches, int virtual_stages) {
  if (t.empty()) return 0;
  double longest = *std::max_element(t.begin(), t.end());
  double sum = std::accumulate(t.begin(), t.end(), 0.0);
  return microbatches * longest + (sum - longest) / virtual_stages;
}

void finish_estimate(Estimate& e, const cost::CostModel& cost, int devices, double hardware_flops,
                     double busy_device_seconds) {
  const auto& run = cost.run();
  const double T = e.iteration_time_s;
  const double B = double(run.training.global_batch);
  e.samples_per_s = B / T;
  e.tflops_per_device = hardware_flops / (T * devices) / 1e12;
  e.mfu = B * cost.model_flops_per_sample() / (T * devices * cost.device().peak_flops());
  e.bubble_fraction = std::clamp(1.0 - busy_device_seconds / (T * devices), 0.0, 1.0);
}

BatchSyncCost batch_sync_cost(const cost::CostModel& cost, double dim, const cost::GroupShape& group,
                              int fewest_replicas, int loss_replicas) {
  const double rows = double(cost.run().training.contrastive_batch);
  constexpr double kIdBytes = 8;  // a sample id travels with each row
  const double record = 2 * std::ceil(rows / fewest_replicas) * (dim * cost.element_bytes() + kIdBytes);
  const double gradients = 2 * rows * dim * cost.element_bytes();
  const cost::BlockCost op =
      cost::contrastive_loss_op(std::max(1.0, rows / loss_replicas), rows, dim, cost.kernel_context());
  return {cost.comm().all_gather(group.size * record, group) + cost.comm().all_reduce(gradients, group),
          op.forward_s + op.backward_s};
}

double towers_embed_dim(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers) {
  return towers.empty() ? 0 : cost.run().model.modules[static_cast<std::size_t>(towers.back().module)].embed_dim;
}

BatchSyncCost grid_batch_sync_cost(const cost::CostModel& cost, const std::vector<ModulePlacement>& towers, int tp,
                                   int dp, int stages) {
  return batch_sync_cost(cost, towers_embed_dim(cost, towers),
                         dp_group_of(cost, grid_stage_devices(tp, dp, stages - 1)), dp, dp);
}

void record_slowest_stage(Estimate& e, const StageLoad& worst, double microbatches) {
  e.compute_s = microbatches * worst.compute();
  e.tp_comm_s = microbatches * (worst.work.comm_forward_s + worst.work.comm_backward_s);
  e.p2p_s = microbatches * worst.p2p_s;
  e.dp_comm_s += microbatches * worst.shard_comm_s;
}

void record_peak_memory(Estimate& e, const std::vector<StageLoad>& loads, const std::vector<double>& acts,
                        std::vector<MemoryBreakdown>* per_device, const std::vector<MemoryBreakdown>* states) {
  double peak = -1;
  for (std::size_t i = 0; i < loads.size(); ++i) {
    MemoryBreakdown m = states ? (*states)[i] : loads[i].peak_state();
    m.activations = acts[i];
    if (m.total() > peak) {
      peak = m.total();
      e.memory = m;
      e.peak_memory_at = loads[i].label();
    }
    if (!per_device) continue;
    const StageDevices& d = loads[i].devices;
    for (int r = 0; r < d.replicas; ++r) {
      for (int k = 0; k < d.devices_per_replica; ++k) {
        const auto device = static_cast<std::size_t>(d.first_device + r * d.stride + k);
        if (device < per_device->size()) (*per_device)[device] = m;
      }
    }
  }
  e.peak_memory_gib = peak / kGiB;
}

MemoryBreakdown colocated_llm_state(MemoryBreakdown llm) {
  llm.buffers = std::max(llm.buffers, llm.step_end_buffers);
  return llm;
}

void host_colocated_encoder(MemoryBreakdown& on, const StageLoad& encoder) {
  on.weights += encoder.memory.weights;
  on.gradients += encoder.memory.gradients;
  on.optimizer += encoder.memory.optimizer;
  on.buffers = std::max(on.buffers, encoder.in_instruction.buffers);
  on.step_end_buffers = std::max(on.step_end_buffers, encoder.step_end_buffers);
}

cost::GroupShape dp_group_of(const cost::CostModel& cost, const StageDevices& stage) {
  return cost::group_shape(stage.first_device, stage.devices_per_replica, stage.replicas,
                           cost.run().cluster.devices_per_node);
}

bool stage_boundary_crosses_nodes(const cost::CostModel& cost, int first, int tp, int dp, int stage) {
  // Device d of this stage sends to d + tp*dp; if any pair is on two nodes, the
  // slowest send (which sets the pace) crosses. The pairs span [here, here + 2 tp dp).
  const int per_node = cost.run().cluster.devices_per_node;
  const long long here = first + static_cast<long long>(stage) * tp * dp;
  return here / per_node != (here + 2LL * tp * dp - 1) / per_node;
}

std::vector<StageLoad> grid_loads(const cost::CostModel& cost, const ModulePlacement& p, int samples) {
  const auto& run = cost.run();
  const auto& m = run.model.modules[static_cast<std::size_t>(p.module)];
  std::vector<StageLoad> loads(static_cast<std::size_t>(p.pp));
  for (int s = 0; s < p.pp; ++s) {
    auto& l = loads[static_cast<std::size_t>(s)];
    const bool first = s == 0, last = s == p.pp - 1;
    const int layers = p.layers_per_stage[static_cast<std::size_t>(s)];
    const cost::GroupShape dp_group = dp_group_of(cost, module_stage_devices(p, s));
    // Middle stages of an even split are usually identical: reuse the previous one.
    const StageLoad* prev = s > 0 ? &loads[static_cast<std::size_t>(s - 1)] : nullptr;
    if (prev && !first && !last && s - 1 > 0 && layers == p.layers_per_stage[static_cast<std::size_t>(s - 1)] &&
        dp_group_of(cost, module_stage_devices(p, s - 1)) == dp_group) {
      l = *prev;
      l.p2p_s = 0;
    } else {
      l.module = &m.name;
      l.memory.reserved = run.cluster.reserved_memory_bytes;
      l.add(cost, p.module, layers, first, last, p.tp, samples, dp_group);
    }
    l.stage = s;
    l.devices = module_stage_devices(p, s);
    if (!last) {
      double bytes = samples * cost.tokens(p.module) * m.hidden * cost.element_bytes() / p.tp;
      l.p2p_s += 2 * cost.comm().p2p(bytes, stage_boundary_crosses_nodes(cost, p.first_device, p.tp, p.dp, s));
    }
  }
  return loads;
}

std::vector<StageLoad> colocated_encoder_loads(const cost::CostModel& cost, const ModulePlacement& p) {
  return grid_loads(cost.colocated_encoder_model(), p, p.microbatch_size);
}

double colocated_handover_seconds(const cost::CostModel& cost, const ModulePlacement& encoder, int llm_tp,
                                  int llm_stages) {
  if (llm_stages == 1 && encoder.tp == llm_tp) return 0;
  const double bytes = cost.module(encoder.module, encoder.tp, encoder.microbatch_size).output_bytes / encoder.tp;
  return cost.comm().p2p(bytes, encoder.devices > cost.run().cluster.devices_per_node);
}

}  // namespace braid::plan
