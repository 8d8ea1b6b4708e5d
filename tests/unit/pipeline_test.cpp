// Pipeline programs and the simulator against closed forms and Megatron's order.
#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/pipeline/schedules.hpp"
#include "core/plan/stage_load.hpp"
#include "core/sim/simulator.hpp"
#include "core/sim/trace.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using pipeline::Op;
using pipeline::Program;

// A linear pipeline of `p` identical stages, `v` chunks each, free communication.
Program uniform(int p, int v = 1, double forward = 1.0, double backward = 2.0) {
  Program prog;
  prog.stages.resize(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    auto& st = prog.stages[static_cast<std::size_t>(s)];
    st.name = "stage " + std::to_string(s);
    st.depth = s;
    if (s > 0) st.prev = {s - 1};
    if (s + 1 < p) st.next = {s + 1};
    for (int c = 0; c < v; ++c) {
      pipeline::WorkUnit u;
      u.label = st.name;
      u.forward_s = forward / v;
      u.backward_s = backward / v;
      u.recompute_s = forward / v;
      u.activation_bytes = 100;
      u.input_bytes = 10;
      st.units.push_back(u);
    }
  }
  return prog;
}

double bubble(Program prog) {
  pipeline::finish_step(prog);
  return sim::simulate(prog).bubble_fraction;
}

TEST(Pipeline, GpipeAnd1F1BBubbleIsClosedForm) {
  for (int p : {1, 2, 3, 4, 8, 16}) {
    for (int m : {1, 2, 4, 7, 16, 64}) {
      SCOPED_TRACE("p " + std::to_string(p) + " m " + std::to_string(m));
      const double expected = double(p - 1) / (m + p - 1);
      Program a = uniform(p);
      pipeline::one_f_one_b(a, m);
      Program b = uniform(p);
      pipeline::gpipe(b, m);
      EXPECT_NEAR(bubble(a), expected, 1e-9 * std::max(expected, 1e-300) + 1e-15);
      EXPECT_NEAR(bubble(b), expected, 1e-9 * std::max(expected, 1e-300) + 1e-15);
    }
  }
}

TEST(Pipeline, InterleavedBubbleIsClosedForm) {
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3, 4}) {
      for (int mult : {1, 2, 4, 8}) {
        const int m = mult * p;
        SCOPED_TRACE("p " + std::to_string(p) + " v " + std::to_string(v) + " m " + std::to_string(m));
        Program a = uniform(p, v, 1.0, 1.0);
        pipeline::interleaved(a, m, v);
        const double expected = double(p - 1) / (v * m + p - 1);
        EXPECT_NEAR(bubble(a), expected, 1e-9 * expected);
      }
    }
  }
}

// The stages a stage exchanges messages with come from its instructions: interleaved 1F1B
// sends the last stage's chunk-c output to the first stage's chunk c+1, which the module
// graph (StageProgram::prev/next) does not show.
TEST(Pipeline, MessagePeersIncludeTheInterleavedWrapAround) {
  Program a = uniform(4, 2);
  pipeline::interleaved(a, 8, 2);
  EXPECT_EQ(a.stages[0].prev, std::vector<int>{});
  const auto first = pipeline::message_peers(a.stages[0]);
  const auto last = pipeline::message_peers(a.stages[3]);
  EXPECT_EQ(first.prev, std::vector<int>{3});
  EXPECT_EQ(first.next, std::vector<int>{1});
  EXPECT_EQ(last.prev, std::vector<int>{2});
  EXPECT_EQ(last.next, std::vector<int>{0});
  Program b = uniform(4);
  pipeline::one_f_one_b(b, 8);
  EXPECT_EQ(pipeline::message_peers(b.stages[0]).prev, std::vector<int>{});
  EXPECT_EQ(pipeline::message_peers(b.stages[2]).prev, std::vector<int>{1});
  EXPECT_EQ(pipeline::message_peers(b.stages[2]).next, std::vector<int>{3});
}

