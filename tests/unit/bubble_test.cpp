// The Optimus bubble scheduler: kernels that add up, schedules that pass the
// checker and never lose to the passes before them, and a checker that rejects
// hand-broken schedules, one constraint at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "core/bubble/checker.hpp"
#include "core/bubble/emit.hpp"
#include "core/bubble/encoder_tasks.hpp"
#include "core/bubble/scheduler.hpp"
#include "core/orchestrate/planning.hpp"
#include "core/orchestrate/program.hpp"
#include "core/pipeline/from_plan.hpp"
#include "core/plan/evaluate.hpp"
#include "core/plan/plan_io.hpp"
#include "core/plan/stage_load.hpp"
#include "core/sim/simulator.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using pipeline::Instruction;
using pipeline::Op;
using pipeline::Program;

struct Case {
  std::unique_ptr<spec::RunSpec> run;  // the cost model keeps a pointer to it: a stable address
  std::unique_ptr<cost::CostModel> cost;
  plan::Plan plan;
};

// The optimus plan of a bundled run, with the encoder grid replaced when asked.
// `zero_stage` >= 0 replaces the run's.
Case optimus_case(const std::string& run_file, int enc_tp = 0, int enc_pp = 0, int zero_stage = -1) {
  Case c;
  c.run = std::make_unique<spec::RunSpec>(test::load(run_file));
  if (zero_stage >= 0) c.run->training.zero_stage = zero_stage;
  c.cost = std::make_unique<cost::CostModel>(*c.run);
  plan::PlanRequest req;
  req.strategy = plan::Strategy::optimus;
  c.plan = orchestrate::make_plan(*c.cost, req).best;
  if (enc_tp > 0) {
    for (auto& m : c.plan.modules) {
      if (m.role != spec::Role::encoder) continue;
      const int layers = c.run->model.modules[static_cast<std::size_t>(m.module)].layers;
      m.tp = enc_tp;
      m.pp = enc_pp;
      m.dp = m.devices / (enc_tp * enc_pp);
      m.layers_per_stage.assign(static_cast<std::size_t>(enc_pp), layers / enc_pp);
    }
  }
  return c;
}

std::size_t find_op(const pipeline::StageProgram& st, const std::function<bool(const Instruction&)>& want) {
  for (std::size_t pc = 0; pc < st.instructions.size(); ++pc)
    if (want(st.instructions[pc])) return pc;
  ADD_FAILURE() << "no such instruction on " << st.name;
  return 0;
}

void erase_at(Program& p, int s, std::size_t pc) {
  auto& ins = p.stages[static_cast<std::size_t>(s)].instructions;
  ins.erase(ins.begin() + static_cast<long>(pc));
}

TEST(Bubble, LayerKernelsAddUpToTheLayer) {
  const auto run = test::load("vit22b-gpt175b-3072gpu.yaml");
  const cost::CostModel cost(run);
  for (int tp : {1, 2, 8}) {
    const int vit = run.model.index_of("vit");
    const auto& layer = cost.module(vit, tp, 2).layer;
    double f = 0, b = 0, comm = 0;
    for (const auto& k : cost.layer_kernels(vit, tp, 2)) {
      f += k.cost.forward_s + k.cost.comm_forward_s;
      b += k.cost.backward_s + k.cost.recompute_s + k.cost.comm_backward_s;
      comm += k.communication ? k.cost.comm_forward_s : 0;
    }
    EXPECT_NEAR(f, layer.forward_time(), 1e-12 * f) << tp;
    EXPECT_NEAR(b, layer.backward_time(), 1e-12 * b) << tp;
    EXPECT_NEAR(comm, layer.comm_forward_s, 1e-15) << tp;
  }
}

TEST(Bubble, EveryScheduleOfTheBundledRunsPassesTheChecker) {
  for (const char* run : {"vit22b-gpt175b-1536gpu.yaml", "mllm-72b-1024gpu.yaml", "llava-13b-256gpu.yaml"}) {
    SCOPED_TRACE(run);
    auto c = optimus_case(run);
    const auto s = bubble::schedule(*c.cost, c.plan);
    for (auto schedule : bubble::colocated_schedules()) {
      SCOPED_TRACE(spec::schedule_name(schedule));
      EXPECT_NO_THROW(bubble::check(s.layout, bubble::program_named(s, schedule)));
    }
    EXPECT_LE(s.report.coarse_step_s, s.report.plain_step_s * (1 + 1e-12));
    EXPECT_LE(s.report.fine_step_s, s.report.coarse_step_s * (1 + 1e-12));
    EXPECT_GE(s.report.recovered_fine, s.report.recovered_coarse - 1e-12);
    EXPECT_NEAR(sim::simulate(s.fine).step_time_s, s.report.fine_step_s, 1e-9 * s.report.fine_step_s);
  }
}

