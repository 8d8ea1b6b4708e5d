#include "core/bubble/encoder_tasks.hpp"

#include <algorithm>

#include "core/common/error.hpp"
#include "core/pipeline/from_plan.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/stage_load.hpp"

namespace braid::bubble {
namespace {

using pipeline::WorkUnit;

WorkUnit unit_from(const std::string& label, const cost::BlockCost& c, bool communication) {
  WorkUnit u;
  u.label = label;
  u.forward_s = c.forward_s;
  u.forward_tp_s = c.comm_forward_s;
  u.backward_s = c.backward_s + c.recompute_s;
  u.backward_tp_s = c.comm_backward_s;
  u.recompute_s = c.forward_s;
  u.activation_bytes = c.activation_bytes;
  u.input_bytes = c.activation_bytes;
  u.hardware_flops = c.hardware_flops();
  u.communication = communication;
  return u;
}

// A transfer or collective outside any layer: the same seconds both ways unless given.
WorkUnit transfer_unit(const std::string& label, double forward_s, double backward_s) {
  WorkUnit u;
  u.label = label;
  u.forward_tp_s = forward_s;
  u.backward_tp_s = backward_s;
  u.communication = true;
  return u;
}

double forward_seconds(const WorkUnit& u) { return u.forward_s + u.forward_tp_s; }
double backward_seconds(const WorkUnit& u) { return u.backward_s + u.backward_tp_s + u.shard_comm_s; }

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

int Colocated::last_needed(int e, int lane, int p) const {
  const int K = encoders[static_cast<std::size_t>(e)].microbatches;
  const int n = static_cast<int>(lane_list(e, lane).size());
  return std::min(K, ceil_div(static_cast<long long>(p + 1) * K, n)) - 1;
}

int Colocated::first_needing(int e, int lane, int j) const {
  const auto& l = lane_list(e, lane);
  const int K = encoders[static_cast<std::size_t>(e)].microbatches;
  return l[static_cast<std::size_t>(static_cast<long long>(j) * static_cast<long long>(l.size()) / K)];
}

int Colocated::last_feeding(int e, int lane, int j) const {
  const auto& l = lane_list(e, lane);
  const int K = encoders[static_cast<std::size_t>(e)].microbatches;
  const int n = static_cast<int>(l.size());
  return l[static_cast<std::size_t>(std::min(n, ceil_div(static_cast<long long>(j + 1) * n, K)) - 1)];
}

Colocated decompose(const cost::CostModel& cost, const plan::Plan& plan) {
  const auto& run = cost.run();
  if (plan.layout != plan::Layout::colocated)
    throw Error(Status::bad_config, "the bubble scheduler takes a colocated (optimus) plan");
  plan::Plan copy = plan;
  std::string why;
  if (!plan::evaluate(cost, copy, &why) && copy.estimate.iteration_time_s <= 0)
    throw Error(Status::bad_config, "the plan cannot run: " + why);

  plan::Plan llm_grid = plan;
  std::erase_if(llm_grid.modules, [](const plan::ModulePlacement& m) { return m.role == spec::Role::encoder; });
  llm_grid.layout = plan::Layout::monolithic;
  Colocated c;
  c.llm = pipeline::build_program(cost, llm_grid, spec::Schedule::one_f_one_b);
  c.llm.model_flops = double(run.training.global_batch) * cost.model_flops_per_sample();
  c.microbatches = c.llm.microbatches;
  const int P = c.stages();
  for (auto& st : c.llm.stages) {
    st.instructions.resize(st.instructions.size() - 2);  // the step's tail
    st.memory = plan::colocated_llm_state(st.memory);
    // The llm's exposed parameter all-gather opens the step (see StageProgram::gather_s).
    st.gather_s = std::max(0.0, st.reduce_grads_s - st.early_reduce_s);
    st.reduce_grads_s -= st.gather_s;
  }
  c.hosts.resize(static_cast<std::size_t>(P));

  for (const auto& m : plan.modules) {
    if (m.role != spec::Role::encoder) continue;
    const int e = static_cast<int>(c.encoders.size());
    Encoder enc;
    enc.name = m.name;
    enc.microbatches = plan::microbatches_per_step(run.training, m);
    enc.stages = m.pp;
    enc.span = P / m.pp;
    if (enc.microbatches >= (1 << 16)) throw Error(Status::bad_config, m.name + ": too many encoder microbatches");
    enc.lane_microbatches.resize(static_cast<std::size_t>(enc.span));
    const bool split = c.microbatches % enc.span == 0;
    for (int i = 0; i < c.microbatches; ++i) {
      for (int lane = 0; lane < enc.span; ++lane) {
        if (!split || lane == enc.span - 1 - i % enc.span)
          enc.lane_microbatches[static_cast<std::size_t>(lane)].push_back(i);
      }
    }
    c.encoders.push_back(enc);
    const cost::CostModel& priced = cost.colocated_encoder_model();
    const auto loads = plan::colocated_encoder_loads(cost, m);
    const cost::ModuleCost& mc = priced.module(m.module, m.tp, m.microbatch_size);
    const auto kernels = priced.layer_kernels(m.module, m.tp, m.microbatch_size);
    const double handover = plan::colocated_handover_seconds(cost, m, c.llm.stages[0].devices_per_replica, P);
    for (int s = 0; s < P; ++s) {
      auto& st = c.llm.stages[static_cast<std::size_t>(s)];
      Host h;
      h.encoder = e;
      h.encoder_stage = s / enc.span;
      h.lane = s % enc.span;
      st.parts.push_back(pipeline::stage_part(m, h.encoder_stage));
      const auto& l = loads[static_cast<std::size_t>(h.encoder_stage)];
      const bool first = h.encoder_stage == 0, last = h.encoder_stage == m.pp - 1;
      const int layers = m.layers_per_stage[static_cast<std::size_t>(h.encoder_stage)];
      auto add_unit = [&](WorkUnit u, pipeline::UnitKind kind, int kernel = -1) {
        u.kind = kind;
        u.module = m.module;
        u.kernel = kernel;
        st.units.push_back(std::move(u));
        return static_cast<int>(st.units.size()) - 1;
      };
      auto task = [&](int unit, int layer, bool backward) {
        const WorkUnit& u = st.units[static_cast<std::size_t>(unit)];
        Task t{unit, layer, u.communication, backward ? backward_seconds(u) : forward_seconds(u)};
        (backward ? h.backward : h.forward).push_back(t);
        (backward ? h.backward_s : h.forward_s) += t.seconds;
      };
      // Every stage holds the same block of kEncoderUnits units for each encoder, whether it
      // runs them or not, so that an EncoderTask's unit says which encoder and which kernel
      // by itself (encoder_unit; the C ABI documents the numbering).
      if (static_cast<int>(st.units.size()) != encoder_unit(e, 0) || static_cast<int>(kernels.size()) != kLayerUnits)
        throw Error(Status::internal, m.name + ": its work units do not follow the encoder unit numbering");
      const std::string prefix = m.name + " ";
      const int embed_unit =
          add_unit(unit_from(prefix + "embedding", mc.first, false), pipeline::UnitKind::encoder_embedding);
      const int base = static_cast<int>(st.units.size());
      for (std::size_t k = 0; k < kernels.size(); ++k) {
        WorkUnit u = unit_from(prefix + kernels[k].name, kernels[k].cost, kernels[k].communication);
        u.activation_bytes = u.input_bytes = 0;
        add_unit(std::move(u), pipeline::UnitKind::encoder_kernel, static_cast<int>(k));
      }
      const int kinds = static_cast<int>(kernels.size());
      // The layer's stored activations live with its first kernel: kept by that
      // kernel's forward task, freed by its backward task.
      st.units[static_cast<std::size_t>(base)].activation_bytes = mc.layer.activation_bytes;
      // Full recomputation re-runs the layer's forward, collectives included, in its first
      // backward task (the last kernel's; nn::ImageEncoder::backward_kernel), every pass of the
      // microbatch at once, and holds it to the layer's last.
      WorkUnit& first_backward = st.units[static_cast<std::size_t>(base + kinds - 1)];
      first_backward.recompute_bytes = mc.recompute_bytes_all_passes;
      if (cost::recomputed(run.training) == spec::Recompute::full) {
        for (int k = 0; k < kinds; ++k) {
          const cost::BlockCost& c = kernels[static_cast<std::size_t>(k)].cost;
          WorkUnit& u = st.units[static_cast<std::size_t>(base + k)];
          u.backward_s -= c.recompute_s;
          u.backward_tp_s -= c.comm_forward_s;
          u.hardware_flops -= c.flops_recompute;
          first_backward.backward_s += c.recompute_s;
          first_backward.backward_tp_s += c.comm_forward_s;
          first_backward.hardware_flops += c.flops_recompute;
        }
      }
      const int head_unit = add_unit(unit_from(prefix + "head", mc.last, false), pipeline::UnitKind::encoder_head);
      const double out_s = last ? handover : l.p2p_s / 2;
      const int send_unit = add_unit(transfer_unit(prefix + (last ? "hand-over" : "send"), out_s, out_s),
                                     pipeline::UnitKind::encoder_transfer);
      WorkUnit shard_traffic = transfer_unit(prefix + "dp shard traffic", 0, 0);
      shard_traffic.shard_comm_s = l.shard_comm_s;  // ZeRO-2/3 traffic of the encoder's gradients, per microbatch
      const int shard_unit = add_unit(std::move(shard_traffic), pipeline::UnitKind::encoder_shard);
      // The tasks this stage runs: the embedding on the encoder's first stage, the head (when
      // it has work) on its last, the transfer and the shard traffic when they take time.
      const int embed = first ? embed_unit : -1;
      const int head = last && mc.last.hardware_flops() > 0 ? head_unit : -1;
      const int send = out_s > 0 ? send_unit : -1;
      const int shard = l.shard_comm_s > 0 ? shard_unit : -1;

      if (embed >= 0) task(embed, 0, false);
      for (int layer = 0; layer < layers; ++layer)
        for (int k = 0; k < kinds; ++k) task(base + k, layer, false);
      if (head >= 0) task(head, 0, false);
      if (send >= 0) task(send, 0, false);
      if (send >= 0) task(send, 0, true);
      if (head >= 0) task(head, 0, true);
      for (int layer = layers - 1; layer >= 0; --layer)
        for (int k = kinds - 1; k >= 0; --k) task(base + k, layer, true);
      if (embed >= 0) task(embed, 0, true);
      if (shard >= 0) task(shard, 0, true);

      st.reduce_grads_s += l.exposed_dp_sync(run.training);  // as plan::evaluate_colocated charges it
      st.optimizer_s += l.optimizer_s;
      plan::host_colocated_encoder(st.memory, l);
      c.hosts[static_cast<std::size_t>(s)].push_back(std::move(h));
    }
  }
  if (c.encoders.empty()) throw Error(Status::bad_config, "a colocated plan needs an encoder");
  return c;
}

}  // namespace braid::bubble
