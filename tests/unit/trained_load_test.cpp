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
#include "core/train/trainer.hpp"
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
  cost::CostModel cost{run, cost::TrainedSamples{cost::at_sides(repeat(mean_sides, 64))}};
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
      out[static_cast<std::size_t>(rank)].microbatches.assign(16,
                                                              cost::at_sides(place.replica == odd ? odd_sides : sides));
    }
    return out;
  }
  // The program with `step`'s loads.
  pipeline::Program scaled(TrainedLoad& load, const StepSides& step) const {
    pipeline::Program p = program.program;
    load.apply(step, p);
    return p;
  }
};

TEST(TrainedLoad, MicrobatchesLikeTheMeanScaleByOne) {
  Clip4 c;
  TrainedLoad load(c.cost, c.plan, c.program);
  const pipeline::Program p = c.scaled(load, c.step(Clip4::halves()));
  for (const auto& stage : p.stages) {
    ASSERT_EQ(stage.work_scale.size(), 2u * 16u);  // replicas x microbatches
    for (double s : stage.work_scale) EXPECT_NEAR(s, 1.0, 1e-12);
    EXPECT_TRUE(stage.task_scale.empty());  // no colocated encoder
  }
  EXPECT_EQ(load.priced(), 1u);  // one set of sides, priced once (the order within a microbatch does not count)
  const std::vector<int> halves = Clip4::halves();
  const std::vector<int> reversed(halves.rbegin(), halves.rend());
  c.scaled(load, c.step(reversed));
  EXPECT_EQ(load.priced(), 1u);
}

// One replica on the largest images: its microbatches cost what a program priced on them
// prices, and the replayed step waits for it at every batch-sync.
TEST(TrainedLoad, TheReplicaOnLargerImagesSetsThePace) {
  Clip4 c;
  TrainedLoad load(c.cost, c.plan, c.program);
  const std::vector<int> large(8, 32), small(8, 16);
  const pipeline::Program skewed = c.scaled(load, c.step(small, 1, large));
  const cost::CostModel at_large(c.run, cost::TrainedSamples{cost::at_sides(large)});
  const auto large_seconds = stage_seconds(at_large, c.plan, c.program.program.schedule);
  const auto mean_seconds = stage_seconds(c.cost, c.plan, c.program.program.schedule);
  for (std::size_t s = 0; s < skewed.stages.size(); ++s) {
    const auto& scale = skewed.stages[s].work_scale;
    EXPECT_LT(scale[0], 1.0);  // replica 0: small images
    EXPECT_NEAR(scale[16], large_seconds[s].model / mean_seconds[s].model, 1e-12);
    EXPECT_GT(scale[16], 1.0);
  }
  const pipeline::Program balanced = c.scaled(load, c.step(large));
  // Half the images smaller on one replica save nothing: the batch-sync waits for the other.
  EXPECT_NEAR(sim::simulate(skewed).step_time_s, sim::simulate(balanced).step_time_s,
              1e-3 * sim::simulate(balanced).step_time_s);
  EXPECT_GT(sim::simulate(skewed).step_time_s, sim::simulate(c.program.program).step_time_s);
}