// The fine pass cuts an llm instruction's exposed TP time into one wait per collective it
// runs, as the cost model counts them: under sequence parallelism a layer's forward
// all-gathers and reduce-scatters twice, its backward gathers again (Megatron: 6 waits).
TEST(Bubble, AnLlmInstructionWaitsOnceForEachCollectiveOfItsLayers) {
  auto c = optimus_case("vit22b-gpt175b-1536gpu.yaml");
  ASSERT_TRUE(c.run->training.sequence_parallel);
  const auto s = bubble::schedule(*c.cost, c.plan);
  const plan::ModulePlacement* llm = nullptr;
  for (const auto& m : c.plan.modules)
    if (m.role == spec::Role::llm) llm = &m;
  ASSERT_NE(llm, nullptr);
  ASSERT_EQ(llm->tp, 8);
  ASSERT_GE(llm->pp, 3);  // stages with neither the embedding nor the head
  double forward = 0, backward = 0;
  for (const auto& k : c.cost->layer_kernels(llm->module, llm->tp, llm->microbatch_size)) {
    forward += k.cost.collectives_forward;
    backward += k.cost.collectives_backward;
  }
  EXPECT_EQ(forward, 4);
  EXPECT_EQ(backward, 6);
  int checked = 0;
  for (const auto& st : s.fine.stages) {
    if (st.depth == 0 || st.depth + 1 == llm->pp) continue;  // the embedding's and the head's own
    const int layers = llm->layers_per_stage[static_cast<std::size_t>(st.depth)];
    for (const auto& u : st.units) {
      if (u.kind != pipeline::UnitKind::model) continue;
      EXPECT_EQ(u.forward_tp_collectives, layers * forward) << st.name;
      EXPECT_EQ(u.backward_tp_collectives, layers * backward) << st.name;
      ++checked;
    }
  }
  EXPECT_EQ(checked, llm->pp - 2);
}

// braid's trainer runs a colocated encoder kernel by kernel on whole sequences, with or
// without sequence_parallel: priced for it (Kernels::reference), its tasks do not change
// with the setting, while the llm's collectives do. Megatron splits the encoder's too.
TEST(Bubble, AColocatedEncoderIsPricedOnWholeSequencesAsBraidsTrainerRunsIt) {
  auto units = [](bool sequence_parallel, cost::Kernels kernels) {
    spec::RunSpec run = test::load("tiny-mllm.yaml");
    run.training.sequence_parallel = sequence_parallel;
    const cost::CostModel cost(run, {}, kernels);
    EXPECT_EQ(&cost.colocated_encoder_model() == &cost, !sequence_parallel || kernels == cost::Kernels::megatron);
    plan::Plan plan = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::optimus, {2, 2, 0}, {}}).best;
    for (auto& m : plan.modules) {
      if (m.role != spec::Role::encoder) continue;
      m.tp = 2;
      m.pp = 1;
      m.dp = m.devices / 2;
      m.layers_per_stage.assign(1, run.model.modules[static_cast<std::size_t>(m.module)].layers);
    }
    std::vector<pipeline::WorkUnit> out;
    for (const auto& st : bubble::schedule(cost, plan).fine.stages)
      out.insert(out.end(), st.units.begin(), st.units.end());
    return out;
  };
  auto same = [](const pipeline::WorkUnit& a, const pipeline::WorkUnit& b) {
    return a.forward_s == b.forward_s && a.backward_s == b.backward_s && a.forward_tp_s == b.forward_tp_s &&
           a.backward_tp_s == b.backward_tp_s && a.activation_bytes == b.activation_bytes;
  };
  for (auto kernels : {cost::Kernels::reference, cost::Kernels::megatron}) {
    SCOPED_TRACE(kernels == cost::Kernels::reference ? "braid's trainer" : "megatron");
    const auto split = units(true, kernels), whole = units(false, kernels);
    ASSERT_EQ(split.size(), whole.size());
    int encoder_differ = 0, encoder_units = 0, llm_gained = 0;
    for (std::size_t u = 0; u < split.size(); ++u) {
      if (split[u].kind == pipeline::UnitKind::model) {
        llm_gained += split[u].forward_tp_collectives > whole[u].forward_tp_collectives;
        continue;
      }
      ++encoder_units;
      encoder_differ += !same(split[u], whole[u]);
    }
    EXPECT_GT(encoder_units, 0);
    EXPECT_GT(llm_gained, 0);  // the llm's layers all-gather and reduce-scatter
    if (kernels == cost::Kernels::reference)
      EXPECT_EQ(encoder_differ, 0);
    else
      EXPECT_GT(encoder_differ, 0);
  }
}

