// Programs built from real plans: every bundled run, strategy and schedule builds,
// validates and simulates; the simulation agrees with the planner's closed form.
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/pipeline/from_plan.hpp"
#include "core/plan/plan_io.hpp"
#include "core/sim/simulator.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using plan::Strategy;

TEST(Simulate, EveryBundledPlanRunsEverySchedule) {
  for (const char* name : {"clip-vit-l14-64gpu.yaml", "llava-13b-256gpu.yaml", "mllm-72b-1024gpu.yaml",
                           "vit22b-gpt175b-1536gpu.yaml", "gpt-175b-1024gpu.yaml"}) {
    auto run = test::load(name);
    cost::CostModel cost(run);
    for (Strategy s : {Strategy::megatron, Strategy::distmm, Strategy::disttrain, Strategy::optimus}) {
      if (!plan::strategy_applies(run.model, s, nullptr)) continue;
      auto result = orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}});
      const auto& chosen = result.best;
      auto schedules = orchestrate::schedules_for(cost, chosen);
      for (const auto& schedule : schedules) {
        SCOPED_TRACE(std::string(name) + " " + plan::strategy_name(s) + " " + spec::schedule_name(schedule));
        auto program = orchestrate::build_program(cost, chosen, schedule);
        EXPECT_EQ(program.schedule, schedule);
        EXPECT_EQ(program.devices, chosen.devices);
        auto r = sim::simulate(program);
        EXPECT_GT(r.step_time_s, 0);
        EXPECT_GE(r.bubble_fraction, 0);
        EXPECT_LT(r.bubble_fraction, 1);
        for (double b : r.bubbles) EXPECT_GE(b, -1e-12);
        // The busy share and the idle seconds account for the whole step.
        double idle = 0;
        for (double b : r.bubbles) idle += b;
        EXPECT_NEAR(idle / r.step_time_s, r.bubble_fraction, 1e-6);
        if (schedule == schedules.front()) {
          // The plan's own schedule: the closed form the planner scored it with agrees.
          EXPECT_NEAR(r.step_time_s / chosen.estimate.iteration_time_s, 1.0, 0.02);
          EXPECT_NEAR(r.mfu / chosen.estimate.mfu, 1.0, 0.02);
          // One busy time (work and the optimizer step) in both: the idle shares differ only as
          // the steps do. (The plan's left out the optimizer; optimus' rescaled it upside down.)
          EXPECT_NEAR((1 - r.bubble_fraction) * r.step_time_s,
                      (1 - chosen.estimate.bubble_fraction) * chosen.estimate.iteration_time_s, 1e-3 * r.step_time_s);
        }
      }
    }
  }
}

TEST(Simulate, UnsupportedScheduleIsRefused) {
  auto run = test::load("llava-13b-256gpu.yaml");
  cost::CostModel cost(run);
  auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::disttrain, {}, {}});
  const std::string refused = "a chain plan of this model runs 1f1b or gpipe, not 'batch-sync'";
  test::expect_error([&] { pipeline::build_program(cost, result.best, spec::Schedule::batch_sync); },
                     Status::unsupported, {refused});
  // Names are parsed where they enter: a known schedule the plan does not run is unsupported...
  test::expect_error([&] { orchestrate::parse_schedule_for(cost, result.best, "batch-sync"); }, Status::unsupported,
                     {refused});
  // ...a name that is no schedule an invalid argument, with the closest name.
  test::expect_error([&] { orchestrate::parse_schedule_for(cost, result.best, "zigzag"); }, Status::invalid_argument,
                     {"unknown schedule 'zigzag'", "braid's schedules are 1f1b, interleaved"});
  test::expect_error([&] { orchestrate::parse_schedule_for(cost, result.best, "gpipee"); }, Status::invalid_argument,
                     {"unknown schedule 'gpipee' (did you mean 'gpipe'?)"});
  EXPECT_EQ(orchestrate::parse_schedule_for(cost, result.best, "gpipe"), spec::Schedule::gpipe);
  EXPECT_EQ(orchestrate::parse_schedule_for(cost, result.best, ""), std::nullopt);
}