// tiny-mllm-4px under Optimus on 2 ranks: the encoder on both, in the llm's pipeline bubbles.
// The encoder's tasks scale by their own microbatches' images, apart from the llm's.
TEST(TrainedLoad, AColocatedEncodersTasksScaleByTheirOwnImages) {
  const spec::RunSpec run = fit_cluster_to_world(test::load("tiny-mllm-4px.yaml"), 2);
  const cost::CostModel nominal(run);
  const plan::Plan plan =
      orchestrate::make_plan(nominal, plan::PlanRequest{plan::Strategy::optimus, {0, 2, 0, 1}, {}}).best;
  ASSERT_EQ(plan.layout, plan::Layout::colocated);
  std::vector<int> mean;  // llm microbatches of 4, encoder microbatches of 4 images
  for (int k = 0; k < 64; ++k) mean.push_back(k % 2 ? 32 : 16);
  const cost::CostModel cost(run, cost::TrainedSamples{cost::at_sides(mean)});
  const RankProgram program =
      rank_program(cost, plan, spec::Schedule::optimus_fine, runtime::build_groups(run.model, plan, 2), 0);
  TrainedLoad load(cost, plan, program);
  const std::vector<int> even{16, 32, 16, 32}, large(4, 32);
  StepSides step(2);
  for (auto& rank : step) {
    rank.microbatches.assign(4, cost::at_sides(even));
    rank.encoder_microbatches.assign(2, cost::at_sides(even));
  }
  step[1].encoder_microbatches[0] = cost::at_sides(large);  // stage 1's first encoder microbatch: the largest images
  pipeline::Program scaled = program.program;
  load.apply(step, scaled);
  const auto at_large =
      stage_seconds(cost::CostModel(run, {cost::at_sides(large)}), plan, spec::Schedule::optimus_fine);
  const auto priced = stage_seconds(cost, plan, spec::Schedule::optimus_fine);
  // The encoder's price is what its tasks of one microbatch run in the program, layer by layer.
  for (std::size_t s = 0; s < 2; ++s) {
    const auto& st = program.program.stages[s];
    double tasks = 0;
    for (const auto& i : st.instructions) {
      if (i.op != pipeline::Op::encoder_task || i.microbatch != 0) continue;
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      if (u.kind == pipeline::UnitKind::encoder_shard) continue;
      tasks += (i.flags & pipeline::kBackwardTask) ? u.backward_s + u.backward_tp_s : u.forward_s + u.forward_tp_s;
    }
    EXPECT_NEAR(priced[s].encoder, tasks, 1e-9 * tasks) << "stage " << s;
  }
  for (std::size_t s = 0; s < 2; ++s) {
    ASSERT_GT(priced[s].encoder, 0);
    for (double w : scaled.stages[s].work_scale) EXPECT_NEAR(w, 1.0, 1e-12);
    ASSERT_EQ(scaled.stages[s].task_scale.size(), 2u);
  }
  EXPECT_NEAR(scaled.stages[0].task_scale[1], 1.0, 1e-12);
  EXPECT_NEAR(scaled.stages[1].task_scale[0], at_large[1].encoder / priced[1].encoder, 1e-12);
  EXPECT_GT(scaled.stages[1].task_scale[0], 1.2);
  EXPECT_GT(sim::simulate(scaled).step_time_s, sim::simulate(program.program).step_time_s);
}

// Tensor-parallel ranks run in lock step: the replica's load is the most of theirs.
TEST(TrainedLoad, ATensorParallelReplicaRunsAtItsSlowestRanksLoad) {
  Clip4 c;
  const plan::Plan tp2 = c.fixed(plan::parse_plan_text(
      "strategy: megatron\nlayout: monolithic\ndevices: 4\nschedule: batch-sync\nmodules:\n"
      "  - {name: image_encoder, role: encoder, tp: 2, pp: 1, dp: 2, first_device: 0, devices: 4, microbatch_size: 8}\n"
      "  - {name: text_encoder, role: encoder, tp: 2, pp: 1, dp: 2, first_device: 0, devices: 4, microbatch_size: 8}\n",
      c.run));
  const RankProgram program = rank_program(c.cost, tp2, std::nullopt, runtime::build_groups(c.run.model, tp2, 4), 0);
  ASSERT_EQ(program.program.stages.size(), 1u);
  ASSERT_EQ(program.program.stages[0].devices_per_replica, 2);
  TrainedLoad load(c.cost, tp2, program);
  StepSides step(4);
  for (auto& rank : step) rank.microbatches.assign(8, cost::at_sides(Clip4::halves()));
  step[static_cast<std::size_t>(program.rank_of(0, 1, 1))].microbatches[3] = cost::at_sides(std::vector<int>(8, 32));
  pipeline::Program scaled = program.program;
  load.apply(step, scaled);
  const auto& w = scaled.stages[0].work_scale;
  ASSERT_EQ(w.size(), 16u);
  EXPECT_NEAR(w[8 + 2], 1.0, 1e-12);
  EXPECT_GT(w[8 + 3], 1.0);  // replica 1, microbatch 3: its TP rank 1 ran the largest images
  EXPECT_NEAR(w[3], 1.0, 1e-12);
}