// Enough encoder work in short microbatches (ViT-22B on 2 stages at TP 8), and no
// parameter all-gather to hide the forwards behind (ZeRO 0): both passes find real bubble
// time, the fine one more, partly inside TP waits.
TEST(Bubble, FinePassRecoversAtLeastAsMuchAsCoarseAndBothBeatEncoderFirst) {
  auto c = optimus_case("vit22b-gpt175b-1536gpu.yaml", 8, 2, 0);
  const auto s = bubble::schedule(*c.cost, c.plan);
  const auto& r = s.report;
  EXPECT_LT(r.coarse_step_s, r.plain_step_s);
  EXPECT_LT(r.fine_step_s, r.coarse_step_s);
  EXPECT_GT(r.recovered_coarse, 0);
  EXPECT_GE(r.recovered_fine, r.recovered_coarse);
  EXPECT_GT(r.tp_bubble_tasks, 0);
  for (auto schedule : bubble::colocated_schedules())
    EXPECT_NO_THROW(bubble::check(s.layout, bubble::program_named(s, schedule)));
  // Each task inside a TP wait fits one collective's share of its host's direction (under
  // sequence parallelism a forward waits 4 times a layer, a backward 6).
  int fitted = 0;
  for (const auto& st : s.fine.stages) {
    const Instruction* host = nullptr;
    for (const auto& i : st.instructions) {
      if (i.op == Op::forward || i.op == Op::backward) host = &i;
      if (i.op != Op::encoder_task || !(i.flags & pipeline::kInTpBubble)) continue;
      ASSERT_NE(host, nullptr);
      const auto& h = st.units[static_cast<std::size_t>(host->unit)];
      const auto& u = st.units[static_cast<std::size_t>(i.unit)];
      const bool backward = host->op == Op::backward;
      const double wait =
          backward ? h.backward_tp_s / h.backward_tp_collectives : h.forward_tp_s / h.forward_tp_collectives;
      const double task = (i.flags & pipeline::kBackwardTask) ? u.backward_s + u.backward_tp_s + u.shard_comm_s
                                                              : u.forward_s + u.forward_tp_s;
      EXPECT_LE(task, wait * (1 + 1e-9)) << st.name;
      ++fitted;
    }
  }
  EXPECT_GT(fitted, 0);
}

// An encoder of the llm's tp over a one-stage llm feeds the llm replica on its own devices:
// no hand-over to price (it was a point-to-point send per microbatch, shown as TP idle even
// on one device). With llm stages, the first stage's devices receive it.
TEST(Bubble, AnEncoderFeedingItsOwnDevicesHandsNothingOver) {
  spec::RunSpec run = test::load("tiny-mllm.yaml");
  const cost::CostModel cost(run);
  const plan::Plan plan = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::optimus, {1, 1, 0}, {}}).best;
  const plan::ModulePlacement* encoder = nullptr;
  for (const auto& m : plan.modules)
    if (m.role == spec::Role::encoder) encoder = &m;
  ASSERT_NE(encoder, nullptr);
  EXPECT_EQ(plan::colocated_handover_seconds(cost, *encoder, 1, 1), 0);
  EXPECT_GT(plan::colocated_handover_seconds(cost, *encoder, 1, 2), 0);
  const sim::Result r = sim::simulate(orchestrate::build_program(cost, plan, spec::Schedule::optimus_fine));
  EXPECT_EQ(r.bubbles[static_cast<std::size_t>(sim::Cause::tp)], 0);
}