TEST(Simulate, ColocatedProgramsComeFromTheBubbleScheduler) {
  auto run = test::load("llava-13b-256gpu.yaml");
  cost::CostModel cost(run);
  auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::optimus, {}, {}});
  ASSERT_EQ(result.best.layout, plan::Layout::colocated);
  test::expect_error([&] { pipeline::build_program(cost, result.best); }, Status::internal,
                     {"colocated plan", "bubble scheduler"});
  EXPECT_EQ(orchestrate::build_program(cost, result.best).schedule, spec::Schedule::optimus_fine);
  test::expect_error([&] { orchestrate::build_program(cost, result.best, spec::Schedule::one_f_one_b); },
                     Status::unsupported,
                     {"a colocated plan of this model runs optimus-fine, optimus-coarse, encoder-first or "
                      "optimus-online, not '1f1b'"});
}

TEST(Simulate, DisaggregatedPipelinesShowTheirWarmUpAndCoolDown) {
  auto run = test::load("vit22b-gpt175b-3072gpu.yaml");
  cost::CostModel cost(run);
  auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::disttrain, {}, {}});
  auto program = orchestrate::build_program(cost, result.best);
  auto r = sim::simulate(program);
  EXPECT_GT(r.bubbles[static_cast<int>(sim::Cause::pp_warmup)], 0);
  EXPECT_GT(r.bubbles[static_cast<int>(sim::Cause::pp_cooldown)], 0);
  EXPECT_GT(r.bubbles[static_cast<int>(sim::Cause::tp)], 0);
  // The first stage of the chain (an encoder stage) starts at once; the llm's last stage waits.
  const auto& first = r.stages.front();
  const auto& last_llm = *std::find_if(r.stages.rbegin(), r.stages.rend(),
                                       [](const sim::StageStats& s) { return s.name.rfind("gpt", 0) == 0; });
  EXPECT_EQ(first.bubbles[static_cast<int>(sim::Cause::pp_warmup)], 0);
  EXPECT_GT(last_llm.bubbles[static_cast<int>(sim::Cause::pp_warmup)], 0);
}

// CLIP ViT-L/14 on 2 DGX A100 nodes, 4 contrastive groups of 1024 per step; its towers as
// branches: the image tower in 2 stages of 4 replicas (devices 0-7), the text tower in 8
// replicas (devices 8-15).
spec::RunSpec clip_on_two_nodes() {
  return test::parse(
      "model: ../models/clip-vit-l14.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\nnodes: 2\n"
      "training: {global_batch: 4096, contrastive_batch: 1024, microbatch: 32, recompute: full}\n"
      "data: {image: {resolution: 224}, text: {tokens: 77}}\n");
}
const std::string kClipImageBranch =
    "  - {name: image_encoder, tp: 1, pp: 2, dp: 4, first_device: 0, microbatch_size: 32}\n";
const std::string kClipTextBranch =
    "  - {name: text_encoder, tp: 1, pp: 1, dp: 8, first_device: 8, microbatch_size: 32}\n";

TEST(Simulate, DistmmPipeBeatsPlainBatchSyncOnARealClipPlan) {
  // Four contrastive groups per step, two image stages: DistMM-Pipe overlaps the groups.
  auto run = clip_on_two_nodes();
  cost::CostModel cost(run);
  auto fixed = plan::parse_plan_text("layout: branches\nmodules:\n" + kClipImageBranch + kClipTextBranch, run);
  auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::fixed, {}, fixed});
  auto plain = sim::simulate(orchestrate::build_program(cost, result.best, spec::Schedule::batch_sync));
  auto pipe = sim::simulate(orchestrate::build_program(cost, result.best, spec::Schedule::distmm_pipe));
  auto two = sim::simulate(orchestrate::build_program(cost, result.best, spec::Schedule::two_phase));
  EXPECT_LT(pipe.step_time_s, plain.step_time_s);
  EXPECT_LT(two.peak_memory_gib, plain.peak_memory_gib);
  EXPECT_GT(plain.bubbles[static_cast<int>(sim::Cause::batch_sync)], 0);
}

