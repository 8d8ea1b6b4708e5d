// The simulator's replay of the step a run trained (core/train/trained_load.hpp): each rank's
// microbatches priced on their own images, against the program priced on their mean.
#include "core/train/trained_load.hpp"

#include <gtest/gtest.h>

#include "core/cost/cost_model.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/plan/plan_io.hpp"
#include "core/runtime/groups.hpp"
#include "core/sim/simulator.hpp"
#include "tests/unit/support.hpp"

namespace braid::train {
namespace {

// tiny-clip, both towers in 2 pipeline stages of 2 replicas (4 ranks), microbatches of 8
// images of 16 or 32 px, 4 contrastive groups of 32 (as bench/runtime_bench's clip-4).
struct Clip4 {
  spec::RunSpec run = test::parse(
      "model: ../models/tiny-clip.yaml\ncluster: ../clusters/cpu-host.yaml\nnodes: 1\n"
      "training: {global_batch: 128, microbatch: 8, contrastive_batch: 32, precision: fp32}\n"
      "data: {seed: 1, image: {resolution: 32, distribution: {kind: histogram, values: [16, 32], "
      "weights: [1, 1]}}, text: {tokens: 12}}\n");
  plan::Plan plan = fixed(plan::parse_plan_text(
      "strategy: megatron\nlayout: monolithic\ndevices: 4\nschedule: batch-sync\nmodules:\n"
      "  - {name: image_encoder, role: encoder, tp: 1, pp: 2, dp: 2, first_device: 0, devices: 4, first_stage: 0,\n"
      "     microbatch_size: 8, layers_per_stage: [1, 1]}\n"
      "  - {name: text_encoder, role: encoder, tp: 1, pp: 2, dp: 2, first_device: 0, devices: 4, first_stage: 0,\n"
      "     microbatch_size: 8, layers_per_stage: [1, 1]}\n",
      run));
  // Priced as the trainer prices: every microbatch half 16 px, half 32 px.
  std::vector<int> mean_sides = halves();
  cost::CostModel cost{run, cost::TrainedImages{repeat(mean_sides, 64)}};
  RankProgram program = rank_program(cost, plan, std::nullopt, runtime::build_groups(run.model, plan, 4), 0);

  plan::Plan fixed(const plan::Plan& parsed) const {
    const cost::CostModel nominal(run);
    return orchestrate::make_plan(nominal, plan::PlanRequest{plan::Strategy::fixed, {}, parsed}).best;
  }
  static std::vector<int> halves() {
    std::vector<int> s(4, 16);
    s.insert(s.end(), 4, 32);
    return s;
  }
  static std::vector<int> repeat(const std::vector<int>& s, int n) {
    std::vector<int> out;
    for (int k = 0; k < n; ++k) out.insert(out.end(), s.begin(), s.end());
    return out;
  }
  // One step where every rank ran `slots` microbatches of `sides`, and replica `odd` (if any)
  // of `odd_sides` instead.
  StepSides step(const std::vector<int>& sides, int odd = -1, const std::vector<int>& odd_sides = {}) const {
    StepSides out(4);
    for (int rank = 0; rank < 4; ++rank) {
      const auto place = program.program.place_of(rank);
      out[static_cast<std::size_t>(rank)].assign(16, place.replica == odd ? odd_sides : sides);
    }
    return out;
  }
};

TEST(TrainedLoad, MicrobatchesLikeTheMeanScaleByOne) {
  Clip4 c;
  TrainedLoad load(c.run, c.plan, c.program);
  const auto scales = load.work_scales(c.step(Clip4::halves()));
  ASSERT_EQ(scales.size(), c.program.program.stages.size());
  for (const auto& stage : scales) {
    ASSERT_EQ(stage.size(), 2u * 16u);  // replicas x microbatches
    for (double s : stage) EXPECT_NEAR(s, 1.0, 1e-12);
  }
  EXPECT_EQ(load.priced(), 1u);  // one set of sides, priced once (the order within a microbatch does not count)
  const std::vector<int> halves = Clip4::halves();
  const std::vector<int> reversed(halves.rbegin(), halves.rend());
  load.work_scales(c.step(reversed));
  EXPECT_EQ(load.priced(), 1u);
}

// One replica on the largest images: its microbatches cost what a program priced on them
// prices, and the replayed step waits for it at every batch-sync.
TEST(TrainedLoad, TheReplicaOnLargerImagesSetsThePace) {
  Clip4 c;
  TrainedLoad load(c.run, c.plan, c.program);
  const std::vector<int> large(8, 32), small(8, 16);
  const auto scales = load.work_scales(c.step(small, 1, large));
  const cost::CostModel at_large(c.run, cost::TrainedImages{large});
  const auto large_seconds = model_seconds(orchestrate::build_program(at_large, c.plan));
  const auto mean_seconds = model_seconds(c.program.program);
  for (std::size_t s = 0; s < scales.size(); ++s) {
    EXPECT_LT(scales[s][0], 1.0);  // replica 0: small images
    EXPECT_NEAR(scales[s][16], large_seconds[s] / mean_seconds[s], 1e-12);
    EXPECT_GT(scales[s][16], 1.0);
  }
  pipeline::Program balanced = c.program.program, skewed = c.program.program;
  const auto even = load.work_scales(c.step(large));
  for (std::size_t s = 0; s < scales.size(); ++s) {
    balanced.stages[s].work_scale = even[s];
    skewed.stages[s].work_scale = scales[s];
  }
  // Half the images smaller on one replica save nothing: the batch-sync waits for the other.
  EXPECT_NEAR(sim::simulate(skewed).step_time_s, sim::simulate(balanced).step_time_s,
              1e-3 * sim::simulate(balanced).step_time_s);
  EXPECT_GT(sim::simulate(skewed).step_time_s, sim::simulate(c.program.program).step_time_s);
}

TEST(TrainedLoad, StepsOfAnotherWorldOrRaggedReplicasAreRefused) {
  Clip4 c;
  TrainedLoad load(c.run, c.plan, c.program);
  StepSides three(3, std::vector<std::vector<int>>(16, Clip4::halves()));
  test::expect_error([&] { load.work_scales(three); }, Status::invalid_argument, {"3 ranks", "world of 4"});
  StepSides ragged = c.step(Clip4::halves());
  ragged[static_cast<std::size_t>(c.program.rank_of(0, 1, 0))].pop_back();
  test::expect_error([&] { load.work_scales(ragged); }, Status::invalid_argument, {"replicas ran 16 and 15"});
}

}  // namespace
}  // namespace braid::train