// Under full recomputation a colocated encoder's layer is recomputed, collectives included, in
// its first backward task (the last kernel's), as nn::ImageEncoder::backward_kernel runs it,
// and held from there: the kernels' backward tasks add up to the layer's backward as before.
TEST(Bubble, AColocatedEncoderRecomputesItsLayerInItsFirstBackwardTask) {
  spec::RunSpec run = test::load("tiny-mllm.yaml");
  run.training.recompute = spec::Recompute::full;
  const cost::CostModel cost(run);
  const plan::Plan plan = orchestrate::make_plan(cost, plan::PlanRequest{plan::Strategy::optimus, {1, 2, 0}, {}}).best;
  ASSERT_EQ(plan.layout, plan::Layout::colocated);
  const plan::ModulePlacement* encoder = nullptr;
  for (const auto& m : plan.modules)
    if (m.role == spec::Role::encoder) encoder = &m;
  ASSERT_NE(encoder, nullptr);
  const auto kernels = cost.layer_kernels(encoder->module, encoder->tp, encoder->microbatch_size);
  const cost::ModuleCost& mc = cost.module(encoder->module, encoder->tp, encoder->microbatch_size);
  const bubble::Colocated c = bubble::decompose(cost, plan);
  const auto& units = c.llm.stages[0].units;
  const std::size_t base = static_cast<std::size_t>(bubble::encoder_unit(0, 1));  // after its embedding
  const std::size_t last = base + kernels.size() - 1;
  double backward = 0, recompute = 0;
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    const auto& u = units[base + k];
    backward += u.backward_s + u.backward_tp_s;
    recompute += kernels[k].cost.recompute_s;
    if (base + k != last) {
      EXPECT_DOUBLE_EQ(u.backward_s, kernels[k].cost.backward_s) << kernels[k].name;
    }
    EXPECT_EQ(u.recompute_bytes, base + k == last ? mc.recompute_bytes_all_passes : 0) << kernels[k].name;
  }
  EXPECT_GT(recompute, 0);
  EXPECT_NEAR(units[last].backward_s, kernels.back().cost.backward_s + recompute, 1e-15);
  EXPECT_NEAR(backward, mc.layer.backward_time(), 1e-12 * backward);
}

// A colocated encoder's DP collectives overlap as the llm's do (Megatron-Core's
// overlap_grad_reduce and overlap_param_gather hook every module's buckets): the estimate
// and the bubble scheduler's programs charge the part left exposed, and agree.
TEST(Bubble, AColocatedEncodersDpCollectivesOverlapAsTheLlmsDo) {
  Case off = optimus_case("vit22b-gpt175b-1536gpu.yaml");
  spec::RunSpec on_run = *off.run;
  on_run.training.overlap_grad_reduce = true;
  const cost::CostModel on(on_run);
  plan::Plan off_plan = off.plan, on_plan = off.plan;
  std::string why;
  ASSERT_TRUE(plan::evaluate(*off.cost, off_plan, &why)) << why;
  ASSERT_TRUE(plan::evaluate(on, on_plan, &why)) << why;
  const bubble::Colocated on_tasks = bubble::decompose(on, on_plan), off_tasks = bubble::decompose(*off.cost, off_plan);
  double raw = 0, exposed = 0;  // the encoders' step tails: the largest over their stages
  std::vector<double> hidden(on_tasks.llm.stages.size(), 0.0);  // of each llm stage's encoders' DP time
  for (const auto& m : on_plan.modules) {
    if (m.role != spec::Role::encoder) continue;
    const auto loads = plan::grid_loads(on, m, m.microbatch_size);
    for (const auto& l : loads) {
      raw = std::max(raw, l.dp_sync_s + l.optimizer_s);
      exposed = std::max(exposed, l.exposed_dp_sync(on_run.training) + l.optimizer_s);
    }
    for (std::size_t s = 0; s < hidden.size(); ++s) {
      const auto& l = loads[s * static_cast<std::size_t>(m.pp) / hidden.size()];  // the encoder stage it hosts
      hidden[s] += l.dp_sync_s - l.exposed_dp_sync(on_run.training);
    }
  }
  ASSERT_LT(exposed, raw);
  // The encoders' forwards and backwards are the same either way; only their tail shrinks.
  EXPECT_NEAR(on_plan.estimate.encoder_exposed_s - off_plan.estimate.encoder_exposed_s, exposed - raw, 1e-9 * raw);
  // Each stage's DP collective is its llm stage's, exposed as that stage's monolithic program
  // has it, and its encoders' exposed part.
  plan::Plan llm = on_plan;
  std::erase_if(llm.modules, [](const plan::ModulePlacement& m) { return m.role == spec::Role::encoder; });
  llm.layout = plan::Layout::monolithic;
  const auto llm_on = pipeline::build_program(on, llm, spec::Schedule::one_f_one_b);
  const auto llm_off = pipeline::build_program(*off.cost, llm, spec::Schedule::one_f_one_b);
  for (std::size_t s = 0; s < hidden.size(); ++s) {
    auto dp = [&](const pipeline::StageProgram& st) { return st.reduce_grads_s + st.gather_s; };
    const double llm_hidden = dp(llm_off.stages[s]) - dp(llm_on.stages[s]);
    EXPECT_NEAR(dp(off_tasks.llm.stages[s]) - dp(on_tasks.llm.stages[s]), llm_hidden + hidden[s], 1e-9 * raw) << s;
  }
}

