#include "core/plan/plan.hpp"

namespace braid::plan {

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::megatron:
      return "megatron";
    case Strategy::distmm:
      return "distmm";
    case Strategy::disttrain:
      return "disttrain";
    case Strategy::optimus:
      return "optimus";
    case Strategy::fixed:
      return "fixed";
    case Strategy::automatic:
      return "auto";
  }
  return "?";
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::monolithic:
      return "monolithic";
    case Layout::branches:
      return "branches";
    case Layout::chain:
      return "chain";
    case Layout::colocated:
      return "colocated";
  }
  return "?";
}

std::optional<Strategy> parse_strategy(const std::string& name) {
  for (Strategy s : {Strategy::megatron, Strategy::distmm, Strategy::disttrain, Strategy::optimus, Strategy::fixed,
                     Strategy::automatic}) {
    if (name == strategy_name(s)) return s;
  }
  return std::nullopt;
}

std::optional<Layout> parse_layout(const std::string& name) {
  for (Layout l : {Layout::monolithic, Layout::branches, Layout::chain, Layout::colocated}) {
    if (name == layout_name(l)) return l;
  }
  return std::nullopt;
}

long long samples_per_microbatch(const ModulePlacement& p) { return static_cast<long long>(p.dp) * p.microbatch_size; }

int microbatches_per_step(const spec::TrainingSpec& t, const ModulePlacement& p) {
  return static_cast<int>(t.global_batch / samples_per_microbatch(p));
}

int microbatches_per_group(const spec::TrainingSpec& t, const ModulePlacement& p) {
  return static_cast<int>(t.contrastive_batch / samples_per_microbatch(p));
}

int contrastive_groups(const spec::TrainingSpec& t) { return static_cast<int>(t.global_batch / t.contrastive_batch); }

StageDevices module_stage_devices(const ModulePlacement& p, int s) {
  return StageDevices{p.first_device + s * p.tp * p.dp, p.dp, p.tp, p.tp};
}

StageDevices grid_stage_devices(int tp, int dp, int s) { return StageDevices{s * tp * dp, dp, tp, tp}; }

int placement_index(const Plan& plan, int model_module) {
  for (std::size_t i = 0; i < plan.modules.size(); ++i)
    if (model_module >= 0 && plan.modules[i].module == model_module) return static_cast<int>(i);
  return -1;
}

}  // namespace braid::plan
