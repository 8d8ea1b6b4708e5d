#include "core/train/trained_load.hpp"

#include <algorithm>

#include "core/bubble/encoder_tasks.hpp"
#include "core/common/error.hpp"
#include "core/cost/cost_model.hpp"
#include "core/orchestrate/program.hpp"

namespace braid::train {

namespace {

std::vector<StageSeconds> model_seconds(const pipeline::Program& program) {
  std::vector<StageSeconds> out;
  for (const auto& st : program.stages) {
    StageSeconds s;
    for (const auto& u : st.units)
      if (u.kind == pipeline::UnitKind::model) s.model += u.forward_s + u.forward_tp_s + u.backward_s + u.backward_tp_s;
    out.push_back(s);
  }
  return out;
}

}  // namespace

std::vector<StageSeconds> stage_seconds(const cost::CostModel& cost, const plan::Plan& plan, spec::Schedule schedule) {
  if (plan.layout != plan::Layout::colocated) return model_seconds(orchestrate::build_program(cost, plan, schedule));
  // Not the bubble scheduler's placement search: its programs keep these units and tasks.
  const bubble::Colocated c = bubble::decompose(cost, plan);
  auto out = model_seconds(c.llm);
  for (std::size_t s = 0; s < out.size(); ++s)
    for (const bubble::Host& h : c.hosts[s]) out[s].encoder += h.forward_s + h.backward_s;
  return out;
}

TrainedLoad::TrainedLoad(const cost::CostModel& cost, const plan::Plan& plan, const RankProgram& program,
                         bool samples_in_step)
    : cost_(cost),
      plan_(plan),
      program_(program),
      samples_in_step_(samples_in_step),
      base_(stage_seconds(cost, plan, program.program.schedule)) {}

const std::vector<StageSeconds>& TrainedLoad::seconds_on(std::vector<cost::TrainedSample> samples) {
  // A microbatch runs one pass per side, its text at the longest caption: order does not matter.
  std::sort(samples.begin(), samples.end());
  auto it = seconds_.find(samples);
  if (it != seconds_.end()) return it->second;
  // The microbatch as the whole of the trained samples: each module that sees images or text is
  // priced on exactly these. (A module whose microbatches are of another size keeps its nominal
  // price here; it is not read for these samples: its ranks recorded their own microbatches.)
  const cost::CostModel cost(cost_.run(), cost::TrainedSamples{samples}, cost_.kernels());
  return seconds_.emplace(std::move(samples), stage_seconds(cost, plan_, program_.program.schedule)).first->second;
}

std::vector<double> TrainedLoad::loads(int stage, double base, double StageSeconds::*part,
                                       std::vector<std::vector<cost::TrainedSample>> RankSides::*ran,
                                       const StepSides& step) {
  const auto& st = program_.program.stages[static_cast<std::size_t>(stage)];
  std::vector<double> out;
  if (base <= 0) return out;  // no such work on the stage: nothing scales
  const std::size_t slots = (step[static_cast<std::size_t>(program_.rank_of(stage, 0, 0))].*ran).size();
  out.assign(slots * static_cast<std::size_t>(st.replicas), 0.0);
  for (int r = 0; r < st.replicas; ++r) {
    for (int t = 0; t < st.devices_per_replica; ++t) {
      const auto& mbs = step[static_cast<std::size_t>(program_.rank_of(stage, r, t))].*ran;
      if (mbs.size() != slots)
        throw Error(Status::invalid_argument, "stage '" + st.name + "': its ranks ran " + std::to_string(slots) +
                                                  " and " + std::to_string(mbs.size()) + " microbatches");
      for (std::size_t k = 0; k < slots; ++k) {  // no samples recorded: the program's price
        const double load = mbs[k].empty() ? 1.0 : seconds_on(mbs[k])[static_cast<std::size_t>(stage)].*part / base;
        double& at = out[static_cast<std::size_t>(r) * slots + k];
        at = std::max(at, load);
      }
    }
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
    auto& data = scaled.stages[s].data_s;
    data.clear();
    if (!samples_in_step_) continue;
    const auto& st = scaled.stages[s];
    data.assign(static_cast<std::size_t>(st.replicas), 0.0);
    for (int r = 0; r < st.replicas; ++r)
      for (int t = 0; t < st.devices_per_replica; ++t) {
        const RankSides& ran = step[static_cast<std::size_t>(program_.rank_of(stage, r, t))];
        data[static_cast<std::size_t>(r)] =
            std::max(data[static_cast<std::size_t>(r)], cost_.data_seconds(ran.rendered, ran.described));
      }
  }
}

}  // namespace braid::train