// The llm's DP collectives are bubbles (Optimus' DP all-gather and reduce-scatter): on the
// planner's own plan (a deep encoder pipeline, whose chains all end on the llm's first
// stage), the coarse pass runs the encoder's forwards behind the llm's parameter all-gather
// (ZeRO-1), which opens the step, and its backwards behind the llm's gradient reduction,
// which encoder-first runs after them. Exactly the tasks before each stage's first llm
// instruction and after its last llm backward are in the DP waits.
TEST(Bubble, EncoderWorkHidesBehindTheLlmsDpCollectives) {
  auto c = optimus_case("vit22b-gpt175b-3072gpu.yaml");
  ASSERT_EQ(c.run->training.zero_stage, 1);
  const auto s = bubble::schedule(*c.cost, c.plan);
  const auto& r = s.report;
  EXPECT_EQ(r.encoder_hidden.plain, 0);
  EXPECT_GT(r.encoder_hidden.coarse, 0.75);
  EXPECT_GE(r.encoder_hidden.fine, r.encoder_hidden.coarse - 1e-12);
  // {tasks in a DP wait; forward tasks before the stage's first llm instruction and backward
  // tasks after its last llm backward}
  auto in_dp_wait = [](const pipeline::Program& p) {
    std::pair<int, int> n{0, 0};
    for (const auto& st : p.stages) {
      const auto llm = [](const Instruction& i) { return i.op == Op::forward || i.op == Op::backward; };
      const auto first = std::find_if(st.instructions.begin(), st.instructions.end(), llm);
      const auto last = std::find_if(st.instructions.rbegin(), st.instructions.rend(), llm).base();
      for (auto it = st.instructions.begin(); it != st.instructions.end(); ++it) {
        n.first += (it->flags & pipeline::kInDpWait) != 0;
        const bool backward = it->flags & pipeline::kBackwardTask;
        n.second += it->op == Op::encoder_task && (backward ? it >= last : it < first);
      }
    }
    return n;
  };
  EXPECT_EQ(in_dp_wait(s.plain).first, 0);
  const auto [flagged, outside_llm] = in_dp_wait(s.coarse);
  EXPECT_GT(flagged, 0);
  EXPECT_EQ(flagged, outside_llm);
  for (const auto& st : s.coarse.stages) {
    EXPECT_GT(st.early_reduce_s, 0) << st.name;
    EXPECT_GT(st.gather_s, 0) << st.name;
  }
  // Without those waits (the reduction issued after every task, the all-gather at its end),
  // the same coarse program loses most of its gain.
  pipeline::Program late = s.coarse;
  for (auto& st : late.stages) {
    st.early_reduce_s = 0;
    st.reduce_grads_s += std::exchange(st.gather_s, 0.0);
  }
  EXPECT_GT(sim::simulate(bubble::simulated_replicas(late)).step_time_s,
            r.coarse_step_s + 0.5 * (r.plain_step_s - r.coarse_step_s));
  EXPECT_NO_THROW(bubble::check(s.layout, s.coarse));
}