// The compute instructions of a stage as "F3" / "B0".
std::vector<std::string> compute_order(const Program& p, int s) {
  std::vector<std::string> out;
  for (const auto& i : p.stages[static_cast<std::size_t>(s)].instructions) {
    if (i.op == Op::forward || i.op == Op::backward) {
      std::string name(1, i.op == Op::forward ? 'F' : 'B');
      name += std::to_string(i.microbatch);
      out.push_back(std::move(name));
    }
  }
  return out;
}

TEST(Pipeline, OneFOneBFollowsMegatronsOrder) {
  for (int p : {2, 4, 5}) {
    for (int m : {1, 3, 4, 8}) {
      Program prog = uniform(p);
      pipeline::one_f_one_b(prog, m);
      for (int s = 0; s < p; ++s) {
        // Megatron: min(p - rank - 1, m) warm-up forwards, then one forward and one
        // backward at a time, then the remaining backwards.
        const int warmup = std::min(p - s - 1, m);
        std::vector<std::string> expected;
        auto op = [](char c, int mb) {
          std::string name(1, c);
          name += std::to_string(mb);
          return name;
        };
        for (int i = 0; i < warmup; ++i) expected.push_back(op('F', i));
        for (int i = 0; i < m - warmup; ++i) {
          expected.push_back(op('F', warmup + i));
          expected.push_back(op('B', i));
        }
        for (int i = m - warmup; i < m; ++i) expected.push_back(op('B', i));
        EXPECT_EQ(compute_order(prog, s), expected) << "p " << p << " m " << m << " stage " << s;
      }
    }
  }
}

TEST(Pipeline, OneFOneBKeepsAtMostPMicrobatchesOnStageZero) {
  Program prog = uniform(4);
  pipeline::one_f_one_b(prog, 16);
  pipeline::finish_step(prog);
  auto r = sim::simulate(prog);
  EXPECT_DOUBLE_EQ(r.stages[0].peak_memory_bytes, 4 * 100.0);
  EXPECT_DOUBLE_EQ(r.stages[3].peak_memory_bytes, 1 * 100.0);
  Program g = uniform(4);
  pipeline::gpipe(g, 16);
  pipeline::finish_step(g);
  EXPECT_DOUBLE_EQ(sim::simulate(g).stages[3].peak_memory_bytes, 16 * 100.0);
}

// A backward holds what recomputation re-created of its layer beside every microbatch kept,
// its own included (freed when it ends).
TEST(Pipeline, ARecomputedBackwardHoldsItsLayerBesideWhatIsKept) {
  Program prog = uniform(4);
  for (auto& st : prog.stages) st.units[0].recompute_bytes = 30;
  pipeline::one_f_one_b(prog, 16);
  pipeline::finish_step(prog);
  auto r = sim::simulate(prog);
  EXPECT_DOUBLE_EQ(r.stages[0].peak_memory_bytes, 4 * 100.0 + 30);
  EXPECT_DOUBLE_EQ(r.stages[3].peak_memory_bytes, 1 * 100.0 + 30);
}

// Two branches (an image and a text pipeline) joined by a contrastive loss.
Program two_branches(int image_stages, int text_stages) {
  Program prog;
  auto add = [&](const std::string& name, int stages, double f) {
    int first = static_cast<int>(prog.stages.size());
    for (int s = 0; s < stages; ++s) {
      pipeline::StageProgram st;
      st.name = name + " stage " + std::to_string(s);
      st.depth = s;
      if (s > 0) st.prev = {first + s - 1};
      if (s + 1 < stages) st.next = {first + s + 1};
      pipeline::WorkUnit u;
      u.forward_s = f;
      u.backward_s = 2 * f;
      u.recompute_s = f;
      u.activation_bytes = 100;
      u.input_bytes = 10;
      st.units.push_back(u);
      prog.stages.push_back(st);
    }
  };
  add("image", image_stages, 1.0);
  add("text", text_stages, 0.5);
  prog.batch_sync_s = 0.25;
  return prog;
}