TEST(Simulate, TheBatchSyncIsPricedAsTheTrainerRunsIt) {
  // The towers' last stages (image devices 4-7, text 8-15) gather records of both towers'
  // rows, each padded to a quarter of the batch (the image tower's 4 replicas hold the most);
  // the image replicas each compute the loss on their quarter; the gradients of all rows are
  // all-reduced. Listing the text tower first changes nothing: the image tower computes the
  // loss either way.
  auto run = clip_on_two_nodes();
  cost::CostModel cost(run);
  const double R = 1024, dim = run.model.modules[0].embed_dim;
  ASSERT_EQ(run.model.modules[1].embed_dim, dim);
  const cost::GroupShape last_stages{12, 4, 2};                          // 4 on node 0 drive its ports
  const double record = 2 * (R / 4) * (dim * cost.element_bytes() + 8);  // rows and their sample ids
  const cost::BlockCost loss = cost::contrastive_loss_op(R / 4, R, dim, cost.kernel_context());
  const double expected = cost.comm().all_gather(12 * record, last_stages) + loss.forward_s + loss.backward_s +
                          cost.comm().all_reduce(2 * R * dim * cost.element_bytes(), last_stages);
  for (const std::string& modules : {kClipImageBranch + kClipTextBranch, kClipTextBranch + kClipImageBranch}) {
    SCOPED_TRACE(modules);
    auto fixed = plan::parse_plan_text("layout: branches\nmodules:\n" + modules, run);
    auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::fixed, {}, fixed});
    EXPECT_NEAR(result.best.estimate.sync_s, 4 * expected, 1e-12);  // 4 contrastive groups
    auto program = orchestrate::build_program(cost, result.best, spec::Schedule::batch_sync);
    EXPECT_NEAR(program.batch_sync_s, expected, 1e-12);
  }
  // The image tower in 8 replicas (devices 0-7), the text tower in 2 stages of 4 (8-15): the
  // records are padded to a quarter of the batch (the text replicas hold the most), while
  // each image replica computes the loss on an eighth.
  auto wide_image = plan::parse_plan_text(
      "layout: branches\nmodules:\n"
      "  - {name: image_encoder, tp: 1, pp: 1, dp: 8, first_device: 0, microbatch_size: 32}\n"
      "  - {name: text_encoder, tp: 1, pp: 2, dp: 4, first_device: 8, microbatch_size: 32}\n",
      run);
  const cost::GroupShape image_and_text_last{12, 4, 2};
  const cost::BlockCost eighth = cost::contrastive_loss_op(R / 8, R, dim, cost.kernel_context());
  const double wide_sync = cost.comm().all_gather(12 * record, image_and_text_last) + eighth.forward_s +
                           eighth.backward_s +
                           cost.comm().all_reduce(2 * R * dim * cost.element_bytes(), image_and_text_last);
  EXPECT_NEAR(orchestrate::build_program(
                  cost, orchestrate::make_plan(cost, plan::PlanRequest{Strategy::fixed, {}, wide_image}).best,
                  spec::Schedule::batch_sync)
                  .batch_sync_s,
              wide_sync, 1e-12);
  // Both towers on one grid of tp 2 x dp 8: the batch-sync of a TP index joins its 8 replicas
  // (every second device, 4 on each node), each with an eighth of the rows of both towers.
  auto grid = plan::parse_plan_text(
      "layout: monolithic\nmodules:\n  - {name: image_encoder, tp: 2, pp: 1, dp: 8}\n"
      "  - {name: text_encoder, tp: 2, pp: 1, dp: 8}\n",
      run);
  auto result = orchestrate::make_plan(cost, plan::PlanRequest{Strategy::fixed, {}, grid});
  const cost::GroupShape replicas{8, 4, 2};
  const double grid_sync = cost.comm().all_gather(8 * 2 * (R / 8) * (dim * cost.element_bytes() + 8), replicas) +
                           eighth.forward_s + eighth.backward_s +
                           cost.comm().all_reduce(2 * R * dim * cost.element_bytes(), replicas);
  EXPECT_NEAR(result.best.estimate.sync_s, 4 * grid_sync, 1e-12);
  EXPECT_NEAR(orchestrate::build_program(cost, result.best, spec::Schedule::batch_sync).batch_sync_s, grid_sync, 1e-12);
}