TEST(TrainedLoad, SamplesMadeInTheStepDelayTheirRanks) {
  Clip4 c;
  c.run.cluster.data = {3e-6, 5e-9, 1e-6};  // as braid calibrate measures them
  const cost::CostModel cost{c.run, cost::TrainedSamples{cost::at_sides(Clip4::repeat(Clip4::halves(), 64))}};
  StepSides step = c.step(Clip4::halves());
  for (int rank = 0; rank < 4; ++rank) {  // the first stage renders its replica's 64, the second describes them
    RankSides& r = step[static_cast<std::size_t>(rank)];
    if (c.program.program.place_of(rank).stage == 0)
      r.rendered = Clip4::repeat(Clip4::halves(), 8);
    else
      r.described = 64;
  }
  step[static_cast<std::size_t>(c.program.rank_of(0, 1, 0))].rendered.push_back(32);  // one more on replica 1
  TrainedLoad worker_has_a_core(cost, c.plan, c.program), in_step(cost, c.plan, c.program, true);
  for (const auto& st : c.scaled(worker_has_a_core, step).stages) EXPECT_TRUE(st.data_s.empty());
  const pipeline::Program p = c.scaled(in_step, step);
  const double rendered = 64 * 3e-6 + 32 * 5e-9 * (256 + 1024);
  ASSERT_EQ(p.stages[0].data_s.size(), 2u);
  EXPECT_NEAR(p.stages[0].data_s[0], rendered, 1e-12);
  EXPECT_NEAR(p.stages[0].data_s[1], rendered + 3e-6 + 5e-9 * 1024, 1e-12);
  EXPECT_NEAR(p.stages[1].data_s[0], 64 * 1e-6, 1e-12);
  // The replay is slower by at least the time no rank of the batch-sync can start without.
  const double free = sim::simulate(c.scaled(worker_has_a_core, step)).step_time_s;
  EXPECT_GE(sim::simulate(p).step_time_s, free + rendered - 1e-9);
}

TEST(TrainedLoad, StepsOfAnotherWorldOrRaggedReplicasAreRefused) {
  Clip4 c;
  TrainedLoad load(c.cost, c.plan, c.program);
  StepSides three(
      3, RankSides{std::vector<std::vector<cost::TrainedSample>>(16, cost::at_sides(Clip4::halves())), {}, {}, 0});
  test::expect_error([&] { c.scaled(load, three); }, Status::invalid_argument, {"3 ranks", "world of 4"});
  StepSides ragged = c.step(Clip4::halves());
  ragged[static_cast<std::size_t>(c.program.rank_of(0, 1, 0))].microbatches.pop_back();
  test::expect_error([&] { c.scaled(load, ragged); }, Status::invalid_argument, {"its ranks ran 16 and 15"});
}

TEST(TrainedLoad, TheSimulatorRefusesLoadsThatAreNone) {
  Clip4 c;
  pipeline::Program p = c.program.program;
  p.stages[0].work_scale = {1, 1, 1};  // 2 replicas
  test::expect_error([&] { sim::simulate(p); }, Status::invalid_argument, {"work_scale holds 3 loads", "2 replicas"});
  p.stages[0].work_scale.clear();
  p.stages[1].task_scale = {1, -1};
  test::expect_error([&] { sim::simulate(p); }, Status::invalid_argument, {"a task_scale is not a load"});
}

}  // namespace
}  // namespace braid::train
