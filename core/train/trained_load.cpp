#include "core/train/trained_load.hpp"

#include <algorithm>

#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/program.hpp"

namespace braid::train {

std::vector<double> model_seconds(const pipeline::Program& program) {
  std::vector<double> out;
  for (const auto& st : program.stages) {
    double s = 0;
    for (const auto& u : st.units)
      if (u.kind == pipeline::UnitKind::model) s += u.forward_s + u.forward_tp_s + u.backward_s + u.backward_tp_s;
    out.push_back(s);
  }
  return out;
}

TrainedLoad::TrainedLoad(const spec::RunSpec& run, const plan::Plan& plan, const RankProgram& program)
    : run_(run), plan_(plan), program_(program), base_(model_seconds(program.program)) {}

const std::vector<double>& TrainedLoad::stage_seconds(std::vector<int> sides) {
  std::sort(sides.begin(), sides.end());  // a microbatch runs one pass per side: order does not matter
  auto it = seconds_.find(sides);
  if (it != seconds_.end()) return it->second;
  // The microbatch as the whole of the trained images: each module that sees them is priced
  // on exactly these (a stage whose microbatch is of another size keeps the nominal price,
  // and is not read: its ranks recorded their own microbatches).
  const cost::CostModel cost(run_, cost::TrainedImages{sides});
  const pipeline::Program priced = orchestrate::build_program(cost, plan_, program_.program.schedule);
  return seconds_.emplace(std::move(sides), model_seconds(priced)).first->second;
}

std::vector<std::vector<double>> TrainedLoad::work_scales(const StepSides& step) {
  const pipeline::Program& p = program_.program;
  if (step.size() != program_.stage_of_rank.size())
    throw Error(Status::invalid_argument, "microbatch sides of " + std::to_string(step.size()) +
                                              " ranks for a world of " + std::to_string(program_.stage_of_rank.size()));
  std::vector<std::vector<double>> scales(p.stages.size());
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    if (base_[s] <= 0) continue;  // no model chunk: nothing scales
    const std::size_t slots = step[static_cast<std::size_t>(program_.rank_of(static_cast<int>(s), 0, 0))].size();
    for (int r = 0; r < st.replicas; ++r) {
      const auto& ran = step[static_cast<std::size_t>(program_.rank_of(static_cast<int>(s), r, 0))];
      if (ran.size() != slots)
        throw Error(Status::invalid_argument, "stage '" + st.name + "': replicas ran " + std::to_string(slots) +
                                                  " and " + std::to_string(ran.size()) + " microbatches");
      for (const auto& sides : ran)  // no images recorded: the program's price
        scales[s].push_back(sides.empty() ? 1.0 : stage_seconds(sides)[s] / base_[s]);
    }
  }
  return scales;
}

}  // namespace braid::train