TEST(Simulate, PlansTheSimulatorCannotRunAreRejectedByTheEvaluator) {
  // Review regressions: the evaluator accepted these, and then simulation failed.
  auto run = test::parse(
      "model: ../models/llava-13b.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\nnodes: 4\n"
      "training: {global_batch: 1152, microbatch: 3, recompute: full}\n"
      "data: {image: {resolution: 336}, text: {tokens: 1472}}\n");
  cost::CostModel cost(run);
  auto uneven = plan::parse_plan_text(
      "layout: chain\nmodules:\n"
      "  - {name: vision, tp: 1, pp: 1, dp: 3, first_device: 8, microbatch_size: 8}\n"
      "  - {name: projector, tp: 1, pp: 1, dp: 3, first_device: 8, microbatch_size: 8}\n"
      "  - {name: llm, tp: 1, pp: 1, dp: 8, first_device: 0, microbatch_size: 3}\n",
      run);
  test::expect_error(
      [&] {
        orchestrate::make_plan(cost, plan::PlanRequest{Strategy::fixed, {}, uneven});
      },
      Status::bad_config, {"vision: dp 3 and the llm's dp 8 must divide one another"});
  auto demo = test::load("pipeline-demo.yaml");
  cost::CostModel demo_cost(demo);
  auto one_stage = plan::parse_plan_text(
      "layout: monolithic\nvirtual_stages: 2\nmodules:\n  - {name: gpt, tp: 8, pp: 1, dp: 1}\n", demo);
  test::expect_error(
      [&] {
        orchestrate::make_plan(demo_cost, plan::PlanRequest{Strategy::fixed, {}, one_stage});
      },
      Status::bad_config, {"the interleaved schedule needs at least two pipeline stages"});
}

// A recomputed layer's backward holds what its recomputation re-created beside every
// microbatch kept: the planner's peak memory and the simulated one count it alike.
TEST(Simulate, RecomputedLayersAreHeldInPlanAndSimulationAlike) {
  for (const char* file : {"pipeline-demo.yaml", "llava-13b-256gpu.yaml", "vit22b-gpt175b-1536gpu.yaml"}) {
    for (const char* recompute : {"full", "selective", "none"}) {
      spec::RunSpec run = test::load(file);
      run.training.recompute = std::string(recompute) == "full"        ? spec::Recompute::full
                               : std::string(recompute) == "selective" ? spec::Recompute::selective
                                                                       : spec::Recompute::none;
      run.training.attention = spec::Attention::standard;  // whose selective recomputation re-creates the scores
      cost::CostModel cost(run);
      for (Strategy s : {Strategy::megatron, Strategy::disttrain, Strategy::optimus}) {
        if (!plan::strategy_applies(run.model, s, nullptr)) continue;
        SCOPED_TRACE(std::string(file) + " recompute " + recompute + " " + plan::strategy_name(s));
        const auto result = orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}});
        const auto r = sim::simulate(orchestrate::build_program(cost, result.best));
        EXPECT_NEAR(r.peak_memory_gib, result.best.estimate.peak_memory_gib, 1e-9 * r.peak_memory_gib);
      }
    }
  }
}