TEST(Pipeline, BatchSyncPrecedesTheBackwardsItFeeds) {
  for (auto kind : {spec::Schedule::batch_sync, spec::Schedule::distmm_pipe, spec::Schedule::two_phase}) {
    Program prog = two_branches(3, 2);
    pipeline::batch_sync(prog, 3, 4, kind);
    for (const auto& st : prog.stages) {
      if (!st.next.empty()) continue;  // last stages join the sync
      std::set<int> synced;
      for (const auto& i : st.instructions) {
        if (i.op == Op::batch_sync) synced.insert(i.group);
        if (i.op == Op::backward) {
          EXPECT_TRUE(synced.count(i.microbatch / 4)) << st.name << " " << spec::schedule_name(kind);
        }
      }
      EXPECT_EQ(synced, (std::set<int>{0, 1, 2}));  // every group synced once
    }
  }
}

double step(Program prog) {
  pipeline::finish_step(prog);
  return sim::simulate(prog).step_time_s;
}

TEST(Pipeline, ABatchSyncAfterComputeSlowsItsCollectivesAlone) {
  // One group of 4 microbatches: the image tower's forwards take 4 s, the text tower's 2, then
  // the batch-sync (0.25 s, 0.2 of it collectives) at the longer gap, 4 s: 0.2 + 0.1 + 0.5 x 0.2.
  Program prog = two_branches(1, 1);
  prog.batch_sync_comm_s = 0.2;
  pipeline::batch_sync(prog, 1, 4, spec::Schedule::batch_sync);
  const double plain = step(prog);
  prog.dp_link.after_compute = {{4, 0.1, 0.5}};
  EXPECT_NEAR(step(prog) - plain, 0.1 + 0.5 * 0.2, 1e-12);
}

TEST(Pipeline, DistmmPipeBeatsPlainBatchSyncWithSeveralGroups) {
  for (int groups : {2, 3, 8}) {
    Program plain = two_branches(4, 2), pipe = two_branches(4, 2);
    pipeline::batch_sync(plain, groups, 4, spec::Schedule::batch_sync);
    pipeline::batch_sync(pipe, groups, 4, spec::Schedule::distmm_pipe);
    EXPECT_LT(step(pipe), step(plain)) << groups << " groups";
  }
  // One group: nothing to overlap, the same step.
  Program plain = two_branches(4, 2), pipe = two_branches(4, 2);
  pipeline::batch_sync(plain, 1, 4, spec::Schedule::batch_sync);
  pipeline::batch_sync(pipe, 1, 4, spec::Schedule::distmm_pipe);
  EXPECT_DOUBLE_EQ(step(pipe), step(plain));
}

TEST(Pipeline, TwoPhaseKeepsOneFOneBMemory) {
  Program plain = two_branches(4, 2), two = two_branches(4, 2);
  pipeline::batch_sync(plain, 1, 32, spec::Schedule::batch_sync);
  pipeline::batch_sync(two, 1, 32, spec::Schedule::two_phase);
  pipeline::finish_step(plain);
  pipeline::finish_step(two);
  auto a = sim::simulate(plain), b = sim::simulate(two);
  // Plain keeps all 32 microbatches on the first image stage; two-phase keeps the
  // 32 inputs plus at most the pipeline depth of full activations.
  EXPECT_DOUBLE_EQ(a.stages[0].peak_memory_bytes, 32 * 100.0);
  EXPECT_LE(b.stages[0].peak_memory_bytes, 32 * 10.0 + 4 * 100.0);
  EXPECT_GT(b.step_time_s, a.step_time_s);  // the price: one more forward
}

