#include "core/train/trained_load.hpp"

#include <algorithm>

#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/program.hpp"

namespace braid::train {

using pipeline::UnitKind;

std::vector<StageSeconds> stage_seconds(const pipeline::Program& program) {
  std::vector<StageSeconds> out;
  for (const auto& st : program.stages) {
    StageSeconds s;
    for (const auto& u : st.units) {
      const double t = u.forward_s + u.forward_tp_s + u.backward_s + u.backward_tp_s;
      if (u.kind == UnitKind::model)
        s.model += t;
      else if (u.kind != UnitKind::encoder_shard)
        s.encoder += t;
    }
    out.push_back(s);
  }
  return out;
}

TrainedLoad::TrainedLoad(const spec::RunSpec& run, const plan::Plan& plan, const RankProgram& program)
    : run_(run), plan_(plan), program_(program), base_(stage_seconds(program.program)) {}

const std::vector<StageSeconds>& TrainedLoad::seconds_on(std::vector<int> sides) {
  std::sort(sides.begin(), sides.end());  // a microbatch runs one pass per side: order does not matter
  auto it = seconds_.find(sides);
  if (it != seconds_.end()) return it->second;
  // The microbatch as the whole of the trained images: each module that sees them is priced on
  // exactly these. (A module whose microbatches are of another size keeps its nominal price
  // here; it is not read for these sides: its ranks recorded their own microbatches.)
  const cost::CostModel cost(run_, cost::TrainedImages{sides});
  const pipeline::Program priced = orchestrate::build_program(cost, plan_, program_.program.schedule);
  return seconds_.emplace(std::move(sides), stage_seconds(priced)).first->second;
}

std::vector<double> TrainedLoad::loads(int stage, double base, double StageSeconds::*part,
                                       std::vector<std::vector<int>> RankSides::*ran, const StepSides& step) {
  const auto& st = program_.program.stages[static_cast<std::size_t>(stage)];
  std::vector<double> out;
  if (base <= 0) return out;  // no such work on the stage: nothing scales
  const std::size_t slots = (step[static_cast<std::size_t>(program_.rank_of(stage, 0, 0))].*ran).size();
  for (int r = 0; r < st.replicas; ++r) {
    const auto& mbs = step[static_cast<std::size_t>(program_.rank_of(stage, r, 0))].*ran;
    if (mbs.size() != slots)
      throw Error(Status::invalid_argument, "stage '" + st.name + "': replicas ran " + std::to_string(slots) + " and " +
                                                std::to_string(mbs.size()) + " microbatches");
    for (const auto& sides : mbs)  // no images recorded: the program's price
      out.push_back(sides.empty() ? 1.0 : seconds_on(sides)[static_cast<std::size_t>(stage)].*part / base);
  }
  return out;
}

void TrainedLoad::apply(const StepSides& step, pipeline::Program& scaled) {
  if (step.size() != program_.stage_of_rank.size())
    throw Error(Status::invalid_argument, "microbatch sides of " + std::to_string(step.size()) +
                                              " ranks for a world of " + std::to_string(program_.stage_of_rank.size()));
  for (std::size_t s = 0; s < scaled.stages.size(); ++s) {
    const int stage = static_cast<int>(s);
    scaled.stages[s].work_scale = loads(stage, base_[s].model, &StageSeconds::model, &RankSides::microbatches, step);
    scaled.stages[s].task_scale =
        loads(stage, base_[s].encoder, &StageSeconds::encoder, &RankSides::encoder_microbatches, step);
  }
}

}  // namespace braid::train