// The shares measured against the llm alone (Optimus' reference), recomputed by hand
// from the programs: the llm alone's step from its own emitted program, the encoder's
// seconds from the fine program's EncoderTask instructions, and H = encoder seconds
// minus what the schedule adds to the llm alone's step.
TEST(Bubble, EncoderSharesInBubblesAreMeasuredAgainstTheLlmAlone) {
  for (auto [tp, pp] : {std::pair{0, 0}, std::pair{8, 2}}) {
    SCOPED_TRACE(pp);
    auto c = optimus_case("vit22b-gpt175b-1536gpu.yaml", tp, pp);
    const auto s = bubble::schedule(*c.cost, c.plan);
    const auto& r = s.report;
    const sim::Result alone = sim::simulate(bubble::emit(s.layout, {}, /*without_encoders=*/true).program);
    EXPECT_NEAR(r.llm_step_s, alone.step_time_s, 1e-9 * alone.step_time_s);
    double idle = 0;
    for (double b : alone.bubbles) idle += b;
    EXPECT_NEAR(r.llm_idle_s, idle, 1e-9 * idle);

    double encoder = 0;
    for (const auto& st : s.fine.stages) {
      for (const auto& i : st.instructions) {
        if (i.op != Op::encoder_task) continue;
        const auto& u = st.units[static_cast<std::size_t>(i.unit)];
        encoder += (i.flags & pipeline::kBackwardTask) ? u.backward_s + u.backward_tp_s + u.shard_comm_s
                                                       : u.forward_s + u.forward_tp_s;
      }
    }
    encoder /= static_cast<double>(s.fine.stages.size());
    EXPECT_NEAR(r.encoder_s, encoder, 1e-9 * encoder);
    EXPECT_GT(encoder, 0);

    // No schedule beats the llm alone: the encoder only adds work and dependencies.
    for (double step : {r.plain_step_s, r.coarse_step_s, r.fine_step_s}) EXPECT_GE(step, r.llm_step_s * (1 - 1e-12));
    const double h = std::max(0.0, encoder - (r.fine_step_s - r.llm_step_s));
    EXPECT_NEAR(r.encoder_hidden.fine, h / encoder, 1e-9);
    EXPECT_NEAR(r.bubble_filled.fine, h / idle, 1e-9);
    EXPECT_LE(r.encoder_hidden.plain, r.encoder_hidden.coarse + 1e-12);
    EXPECT_LE(r.encoder_hidden.coarse, r.encoder_hidden.fine + 1e-12);
    EXPECT_LE(r.encoder_hidden.fine, 1.0);
    EXPECT_LE(r.bubble_filled.fine, 1.0);
  }
}

// Encoder first on a colocated plan hides none of the encoder: on stage 0 it has no
// warm-up to hide in, so the whole of its forwards delays the llm, and its backwards
// follow the llm's last. The step is the llm alone plus all of a device's encoder work.
TEST(Bubble, EncoderFirstHidesNoEncoderWork) {
  auto c = optimus_case("vit22b-gpt175b-1536gpu.yaml");
  const auto r = bubble::schedule(*c.cost, c.plan).report;
  EXPECT_NEAR(r.plain_step_s - r.llm_step_s, r.encoder_s, 0.05 * r.encoder_s);
  EXPECT_LT(r.encoder_hidden.plain, 0.05);
}

class BrokenSchedule : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = optimus_case("vit22b-gpt175b-3072gpu.yaml", 8, 2);
    s_ = std::make_unique<bubble::Schedules>(bubble::schedule(*c_.cost, c_.plan));
  }
  void expect_rejected(const Program& p, const std::string& part) {
    test::expect_error([&] { bubble::check(s_->layout, p); }, Status::invalid_argument, {part});
  }
  Case c_;
  std::unique_ptr<bubble::Schedules> s_;
};

TEST_F(BrokenSchedule, ForwardAfterTheLlmForwardThatNeedsIt) {
  // Drop every ordering message that holds the llm's first stage until its inputs are encoded.
  Program p = s_->fine;
  const auto sync = [](Op op) {
    return [op](const Instruction& i) {
      return i.op == op && i.peer >= 0 && (i.flags & pipeline::kSyncOnly) && i.microbatch < bubble::kEncoderTag;
    };
  };
  std::vector<int> feeders;
  for (const auto& i : p.stages[0].instructions)
    if (sync(Op::recv_activation)(i)) feeders.push_back(i.peer);
  ASSERT_FALSE(feeders.empty());
  std::erase_if(p.stages[0].instructions, sync(Op::recv_activation));
  for (int f : feeders) {
    std::erase_if(p.stages[static_cast<std::size_t>(f)].instructions,
                  [&](const Instruction& i) { return sync(Op::send_activation)(i) && i.peer == 0; });
  }
  expect_rejected(p, "that needs it starts");
}