TEST(Simulate, ZeroStateHeldInsideAnInstructionIsInPlanAndSimulationAlike) {
  // ZeRO-2/3's whole gradients and gathered weights (StageLoad::peak_state) and braid's DP
  // collective buffers, inside an instruction and after the last backward, reach the program's
  // memory as the plan's peak counts them, under both kernels' rules.
  for (const char* file : {"pipeline-demo.yaml", "llava-13b-256gpu.yaml", "vit22b-gpt175b-1536gpu.yaml"}) {
    for (int zero : {0, 1, 2, 3}) {
      if (zero == 0 && std::string(file).starts_with("vit22b")) continue;  // fits only sharded
      for (const auto kernels : {cost::Kernels::megatron, cost::Kernels::reference}) {
        spec::RunSpec run = test::load(file);
        run.training.zero_stage = zero;
        cost::CostModel cost(run, {}, kernels);
        for (Strategy s : {Strategy::megatron, Strategy::disttrain, Strategy::optimus}) {
          if (!plan::strategy_applies(run.model, s, nullptr)) continue;
          SCOPED_TRACE(std::string(file) + " zero " + std::to_string(zero) + " " + plan::strategy_name(s) +
                       (kernels == cost::Kernels::reference ? " reference" : " megatron"));
          const auto result = orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}});
          const auto r = sim::simulate(orchestrate::build_program(cost, result.best));
          EXPECT_NEAR(r.peak_memory_gib, result.best.estimate.peak_memory_gib, 1e-9 * r.peak_memory_gib);
        }
      }
    }
  }
}

TEST(Simulate, TheStepsEndHoldsTheCollectiveBuffersWithoutActivations) {
  // tiny-mllm data parallel on 2 devices, one sample a microbatch: under braid's kernels
  // ZeRO-1's copy and shard of one block after the last backward hold more than the
  // activations inside one; plan and simulation both take that phase's peak. (Without ZeRO
  // the all-reduce sums in place: no buffer.)
  auto run = test::load("tiny-mllm.yaml");
  run.training.precision = spec::Precision::fp32;
  run.training.microbatch = 1;
  run.cluster.devices_per_node = 2;
  run.training.zero_stage = 1;
  const cost::CostModel cost(run, {}, cost::Kernels::reference);
  plan::PlanRequest request;
  request.strategy = Strategy::megatron;
  request.constraints = {.tp = 1, .pp = 1, .dp = 2};
  const plan::Plan p = orchestrate::make_plan(cost, request).best;
  const plan::MemoryBreakdown& m = p.estimate.memory;
  ASSERT_GT(m.step_end_buffers, m.activations + m.buffers);
  EXPECT_NEAR(p.estimate.peak_memory_gib * (1 << 30), m.state() + m.step_end_buffers, 1e-3);
  const auto r = sim::simulate(orchestrate::build_program(cost, p));
  EXPECT_NEAR(r.peak_memory_gib, p.estimate.peak_memory_gib, 1e-9 * r.peak_memory_gib);
}

TEST(Simulate, OverlappedGradientReductionIsSimulatedAsEstimated) {
  auto run = test::parse(
      "model: ../models/llava-13b.yaml\ncluster: ../clusters/dgx-a100-80gb.yaml\nnodes: 4\n"
      "training: {global_batch: 64, microbatch: 1, recompute: selective, overlap_grad_reduce: true}\n"
      "data: {image: {resolution: 336}, text: {tokens: 1472}}\n");
  cost::CostModel cost(run);
  for (Strategy s : {Strategy::megatron, Strategy::disttrain, Strategy::optimus}) {
    auto result = orchestrate::make_plan(cost, plan::PlanRequest{s, {}, {}});
    auto r = sim::simulate(orchestrate::build_program(cost, result.best));
    EXPECT_NEAR(r.step_time_s / result.best.estimate.iteration_time_s, 1.0, 0.02) << plan::strategy_name(s);
  }
}

}  // namespace
}  // namespace braid