TEST(Pipeline, DeadlockNamesTheStuckInstructions) {
  Program prog = uniform(2);
  // Both stages wait for the other first.
  pipeline::Instruction r0{Op::recv_grad, 0, 0, 1, -1, 0, 0};
  pipeline::Instruction s0{Op::send_activation, 0, 0, 1, -1, 0, 0};
  pipeline::Instruction r1{Op::recv_activation, 0, 0, 0, -1, 0, 0};
  pipeline::Instruction s1{Op::send_grad, 0, 0, 0, -1, 0, 0};
  prog.stages[0].instructions = {r0, s0};
  prog.stages[1].instructions = {r1, s1};
  test::expect_error(
      [&] { sim::simulate(prog); }, Status::invalid_argument,
      {"the program deadlocks",
       "stage 'stage 0' (replica 0) waits at instruction 0: RecvGrad microbatch 0 from 'stage 1'",
       "stage 'stage 1' (replica 0) waits at instruction 0: RecvActivation microbatch 0 from 'stage 0'"});
}

TEST(Pipeline, MalformedProgramsAreRejected) {
  Program unmatched = uniform(2);
  unmatched.stages[0].instructions = {{Op::send_activation, 3, 0, 1, -1, 0, 0}};
  test::expect_error([&] { sim::simulate(unmatched); }, Status::invalid_argument,
                     {"activations of microbatch 3 from 'stage 0' to 'stage 1': 1 send(s) without a matching receive"});
  Program bad_peer = uniform(2);
  bad_peer.stages[0].instructions = {{Op::send_activation, 0, 0, 7, -1, 0, 0}};
  test::expect_error([&] { sim::simulate(bad_peer); }, Status::invalid_argument, {"has no valid peer stage"});
  Program bad_unit = uniform(1);
  bad_unit.stages[0].instructions = {{Op::forward, 0, 0, -1, -1, 5, 0}};
  test::expect_error([&] { sim::simulate(bad_unit); }, Status::invalid_argument, {"names work unit 5 of 1"});
  Program sync_alone = two_branches(1, 1);
  sync_alone.stages[0].instructions = {{Op::batch_sync, -1, 0, -1, 0, 0, 0}};
  test::expect_error([&] { sim::simulate(sync_alone); }, Status::invalid_argument,
                     {"stage 'text stage 0' ends a branch but never joins the BatchSync of group 0"});
  Program early = two_branches(1, 1);
  pipeline::batch_sync(early, 1, 2, spec::Schedule::batch_sync);
  auto& ins = early.stages[0].instructions;
  auto sync =
      std::find_if(ins.begin(), ins.end(), [](const pipeline::Instruction& i) { return i.op == Op::batch_sync; });
  ins.push_back(*sync);  // move the sync after the backwards
  ins.erase(sync);
  test::expect_error([&] { sim::simulate(early); }, Status::invalid_argument,
                     {"stage 'image stage 0' instruction",
                      "(Backward): backward of microbatch 0 comes before the BatchSync of its group 0"});
}

TEST(Pipeline, AGradientReductionAfterComputeIsSlowedByItsGap) {
  // Two replicas of one stage, m microbatches of 1 s forward + 2 s backward and nothing to
  // send: each computes 3m s, then reduces its gradients (priced 0.5 s) after that gap.
  auto step = [](int m, std::vector<spec::LinkSpec::AfterCompute> rows) {
    Program prog = uniform(1);
    prog.stages[0].replicas = 2;
    prog.stages[0].reduce_grads_s = 0.5;
    prog.dp_link.after_compute = std::move(rows);
    pipeline::one_f_one_b(prog, m);
    pipeline::finish_step(prog);
    return sim::simulate(prog).step_time_s;
  };
  const std::vector<spec::LinkSpec::AfterCompute> rows = {{4, 0.1, 0.2}, {16, 0.3, 0.6}};
  for (int m : {1, 4, 8}) EXPECT_NEAR(step(m, {}), 3 * m + 0.5, 1e-12) << "no rows: as priced";
  // 3 s, below the first row: 3/4 of it (fixed 0.075, factor 0.15).
  EXPECT_NEAR(step(1, rows), 3 + 0.5 + 0.075 + 0.15 * 0.5, 1e-12);
  // 12 s, two thirds of the way to the second row (fixed 0.2333, factor 0.4667).
  EXPECT_NEAR(step(4, rows), 12 + 0.5 + (0.1 + 0.2 * 2 / 3) + (0.2 + 0.4 * 2 / 3) * 0.5, 1e-12);
  // 24 s, past the last row: held there.
  EXPECT_NEAR(step(8, rows), 24 + 0.5 + 0.3 + 0.6 * 0.5, 1e-12);
}