TEST_F(BrokenSchedule, BackwardBeforeTheLlmBackwardThatFeedsIt) {
  Program p = s_->plain;
  const int last = static_cast<int>(p.stages.size()) - 1;
  auto& st = p.stages[static_cast<std::size_t>(last)];
  std::erase_if(st.instructions, [](const Instruction& i) {
    return i.op == Op::recv_grad && i.peer == 0 && (i.flags & pipeline::kSyncOnly);
  });
  std::erase_if(p.stages[0].instructions, [&](const Instruction& i) {
    return i.op == Op::send_grad && i.peer == last && (i.flags & pipeline::kSyncOnly);
  });
  expect_rejected(p, "that feeds it ends");
}

TEST_F(BrokenSchedule, TasksOutOfTheEncodersOrder) {
  Program p = s_->fine;
  auto& ins = p.stages[1].instructions;
  const std::size_t a = find_op(p.stages[1], [](const Instruction& i) { return i.op == Op::encoder_task; });
  std::size_t b = a + 1;
  while (ins[b].op != Op::encoder_task) ++b;
  std::swap(ins[a], ins[b]);
  expect_rejected(p, "out of the encoder's order");
}

TEST_F(BrokenSchedule, MissingTask) {
  Program p = s_->coarse;
  auto& ins = p.stages[2].instructions;
  std::size_t last = ins.size() - 1;
  while (ins[last].op != Op::encoder_task) --last;
  erase_at(p, 2, last);
  expect_rejected(p, "exactly once");
}

TEST(BubbleTpWaits, CommunicationInsideATpBubbleIsRejected) {
  // An encoder collective or transfer that directly follows an llm forward/backward,
  // marked as running inside that instruction's TP waits (in a fine schedule that uses them).
  auto c = optimus_case("vit22b-gpt175b-1536gpu.yaml", 8, 2, 0);
  const auto s = bubble::schedule(*c.cost, c.plan);
  ASSERT_GT(s.report.tp_bubble_tasks, 0);
  Program p = s.fine;
  bool done = false;
  for (auto& st : p.stages) {
    Op last = Op::load_microbatch;
    for (auto& i : st.instructions) {
      if (i.op == Op::encoder_task && st.units[static_cast<std::size_t>(i.unit)].communication &&
          (last == Op::forward || last == Op::backward) && !(i.flags & pipeline::kInTpBubble)) {
        i.flags |= pipeline::kInTpBubble;
        done = true;
        break;
      }
      if (i.op != Op::send_activation && i.op != Op::send_grad) last = i.op;
    }
    if (done) break;
  }
  ASSERT_TRUE(done);
  test::expect_error([&] { bubble::check(s.layout, p); }, Status::invalid_argument,
                     {"communication placed inside a TP collective's wait"});
}

TEST(BubblePipelinedEncoder, StageStartingBeforeThePreviousOneIsRejected) {
  auto c = optimus_case("vit22b-gpt175b-3072gpu.yaml");  // the encoder runs 12 pipeline stages
  const auto s = bubble::schedule(*c.cost, c.plan);
  ASSERT_GT(s.layout.encoders[0].stages, 1);
  EXPECT_NO_THROW(bubble::check(s.layout, s.fine));
  Program p = s.plain;
  const int tag = bubble::encoder_tag(0, 0);
  erase_at(p, 1, find_op(p.stages[1], [&](const Instruction& i) {
             return i.op == Op::recv_activation && i.microbatch == tag;
           }));
  erase_at(p, 0, find_op(p.stages[0], [&](const Instruction& i) {
             return i.op == Op::send_activation && i.microbatch == tag;
           }));
  test::expect_error([&] { bubble::check(s.layout, p); }, Status::invalid_argument,
                     {"before the previous encoder stage has finished"});
}

}  // namespace
}  // namespace braid
