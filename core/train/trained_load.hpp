// The program's work on the samples a run trained. `braid train` prices its program at the
// trained samples' mean (cost::TrainedSamples): every microbatch of every replica as long as
// the average one. The steps it runs are not: a microbatch of larger images or longer captions
// takes longer, and where replicas or stages meet (a batch-sync, a DP reduction, the next
// pipeline stage) the slowest sets the pace, which a program of equal microbatches does not
// see. This prices each microbatch each rank ran on its own images and captions, as
// StageProgram::work_scale and task_scale, so the simulator replays the steps the ranks trained.
#pragma once

#include <map>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"
#include "core/spec/run.hpp"
#include "core/train/rank_program.hpp"

namespace braid::train {

// The image sides and captions of what one rank ran in a step, as its StepResult records them.
struct RankSides {
  std::vector<std::vector<cost::TrainedSample>> microbatches;          // per microbatch of its stage
  std::vector<std::vector<cost::TrainedSample>> encoder_microbatches;  // per microbatch of its colocated encoder
  std::vector<int> rendered;   // the samples made for its step: the sides of those rendered ...
  std::int64_t described = 0;  // ... and how many were described
};
using StepSides = std::vector<RankSides>;  // one step, per rank

// Per stage of a plan's program, the compute of one microbatch's forward and backward
// (tensor-parallel collectives included): its model chunks', and its colocated encoder's
// tasks' (every task of one encoder microbatch, as bubble::decompose prices them; not their
// ZeRO shard traffic, which no image changes).
struct StageSeconds {
  double model = 0, encoder = 0;
};
// As `cost` prices the program of `plan` that runs `schedule`. A colocated plan's are read from
// bubble::decompose, whose units and tasks the bubble scheduler places without changing them.
std::vector<StageSeconds> stage_seconds(const cost::CostModel& cost, const plan::Plan& plan, spec::Schedule schedule);

class TrainedLoad {
 public:
  // `program` is the one the ranks ran, built by orchestrate::build_program from `cost` (the
  // trained samples' mean) and `plan`; all three outlive this. `samples_in_step`: the ranks
  // made their samples in the step's time (no data worker, or no core left for one).
  TrainedLoad(const cost::CostModel& cost, const plan::Plan& plan, const RankProgram& program,
              bool samples_in_step = false);

  // Sets every stage's work_scale and task_scale in `scaled` (a copy of the program) for one
  // step: replica r's microbatch k on stage s runs the work of its images over the work the
  // program prices, as the ranks of (s, r) recorded it; the most of its tensor-parallel ranks
  // (they run in lock step, and a colocated encoder's share of the samples differs between
  // them). With samples_in_step, also data_s: the samples each rank made, priced by
  // CostModel::data_seconds (the most of a replica's ranks). Throws
  // Error(invalid_argument) when `step` does not hold one entry per rank, or replicas of a
  // stage ran different numbers of microbatches.
  void apply(const StepSides& step, pipeline::Program& scaled);

  // Distinct microbatches priced so far (each a cost model and a program).
  std::size_t priced() const { return seconds_.size(); }

 private:
  // stage_seconds of a program built as the run's, by a cost model whose trained samples are
  // one microbatch of `samples`. Memoised by the sorted samples.
  const std::vector<StageSeconds>& seconds_on(std::vector<cost::TrainedSample> samples);
  // One stage's loads: per replica, per microbatch of `ran`, `part` of its price over `base`.
  std::vector<double> loads(int stage, double base, double StageSeconds::*part,
                            std::vector<std::vector<cost::TrainedSample>> RankSides::*ran, const StepSides& step);

  const cost::CostModel& cost_;
  const plan::Plan& plan_;
  const RankProgram& program_;
  bool samples_in_step_;
  std::vector<StageSeconds> base_;  // the program as it was priced
  std::map<std::vector<cost::TrainedSample>, std::vector<StageSeconds>> seconds_;
};

}  // namespace braid::train