TEST(Pipeline, AGradientReductionCountsTheComputeSinceTheLastMessage) {
  // Two stages: the first's reduction follows its last backward, entered after the gradient
  // it received, so its gap is that backward alone, not the whole step.
  Program prog = uniform(2);
  for (auto& st : prog.stages) st.replicas = 2;
  prog.stages[0].reduce_grads_s = 0.5;
  pipeline::one_f_one_b(prog, 4);
  pipeline::finish_step(prog);
  const double plain = sim::simulate(prog).step_time_s;
  prog.dp_link.after_compute = {{1, 0, 0.5}, {2, 0, 1.0}, {100, 0, 10}};
  // Stage 0 ends its step 2 s after it received its last gradient: factor 1.0 of 0.5 s.
  EXPECT_NEAR(sim::simulate(prog).step_time_s - plain, 0.5, 1e-12);
}

TEST(Pipeline, DataParallelFanInAndFanOut) {
  // An encoder stage with 4 replicas feeds an llm stage with 2 (fan-in 2:1) and back.
  Program prog;
  prog.stages.resize(2);
  prog.stages[0].name = "enc";
  prog.stages[0].replicas = 4;
  prog.stages[0].next = {1};
  prog.stages[1].name = "llm";
  prog.stages[1].replicas = 2;
  prog.stages[1].prev = {0};
  prog.stages[1].depth = 1;
  for (auto& st : prog.stages) {
    pipeline::WorkUnit u;
    u.forward_s = 1;
    u.backward_s = 1;
    st.units.push_back(u);
    st.send_activation_s = 0.1;
    st.send_grad_s = 0.1;
  }
  pipeline::one_f_one_b(prog, 3);
  pipeline::finish_step(prog);
  auto r = sim::simulate(prog);
  EXPECT_EQ(r.ranks, 6);
  // By hand: llm F0 at 1.1, B0 ends 3.1; enc B0 waits for its gradient until 3.2; enc F2
  // follows at 4.2 and reaches the llm at 5.3; llm B2 ends 7.3; enc B2 runs 7.4 - 8.4.
  EXPECT_NEAR(r.step_time_s, 8.4, 1e-12);
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// The planner scores with a closed form: m * slowest stage + fill, stage times
// including their sends. On uniform stages it agrees with the simulation of the
// real programs within 1% for every generator.
TEST(Pipeline, ClosedFormAgreesWithTheSimulatorOnUniformStages) {
  for (int p : {2, 4, 8}) {
    for (int m : {8, 16, 32}) {
      for (int v : {1, 2}) {
        for (const char* kind : {"gpipe", "1f1b", "interleaved"}) {
          if ((v > 1) != (std::string(kind) == "interleaved")) continue;
          Program prog = uniform(p, v, 1.0, 2.0);
          for (auto& st : prog.stages) st.send_activation_s = st.send_grad_s = 0.005;  // 0.5% of a stage
          if (std::string(kind) == "gpipe") pipeline::gpipe(prog, m);
          if (std::string(kind) == "1f1b") pipeline::one_f_one_b(prog, m);
          if (std::string(kind) == "interleaved") pipeline::interleaved(prog, m, v);
          pipeline::finish_step(prog);
          const double stage = 3.0 + 2 * 0.005 * v;  // compute + a send each way per chunk
          const double closed = plan::pipeline_span(std::vector<double>(static_cast<std::size_t>(p), stage), m, v);
          const double simulated = sim::simulate(prog).step_time_s;
          EXPECT_NEAR(simulated / closed, 1.0, 0.01) << kind << " p " << p << " m " << m << " v " << v;
        }
      }
    }
  }
}

TEST(Pipeline, ChromeTraceHasOneEventPerTimedInstruction) {
  Program prog = uniform(3);
  for (auto& st : prog.stages) {
    st.send_activation_s = st.send_grad_s = 0.1;
    st.reduce_grads_s = 0.2;
    st.optimizer_s = 0.05;
    st.replicas = 2;
    st.devices_per_replica = 4;
    st.device_stride = 4;
  }
  pipeline::one_f_one_b(prog, 4);
  pipeline::finish_step(prog);
  sim::Options o;
  o.trace = true;
  o.trace_replicas = -1;
  auto r = sim::simulate(prog, o);
  auto doc = nlohmann::json::parse(sim::chrome_trace(prog, r));
  int intervals = 0, processes = 0, threads = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X") {
      ++intervals;
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
    if (e["name"] == "process_name") ++processes;
    if (e["name"] == "thread_name") ++threads;
  }
  // Per rank: 4 forwards, 4 backwards and the optimizer on compute, one ReduceGrads;
  // per replica: stages 0 and 2 send 4 messages one way, stage 1 sends 4 each way.
  const int ranks = 3 * 2, sends = 2 * (4 + 8 + 4);
  EXPECT_EQ(intervals, ranks * (4 + 4 + 1 + 1) + sends);
  EXPECT_EQ(processes, ranks);
  EXPECT_EQ(threads, 3 * ranks);
  EXPECT_EQ(doc["otherData"]["schedule"], "1f1b");
  std::string g = sim::gantt(prog, r, 40);
  EXPECT_NE(g.find("stage 2 |"), std::string::npos) << g;
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// Review regressions.

TEST(Pipeline, ShortBranchesWarmUpByTheirOwnDepth) {
  // Image pipeline of 3 stages, text of 1: the text stage needs no warm-up forward.
  Program prog = two_branches(3, 1);
  pipeline::batch_sync(prog, 2, 4, spec::Schedule::distmm_pipe);
  pipeline::finish_step(prog);
  auto r = sim::simulate(prog);
  EXPECT_DOUBLE_EQ(r.stages[3].peak_memory_bytes, 4 * 100.0);  // one group's 4 microbatches, never a fifth
}

TEST(Pipeline, TwoPhaseRecomputesFromKeptInputsWithoutResending) {
  Program prog = two_branches(2, 1);
  pipeline::batch_sync(prog, 1, 4, spec::Schedule::two_phase);
  int sends = 0;
  for (const auto& i : prog.stages[0].instructions) sends += i.op == Op::send_activation;
  EXPECT_EQ(sends, 4);  // the no-store forwards only
  pipeline::finish_step(prog);
  EXPECT_NO_THROW(sim::simulate(prog));
}

TEST(Pipeline, IdsBeyondTheSimulatorsKeysAreRejected) {
  Program big = uniform(2);
  big.stages[0].instructions = {{Op::send_activation, 1 << 27, 0, 1, -1, 0, 0}};
  big.stages[1].instructions = {{Op::recv_activation, 1 << 27, 0, 0, -1, 0, 0}};
  test::expect_error([&] { sim::simulate(big); }, Status::invalid_argument, {"microbatch 134217728 is too large"});
  Program chunk = uniform(1);
  chunk.stages[0].instructions = {{Op::forward, 0, 4096, -1, -1, 0, 0}};
  test::expect_error([&] { sim::simulate(chunk); }, Status::invalid_argument, {"chunk 4096 is out of range"});
}

TEST(Pipeline, OrderingOnlyMessagesCostNothing) {
  Program prog = uniform(2);
  for (auto& st : prog.stages) st.send_activation_s = 5;
  prog.stages[0].instructions = {{Op::send_activation, 0, 0, 1, -1, 0, pipeline::kSyncOnly}};
  prog.stages[1].instructions = {{Op::recv_activation, 0, 0, 0, -1, 0, pipeline::kSyncOnly}};
  EXPECT_DOUBLE_EQ(sim::simulate(prog).step_time_s, 0.0);
}

// Encoder backward tasks in a colocated stage's DP wait: the llm's gradient reduction
// (early_reduce_s of reduce_grads_s) starts when the last llm backward ends and runs behind
// them; the rest of the reduction (the encoders' gradients) follows both.
TEST(Pipeline, TasksInTheDpWaitRunBehindTheEarlyReduction) {
  auto with_tasks = [](double task_s, std::uint8_t flags, int replicas,
                       std::vector<spec::LinkSpec::AfterCompute> after_compute = {}) {
    Program prog = uniform(1);
    prog.dp_link.after_compute = std::move(after_compute);
    auto& st = prog.stages[0];
    st.replicas = replicas;
    pipeline::WorkUnit task;
    task.label = "encoder kernel";
    task.backward_s = task_s;
    st.units.push_back(task);
    st.reduce_grads_s = 5;
    st.early_reduce_s = 3;
    const auto in_dp = static_cast<std::uint8_t>(pipeline::kBackwardTask | flags);
    st.instructions = {{Op::forward, 0, 0, -1, -1, 0, 0},
                       {Op::backward, 0, 0, -1, -1, 0, 0},
                       {Op::encoder_task, 0, 0, -1, -1, 1, in_dp},
                       {Op::encoder_task, 1, 0, -1, -1, 1, in_dp},
                       {Op::reduce_grads, -1, 0, -1, -1, 0, 0}};
    return sim::simulate(prog).step_time_s;
  };
  for (int replicas : {1, 3}) {
    SCOPED_TRACE(replicas);
    // forward 1 + backward 2, then two tasks of 1 s: 3 + 2 + 5 in order.
    EXPECT_NEAR(with_tasks(1, 0, replicas), 10, 1e-12);
    // In the wait: the early 3 s hide the tasks' 2 s; the other 2 s follow: 3 + 3 + 2.
    EXPECT_NEAR(with_tasks(1, pipeline::kInDpWait, replicas), 8, 1e-12);
    // Tasks longer than the early part: 3 + 2 x 2.5 + 2.
    EXPECT_NEAR(with_tasks(2.5, pipeline::kInDpWait, replicas), 10, 1e-12);
    // Slowed after compute, the reduction counts its gap up to its issue (3 s: 0.3 s more),
    // not to the end of the tasks in its wait; in order, it enters after 5 s (0.5 s more).
    const std::vector<spec::LinkSpec::AfterCompute> rows = {{3, 0.3, 0}, {5, 0.5, 0}};
    EXPECT_NEAR(with_tasks(1, pipeline::kInDpWait, replicas, rows), 8.3, 1e-12);
    EXPECT_NEAR(with_tasks(1, 0, replicas, rows), 10.5, 1e-12);
  }
}

TEST(Pipeline, TasksInTheDpWaitFollowTheLastBackward) {
  Program prog = uniform(1);
  auto& st = prog.stages[0];
  st.units.push_back(st.units[0]);
  const auto in_dp = static_cast<std::uint8_t>(pipeline::kBackwardTask | pipeline::kInDpWait);
  st.instructions = {{Op::forward, 0, 0, -1, -1, 0, 0},
                     {Op::encoder_task, 0, 0, -1, -1, 1, in_dp},
                     {Op::backward, 0, 0, -1, -1, 0, 0},
                     {Op::reduce_grads, -1, 0, -1, -1, 0, 0}};
  test::expect_error([&] { sim::simulate(prog); }, Status::invalid_argument,
                     {"instruction 2 (Backward): follows a task in the DP wait"});
  st.instructions = {{Op::forward, 0, 0, -1, -1, 0, 0},
                     {Op::backward, 0, 0, -1, -1, 0, 0},
                     {Op::encoder_task, 0, 0, -1, -1, 1, pipeline::kInDpWait},
                     {Op::reduce_grads, -1, 0, -1, -1, 0, 0}};
  test::expect_error(
      [&] { sim::simulate(prog); }, Status::invalid_argument,
      {"instruction 2 (EncoderTask): runs in the parameter all-gather's wait after the stage's first llm instruction"});
  st.instructions = {{Op::forward, 0, 0, -1, -1, 0, 0},
                     {Op::backward, 0, 0, -1, -1, 0, 0},
                     {Op::reduce_grads, -1, 0, -1, -1, 0, 0},
                     {Op::encoder_task, 0, 0, -1, -1, 1, in_dp}};
  test::expect_error([&] { sim::simulate(prog); }, Status::invalid_argument,
                     {"instruction 3 (EncoderTask): runs in the DP wait of a reduction already done"});
}

}  // namespace
}  // namespace braid

