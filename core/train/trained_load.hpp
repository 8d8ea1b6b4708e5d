// The program's work on the batches a run trained. `braid train` prices its program at the
// trained images' mean (cost::TrainedImages): every microbatch of every replica as long as
// the average one. The step it runs is not: a microbatch of larger images takes longer, and
// where replicas or stages meet (a batch-sync, a DP reduction, the next pipeline stage) the
// slowest sets the pace, which a program of equal microbatches does not see. This prices each
// microbatch each rank ran on its own images, as StageProgram::work_scale, so the simulator
// replays the step the ranks trained.
#pragma once

#include <map>
#include <vector>

#include "core/pipeline/program.hpp"
#include "core/plan/plan.hpp"
#include "core/spec/run.hpp"
#include "core/train/rank_program.hpp"

namespace braid::train {

// Per rank, per microbatch of its stage, the image sides of the samples it ran
// (StepResult::microbatch_sides): one step as every rank saw it.
using StepSides = std::vector<std::vector<std::vector<int>>>;

class TrainedLoad {
 public:
  // `program` is the one the ranks ran, built by orchestrate::build_program from a cost model
  // of `run` (the trained images' mean) and `plan`; all three outlive this.
  TrainedLoad(const spec::RunSpec& run, const plan::Plan& plan, const RankProgram& program);

  // Every stage's StageProgram::work_scale for one step: replica r's microbatch k on stage s
  // runs the work of its images over the work the program prices, read from the rank that
  // runs (s, r, tensor-parallel rank 0). Throws Error(invalid_argument) when `step` does not
  // hold one entry per rank, or replicas of a stage ran different numbers of microbatches.
  std::vector<std::vector<double>> work_scales(const StepSides& step);

  // Distinct sets of image sides priced so far (each a cost model and a program).
  std::size_t priced() const { return seconds_.size(); }

 private:
  // Per stage, the compute of one forward and backward of its model chunks (tensor-parallel
  // collectives included) on a microbatch of `sides`: a program built as the run's was, by a
  // cost model whose trained images are that one microbatch. Memoised by the sorted sides.
  const std::vector<double>& stage_seconds(std::vector<int> sides);

  const spec::RunSpec& run_;
  const plan::Plan& plan_;
  const RankProgram& program_;
  std::vector<double> base_;  // stage_seconds of the program as it was priced
  std::map<std::vector<int>, std::vector<double>> seconds_;
};

// The model chunks' compute of each stage of `program` (as stage_seconds).
std::vector<double> model_seconds(const pipeline::Program& program);

}  // namespace braid::train
