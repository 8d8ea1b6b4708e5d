// The one interpreter of pipeline programs (core/train/interpreter): every instruction runs
// once and in order; a missing handler is named; with online filling, movable instructions run
// while an earlier one waits, only once their inputs are there, keep their order among
// themselves, and a movable receive posted early finishes later with its original start.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/train/interpreter.hpp"
#include "tests/unit/support.hpp"

namespace braid {
namespace {

using pipeline::Instruction;
using pipeline::Op;
using train::Executed;
using train::Interpreter;
using train::Pending;

Instruction make(Op op, int microbatch = -1, std::uint8_t flags = 0) {
  Instruction i;
  i.op = op;
  i.microbatch = microbatch;
  i.flags = flags;
  return i;
}

// A receive that completes at the `after`-th test.
Pending arriving(int after, std::vector<int>& finished, int id) {
  auto tests = std::make_shared<int>(0);
  return {[tests, after] { return ++*tests >= after; },
          [&finished, id] {
            finished.push_back(id);
            return 0.0;
          }};
}

std::vector<int> indices(const std::vector<Executed>& ran) {
  std::vector<int> out;
  for (const auto& e : ran) out.push_back(e.index);
  return out;
}

TEST(Interpreter, RunsEveryInstructionOnceInOrder) {
  const std::vector<Instruction> list = {
      make(Op::load_microbatch, 0), make(Op::forward, 0),   make(Op::send_activation, 0), make(Op::recv_grad, 0),
      make(Op::backward, 0),        make(Op::reduce_grads), make(Op::optimizer_step)};
  Interpreter in;
  std::vector<Op> log;
  std::vector<int> finished;
  for (Op op :
       {Op::load_microbatch, Op::forward, Op::send_activation, Op::backward, Op::reduce_grads, Op::optimizer_step})
    in.set(op, [&log](const Instruction& i) {
      log.push_back(i.op);
      return Pending{};
    });
  in.set(Op::recv_grad, [&](const Instruction& i) {
    log.push_back(i.op);
    return arriving(3, finished, 3);
  });
  const auto ran = in.run(list);
  EXPECT_EQ(indices(ran), (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
  for (std::size_t k = 0; k < list.size(); ++k) EXPECT_EQ(log[k], list[k].op);
  EXPECT_EQ(finished, (std::vector<int>{3}));
  for (const auto& e : ran) EXPECT_LE(e.start, e.end);

  Interpreter partial;
  partial.set(Op::load_microbatch, [](const Instruction&) { return Pending{}; });
  test::expect_error([&] { partial.run(list); }, Status::internal, {"no handler for Forward"});
  // An error goes to the hook first, then on to the caller.
  bool told = false;
  EXPECT_THROW(partial.run(list, nullptr, [&](const std::exception_ptr&) { told = true; }), Error);
  EXPECT_TRUE(told);
}

TEST(Interpreter, OnlineFillingRunsReadyMovableWorkWhileWaiting) {
  // 0 waits (arrives at its 6th test); 2 is encoder work that is ready; 3 a movable receive
  // that arrives late; 4 encoder work whose input comes with 3.
  const std::vector<Instruction> list = {make(Op::recv_activation, 0), make(Op::forward, 0), make(Op::encoder_task, 0),
                                         make(Op::recv_grad, 0, pipeline::kSyncOnly),
                                         make(Op::encoder_task, 1, pipeline::kBackwardTask)};
  Interpreter in;
  std::vector<int> finished;
  std::vector<int> computed;
  in.set(Op::recv_activation, [&](const Instruction&) { return arriving(6, finished, 0); });
  in.set(Op::recv_grad, [&](const Instruction&) { return arriving(3, finished, 3); });
  in.set(Op::forward, [&](const Instruction&) {
    computed.push_back(1);
    return Pending{};
  });
  in.set(Op::encoder_task, [&](const Instruction& i) {
    computed.push_back(i.microbatch == 0 ? 2 : 4);
    return Pending{};
  });
  train::FillRules rules;
  rules.movable = [&](int index) {
    const Instruction& i = list[static_cast<std::size_t>(index)];
    return i.op == Op::encoder_task || (i.flags & pipeline::kSyncOnly);
  };
  // 4 needs 3's message.
  rules.ready = [&](int index) {
    return index != 4 || std::find(finished.begin(), finished.end(), 3) != finished.end();
  };
  const auto ran = in.run(list, &rules);
  // While 0 waited: 2 ran, 3 was posted (not arrived), 4 was not ready; then 0, 1, 3, 4.
  EXPECT_EQ(indices(ran), (std::vector<int>{2, 0, 1, 3, 4}));
  EXPECT_EQ(computed, (std::vector<int>{2, 1, 4}));
  EXPECT_EQ(finished, (std::vector<int>{0, 3}));
  const auto at = [&](int index) {
    return *std::find_if(ran.begin(), ran.end(), [&](const Executed& e) { return e.index == index; });
  };
  // 3 was posted while 0 waited, before 1 started: its record starts there.
  EXPECT_LT(at(3).start, at(1).start);
  EXPECT_LT(at(2).start, at(0).end);

  // Without the rules the same list runs in order.
  finished.clear();
  computed.clear();
  EXPECT_EQ(indices(in.run(list)), (std::vector<int>{0, 1, 2, 3, 4}));
}

// A handler that waits in collectives it runs itself (tensor parallelism's) books the seconds
// as idle itself; each record gets what its own call booked, a receive posted early included,
// so that the executor counts them as waiting, not as the instruction's compute.
TEST(Interpreter, WaitsAHandlerBooksItselfAreItsInstructionsOwn) {
  const std::vector<Instruction> list = {make(Op::recv_activation, 0), make(Op::forward, 0), make(Op::encoder_task, 0),
                                         make(Op::backward, 0)};
  Interpreter in;
  double booked = 0;  // the work's own idle seconds, as StepResult::idle holds them
  std::vector<int> finished;
  in.set(Op::recv_activation, [&](const Instruction&) {
    booked += 0.25;  // posting it waited too
    return arriving(3, finished, 0);
  });
  in.set(Op::forward, [&](const Instruction&) {
    booked += 1.5;
    return Pending{};
  });
  in.set(Op::encoder_task, [&](const Instruction&) {
    booked += 0.125;
    return Pending{};
  });
  in.set(Op::backward, [](const Instruction&) { return Pending{}; });
  in.count_waits_inside([&] { return booked; });
  train::FillRules rules;
  rules.movable = [&](int index) { return list[static_cast<std::size_t>(index)].op == Op::encoder_task; };
  rules.ready = [](int) { return true; };
  const auto ran = in.run(list, &rules);
  EXPECT_EQ(indices(ran), (std::vector<int>{2, 0, 1, 3}));  // the encoder task while 0 waited
  std::vector<double> inside(4);
  for (const auto& e : ran) inside[static_cast<std::size_t>(e.index)] = e.waited_inside;
  EXPECT_EQ(inside, (std::vector<double>{0.25, 1.5, 0.125, 0.0}));
}

}  // namespace
}  // namespace braid
