// Strategy `disttrain`: encoders, the llm and generators on disjoint device sets,
// one 1F1B pipeline across them. Enumerates the llm grid; for each, the encoder
// and generator grids whose slot size fits, pruned to options that are not
// dominated, and combines them exactly. Branch and bound on the llm alone.
#include <functional>
#include <map>

#include "core/plan/disaggregated.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/pareto.hpp"
#include "core/plan/stage_load.hpp"
#include "core/plan/strategies.hpp"

namespace braid::plan {
namespace {

// DistTrain pipelines the whole chain 1F1B.
constexpr spec::Schedule kSchedule = spec::Schedule::one_f_one_b;

struct ChainModules {
  int llm = -1;
  std::vector<int> encoders, generators;
  std::map<int, std::vector<int>> projectors;  // encoder -> its projectors
};

ChainModules chain_modules(const spec::ModelSpec& model) {
  ChainModules c;
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const auto& m = model.modules[i];
    const int idx = static_cast<int>(i);
    if (m.role == spec::Role::llm) c.llm = idx;
    if (m.role == spec::Role::encoder) c.encoders.push_back(idx);
    if (m.role == spec::Role::generator) c.generators.push_back(idx);
    if (m.role == spec::Role::projector) c.projectors[model.index_of(m.inputs.front())].push_back(idx);
  }
  return c;
}

// Projector placements riding on the last stage of encoder grid `p`.
std::vector<ModulePlacement> riders_for(const cost::CostModel& cost, const ChainModules& c, const ModulePlacement& p) {
  std::vector<ModulePlacement> out;
  auto it = c.projectors.find(p.module);
  if (it == c.projectors.end()) return out;
  for (int q : it->second) {
    ModulePlacement r = grid_placement(cost, q, p.tp, 1, p.dp, p.microbatch_size);
    r.first_device = module_stage_devices(p, p.pp - 1).first_device;  // its encoder's last stage
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

void attach_projectors(const cost::CostModel& cost, std::vector<ModulePlacement>& placements) {
  const ChainModules mods = chain_modules(cost.run().model);
  std::erase_if(placements, [](const ModulePlacement& p) { return p.role == spec::Role::projector; });
  const std::size_t placed = placements.size();
  for (std::size_t i = 0; i < placed; ++i) {
    for (auto& r : riders_for(cost, mods, placements[i])) placements.push_back(std::move(r));
  }
}

std::optional<Plan> search_disttrain(const cost::CostModel& cost, const Constraints& c, SearchStats* stats,
                                     std::string* why) {
  const auto& run = cost.run();
  if (!strategy_applies(run.model, Strategy::disttrain, why)) return std::nullopt;
  const ChainModules mods = chain_modules(run.model);
  const int n = run.devices(), per_node = run.cluster.devices_per_node, mb = run.training.microbatch;
  const int others = static_cast<int>(mods.encoders.size() + mods.generators.size());
  const long long B = run.training.global_batch;

  // Options of a non-llm module for a slot of `slot` samples and `after` stages after it.
  std::map<std::tuple<int, int, int>, std::vector<ModuleAnalysis>> memo;
  auto options_for = [&](int m, int slot, int after, int m_slots) -> const std::vector<ModuleAnalysis>& {
    auto key = std::make_tuple(m, slot, after);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    std::vector<ModuleAnalysis> all;
    for (int d = 1; d <= n - 1; ++d) {
      if (!allowed_module_size(d, per_node)) continue;
      for (auto& p : module_grids(cost, m, d, 1, Constraints{0, c.encoder_pp, 0})) {
        const int llm_dp = slot / mb;
        if (slot % p.dp != 0 || (p.dp % llm_dp != 0 && llm_dp % p.dp != 0)) continue;  // even fan-in/out
        p.microbatch_size = slot / p.dp;
        auto riders = riders_for(cost, mods, p);
        std::vector<const ModulePlacement*> rp;
        for (const auto& r : riders) rp.push_back(&r);
        if (stats) ++stats->evaluated;
        ModuleAnalysis a;
        if (analyze_chain_module(cost, p, rp, m_slots, after,
                                 chain_consumers(run.model, run.model.modules[static_cast<std::size_t>(m)]), kSchedule,
                                 a, nullptr) &&
            a.fits) {
          all.push_back(std::move(a));
        }
      }
    }
    auto kept = pareto<4>(std::move(all), [](const ModuleAnalysis& a) {
      return std::array<double, 4>{double(a.placement.devices), a.sum, a.longest, a.tail};
    });
    return memo.emplace(key, std::move(kept)).first->second;
  };

  double best_time = 0;
  int best_devices = 0;
  std::vector<ModulePlacement> best;
  // The llm grid closest to fitting, to explain an infeasible search.
  double closest_need = 0;
  std::string closest;
  const auto& llm_spec = run.model.modules[static_cast<std::size_t>(mods.llm)];
  for (int d = 1; d <= n - others; ++d) {
    if (!allowed_module_size(d, per_node)) continue;
    for (const auto& p : module_grids(cost, mods.llm, d, mb, Constraints{c.tp, c.pp, 0})) {
      if (c.dp && p.dp != c.dp) continue;
      if (B % samples_per_microbatch(p) != 0) continue;
      const int slot = static_cast<int>(samples_per_microbatch(p));  // p's microbatch size is mb
      const int m = microbatches_per_step(run.training, p);
      // Generators first: their depth decides how long the llm and encoders hold activations.
      std::vector<std::vector<const ModuleAnalysis*>> gen_opts;
      bool ok = true;
      for (int g : mods.generators) {
        const auto& o = options_for(g, slot, 0, m);
        if (o.empty()) ok = false;
        std::vector<const ModuleAnalysis*> ptrs;
        for (const auto& a : o) ptrs.push_back(&a);
        gen_opts.push_back(std::move(ptrs));
      }
      if (!ok) continue;
      std::vector<const ModuleAnalysis*> gens(mods.generators.size()), encs(mods.encoders.size());
      std::function<void(std::size_t, int)> pick_generators = [&](std::size_t k, int used) {
        if (k < gens.size()) {
          for (const auto* a : gen_opts[k]) {
            if (used + a->placement.devices > n) continue;
            gens[k] = a;
            pick_generators(k + 1, used + a->placement.devices);
          }
          return;
        }
        int gen_depth = 0;
        for (const auto* a : gens) gen_depth = std::max(gen_depth, a->placement.pp);
        if (stats) ++stats->evaluated;
        ModuleAnalysis backbone;
        std::string reason;
        const bool valid = analyze_chain_module(cost, p, {}, m, gen_depth, chain_consumers(run.model, llm_spec),
                                                kSchedule, backbone, &reason);
        if (!valid || !backbone.fits) {
          double need = valid ? backbone.peak_memory : 1e300;
          if (closest.empty() || need < closest_need) {
            closest_need = need;
            Plan alone;
            alone.layout = Layout::chain;
            alone.modules = {p};
            closest = describe_grids(alone) + ": " +
                      (valid ? "needs " + gib(need) + " but a device has " + gib(run.cluster.memory_bytes) : reason);
          }
          return;
        }
        // Bound: encoders only add to the llm-and-generators step.
        if (!best.empty() && combine_chain({}, backbone, gens, m) > best_time * (1 + 1e-9)) return;
        std::function<void(std::size_t, int)> pick_encoders = [&](std::size_t k, int used2) {
          if (k == encs.size()) {
            if (c.all_devices && used2 != n) return;
            std::vector<const ModuleAnalysis*> all(encs.begin(), encs.end());
            all.insert(all.end(), gens.begin(), gens.end());
            all.push_back(&backbone);
            if (!packs(cost, all)) return;
            double t = combine_chain(encs, backbone, gens, m);
            if (best.empty() || t < best_time * (1 - 1e-9) || (t <= best_time * (1 + 1e-9) && used2 < best_devices)) {
              best_time = t;
              best_devices = used2;
              best.clear();
              for (const auto* a : encs) best.push_back(a->placement);
              best.push_back(p);
              for (const auto* a : gens) best.push_back(a->placement);
            }
            return;
          }
          for (const auto& a : options_for(mods.encoders[k], slot, p.pp + gen_depth, m)) {
            if (used2 + a.placement.devices > n) continue;
            encs[k] = &a;
            pick_encoders(k + 1, used2 + a.placement.devices);
          }
        };
        pick_encoders(0, used);
      };
      pick_generators(0, p.devices);
    }
  }
  if (best.empty()) {
    if (why) {
      *why = !closest.empty() ? closest
             : c.all_devices
                 ? "no split of all " + std::to_string(n) + " devices between the encoders, the llm '" + llm_spec.name +
                       "' and the generators fits memory and the batch (" + module_size_rule(per_node) + ")"
                 : "no split of " + std::to_string(n) + " devices between the encoders, the llm '" + llm_spec.name +
                       "' and the generators fits memory and the batch";
    }
    return std::nullopt;
  }
  Plan plan;
  plan.strategy = Strategy::disttrain;
  plan.layout = Layout::chain;
  plan.cluster_devices = n;
  plan.schedule = kSchedule;
  plan.modules = std::move(best);
  pack_placements(cost, plan.modules);
  attach_projectors(cost, plan.modules);
  return finish_plan(cost, std::move(plan));
}

}  // namespace braid::plan