namespace braid {
namespace {

// Processes sharing one host's cores (spec::ClusterSpec::cores_per_node): each stage on
// its own device, every device on one node of `cores` cores.
Program on_shared_cores(Program prog, int cores) {
  int device = 0;
  for (auto& st : prog.stages) {
    st.first_device = device;
    st.device_stride = st.devices_per_replica;
    device += st.replicas * st.devices_per_replica;
  }
  prog.devices = device;
  prog.devices_per_node = device;
  prog.cores_per_node = cores;
  return prog;
}

TEST(SharedCores, ReplicasComputingTogetherTakeTurns) {
  // Four DP replicas, all computing at once on two cores: each at half speed.
  Program prog = uniform(1);
  prog.stages[0].replicas = 4;
  pipeline::one_f_one_b(prog, 2);
  pipeline::finish_step(prog);
  EXPECT_NEAR(sim::simulate(prog).step_time_s, 6.0, 1e-9);  // no sharing: 2 x (1 + 2)
  EXPECT_NEAR(sim::simulate(on_shared_cores(prog, 2)).step_time_s, 12.0, 1e-6);
  EXPECT_NEAR(sim::simulate(on_shared_cores(prog, 4)).step_time_s, 6.0, 1e-9);  // a core each
  EXPECT_NEAR(sim::simulate(on_shared_cores(prog, 1)).step_time_s, 24.0, 1e-6);
}

TEST(SharedCores, APipelineOnOneCoreIsBoundByItsWork) {
  // Two stages on one core: the core does all 2 x m x 3 seconds of work, and a stage that
  // waits lends it to the other, so the step stays near the work, far below twice the
  // unshared step (what every rank at half speed would give).
  for (int m : {1, 4, 16}) {
    SCOPED_TRACE("m " + std::to_string(m));
    Program prog = uniform(2);
    pipeline::one_f_one_b(prog, m);
    pipeline::finish_step(prog);
    const double alone = sim::simulate(prog).step_time_s, work = 2.0 * m * 3.0;
    const double shared = sim::simulate(on_shared_cores(prog, 1)).step_time_s;
    EXPECT_GE(shared, work * (1 - 1e-3));
    EXPECT_LE(shared, work * 1.05);
    EXPECT_LT(shared, 2 * alone);
    if (m == 1) {
      EXPECT_NEAR(shared, alone, 1e-9);  // nothing overlaps: nothing slows
    }
  }
}

}  // namespace
}  // namespace braid
