#include "core/data/arrangement.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "core/common/error.hpp"

namespace braid::data {
namespace {

std::size_t at(int i) { return static_cast<std::size_t>(i); }

// The linear pipeline of group `g` seen by the 1F1B evaluator: one level per depth of
// the program; where a level has several stages (encoders side by side) or the group
// several replicas of a stage (fan-in), the slowest sets the level's time.
PipelineTimes group_times(const BatchLayout& layout, const pipeline::Program& program,
                          const std::vector<std::vector<double>>& scales, int g) {
  std::map<int, int> level;  // depth -> level
  for (const auto& st : program.stages) level.emplace(st.depth, 0);
  int n = 0;
  for (auto& [depth, l] : level) l = n++;
  const int m = layout.slots, G = layout.grid.groups;
  PipelineTimes t;
  t.stages = n;
  t.microbatches = m;
  t.forward.assign(at(n * m), 0);
  t.backward.assign(at(n * m), 0);
  t.send_activation.assign(at(n), 0);
  t.send_grad.assign(at(n), 0);
  t.tail.assign(at(n), 0);
  for (std::size_t s = 0; s < program.stages.size(); ++s) {
    const auto& st = program.stages[s];
    const int l = level[st.depth];
    const auto& u = st.units.front();
    t.send_activation[at(l)] = std::max(t.send_activation[at(l)], st.send_activation_s);
    t.send_grad[at(l)] = std::max(t.send_grad[at(l)], st.send_grad_s);
    t.tail[at(l)] = std::max(t.tail[at(l)], st.reduce_grads_s + st.optimizer_s);
    const int d = st.replicas;
    for (int r = g * d / G; r < (g + 1) * d / G; ++r) {
      for (int k = 0; k < m; ++k) {
        const double scale = scales[s].empty() ? 1 : scales[s][at(r * m + k)];
        auto& f = t.forward[at(l * m + k)];
        auto& b = t.backward[at(l * m + k)];
        f = std::max(f, (u.forward_s + u.forward_tp_s) * scale);
        b = std::max(b, (u.backward_s + u.backward_tp_s) * scale + u.shard_comm_s);
      }
    }
  }
  return t;
}

}  // namespace

const char* reordering_name(Reordering r) {
  switch (r) {
    case Reordering::none:
      return "none";
    case Reordering::intra:
      return "intra";
    case Reordering::intra_inter:
      return "intra_inter";
  }
  return "?";
}

BatchLayout batch_layout(const spec::RunSpec& run, const plan::Plan& plan, const pipeline::Program& program,
                         long long samples) {
  using spec::Schedule;
  const Schedule schedule = program.schedule;
  const std::string name = spec::schedule_name(schedule);
  // Colocated programs (whichever way encoder tasks are placed) run the llm's 1F1B.
  const bool colocated = plan.layout == plan::Layout::colocated;
  if (!colocated && schedule != Schedule::one_f_one_b && schedule != Schedule::gpipe &&
      schedule != Schedule::interleaved) {
    throw Error(Status::unsupported, "data reordering needs one stream of microbatches per pipeline; the '" + name +
                                         "' schedule groups them for a contrastive batch-sync, which it does not "
                                         "handle yet");
  }
  BatchLayout L;
  L.samples = samples;
  L.modules = static_cast<int>(run.model.modules.size());
  L.slots = program.microbatches;
  L.module_dp.assign(at(L.modules), 0);
  L.stage_work.resize(program.stages.size());
  std::vector<int> widths;
  for (std::size_t s = 0; s < program.stages.size(); ++s) {
    const auto& st = program.stages[s];
    for (const auto& p : plan.modules) {
      // Colocated encoders run as encoder tasks on the llm's devices, with their own grid.
      if (plan.layout == plan::Layout::colocated && p.role == spec::Role::encoder) continue;
      if (p.dp != st.replicas) continue;
      const int total = std::accumulate(p.layers_per_stage.begin(), p.layers_per_stage.end(), 0);
      for (int k = 0; k < p.pp; ++k) {
        if (plan::module_stage_devices(p, k).first_device != st.first_device) continue;
        const double layers = k < static_cast<int>(p.layers_per_stage.size()) ? p.layers_per_stage[at(k)] : 0;
        L.stage_work[s].push_back({p.module, total > 0 ? layers / total : 1.0 / p.pp});
        L.module_dp[at(p.module)] = p.dp;
      }
    }
    if (!L.stage_work[s].empty()) widths.push_back(st.replicas);
  }
  if (widths.empty()) throw Error(Status::internal, "no stage of the program holds a module of the plan");
  L.grid = cell_grid(widths);
  const long long per_slot = static_cast<long long>(L.grid.cells) * L.slots;
  if (samples < 1 || samples % per_slot != 0) {
    throw Error(Status::invalid_argument, "a batch of " + std::to_string(samples) + " samples does not split into " +
                                              std::to_string(L.slots) + " microbatches of each of " +
                                              std::to_string(L.grid.cells) + " data-parallel cells");
  }
  L.cell_slot = static_cast<int>(samples / per_slot);
  L.orderable = schedule == Schedule::one_f_one_b || colocated;
  if (!L.orderable) L.unordered_why = "inter-microbatch ordering is for 1F1B, not the " + name + " schedule";
  return L;
}

std::vector<std::vector<double>> work_scales(const BatchLayout& layout, const pipeline::Program& program,
                                             std::span<const double> costs, std::span<const double> reference,
                                             const Arrangement& a) {
  const int C = layout.grid.cells, m = layout.slots, M = layout.modules;
  // Costs summed per (cell, slot, module) first: stages then read whole cells.
  std::vector<double> sums(at(C) * at(m) * at(M), 0);
  for (std::size_t i = 0; i < a.cell.size(); ++i) {
    double* into = &sums[(at(a.cell[i]) * at(m) + at(a.slot[i])) * at(M)];
    for (int k = 0; k < M; ++k) into[k] += costs[i * at(M) + at(k)];
  }
  std::vector<std::vector<double>> out(program.stages.size());
  for (std::size_t s = 0; s < program.stages.size(); ++s) {
    const auto& work = layout.stage_work[s];
    if (work.empty()) continue;
    const int d = program.stages[s].replicas, per = C / d;
    double den = 0;
    for (const auto& w : work) den += w.share * reference[at(w.module)];
    den *= double(layout.cell_slot) * per;
    auto& scale = out[s];
    scale.resize(at(d) * at(m));
    for (int r = 0; r < d; ++r) {
      for (int k = 0; k < m; ++k) {
        double num = 0;
        for (int c = r * per; c < (r + 1) * per; ++c) {
          for (const auto& w : work) num += w.share * sums[(at(c) * at(m) + at(k)) * at(M) + at(w.module)];
        }
        scale[at(r * m + k)] = den > 0 ? num / den : 1;
      }
    }
  }
  return out;
}

Arrangement arrange(const BatchLayout& layout, const pipeline::Program& program, std::span<const double> costs,
                    std::span<const double> reference, Reordering how, const OrderOptions& options) {
  const auto n = static_cast<std::size_t>(layout.samples), M = at(layout.modules);
  if (costs.size() != n * M || reference.size() != M) {
    throw Error(Status::invalid_argument, "costs must hold " + std::to_string(n) + " samples x " + std::to_string(M) +
                                              " modules, and the reference one cost per module");
  }
  std::vector<double> total(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < M; ++k) total[i] += costs[i * M + k];
  const RankAssignment cells =
      how == Reordering::none ? assign_in_order(total, layout.grid.cells) : assign_lpt(total, layout.grid.cells);
  Arrangement a;
  a.slot = split_microbatches(cells, layout.slots);
  a.cell = cells.rank;
  a.cell_load = cells.load;
  std::vector<int> identity(at(layout.slots));
  std::iota(identity.begin(), identity.end(), 0);
  a.orders.assign(at(layout.grid.groups), identity);
  if (how != Reordering::intra_inter || !layout.orderable) return a;
  const auto scales = work_scales(layout, program, costs, reference, a);
  std::vector<std::vector<int>> position(a.orders.size(), identity);  // microbatch -> slot
  for (int g = 0; g < layout.grid.groups; ++g) {
    const OrderSearch found = order_microbatches(group_times(layout, program, scales, g), options);
    a.evaluations += found.evaluations;
    a.orders[at(g)] = found.order;
    for (int k = 0; k < layout.slots; ++k) position[at(g)][at(found.order[at(k)])] = k;
  }
  for (std::size_t i = 0; i < n; ++i) a.slot[i] = position[at(layout.grid.group_of(a.cell[i]))][at(a.slot[i])];
  return a;
}

StageStraggler worst_stage(const pipeline::Program& program, const std::vector<std::vector<double>>& scales) {
  StageStraggler worst;
  const int chunks = std::max(1, program.virtual_stages);
  for (std::size_t s = 0; s < program.stages.size(); ++s) {
    const auto& st = program.stages[s];
    if (s >= scales.size() || scales[s].empty()) continue;
    double per_microbatch = 0;  // compute of one nominal microbatch on this stage
    for (int c = 0; c < chunks && c < static_cast<int>(st.units.size()); ++c) {
      const auto& u = st.units[at(c)];
      per_microbatch += u.forward_s + u.forward_tp_s + u.backward_s + u.backward_tp_s;
    }
    const std::size_t slots = scales[s].size() / at(st.replicas);
    std::vector<double> busy(at(st.replicas), 0);
    for (std::size_t i = 0; i < scales[s].size(); ++i) busy[i / slots] += scales[s][i] * per_microbatch;
    const Straggler g = straggler(busy);
    if (worst.stage < 0 || g.time > worst.straggler.time) worst = {g, static_cast<int>(s)};
  }
  return worst;
}

}  // namespace braid::data
