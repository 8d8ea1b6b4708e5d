// The one interpreter of pipeline programs: a rank runs its stage's instruction list (the
// plan's program, orchestrate::build_program's) through a table of
// handlers keyed by opcode, as DeepSpeed's PipelineEngine does with its _INSTRUCTION_MAP.
// The reference trainer's stage work (core/train clip_stage, chain_stage) fills the table;
// a host engine's or a GPU backend's handlers can fill it just as well.
//
// A handler that posts a receive or a collective returns it as Pending instead of
// waiting, so the interpreter sees the wait coming. With online filling (Optimus, beyond
// its offline schedule) it then runs movable instructions from later in the list (encoder
// tasks and the ordering messages of the encoder's own pipeline) whose inputs are already
// there, until the wait is over or nothing is ready; a wrong prediction of the bubble
// scheduler then costs little. Movable instructions start in their order among themselves
// (a movable receive may finish after later ones; the readiness rules guard their data).
//
// What ran is recorded (index, start, end, seconds blocked), so "executed = planned" is a
// test and a measured step becomes a trace.
#pragma once

#include <array>
#include <exception>
#include <functional>
#include <vector>

#include "core/pipeline/program.hpp"

namespace braid::train {

// A receive or collective a handler posted: `test` says whether it completed (without
// blocking), `finish` waits for it, completes the instruction and returns the seconds it
// blocked. An empty Pending: the handler finished the instruction itself.
struct Pending {
  std::function<bool()> test;
  std::function<double()> finish;
  bool empty() const { return !finish; }
};
using Handler = std::function<Pending(const pipeline::Instruction&)>;

// One instruction as it ran: its index in the stage's list, steady-clock seconds.
struct Executed {
  int index = 0;
  double start = 0, end = 0;
  double waited = 0;  // blocked waiting for its receive or collective
  // Blocked in collectives its handler ran and waited for itself (tensor parallelism's inside a
  // forward or backward, ZeRO's after the optimizer step), which the work books as idle itself.
  double waited_inside = 0;
};

// Online filling: which instructions may run ahead of one that waits, and when they may.
struct FillRules {
  std::function<bool(int index)> movable;
  std::function<bool(int index)> ready;  // its inputs are there (movable instructions only)
};

// Steady-clock seconds, the clock Executed uses (one clock for every process on a host).
double now_seconds();

class Interpreter {
 public:
  void set(pipeline::Op op, Handler handler);
  const Handler& handler(pipeline::Op op) const { return table_[static_cast<std::size_t>(op)]; }
  // Called after each instruction completes, once its end time is taken (the executor's
  // memory meter samples there); empty: nothing.
  void after_instruction(std::function<void()> f) { after_ = std::move(f); }
  // The seconds the handlers have booked so far as blocked in collectives they ran themselves:
  // each Executed's waited_inside is what its handler's call added. Empty: none.
  void count_waits_inside(std::function<double()> booked) { booked_ = std::move(booked); }
  // Runs every instruction of `list` once: in order, or with `fill`, movable ones early
  // while the next instruction waits. Throws Error(Status::internal) naming the opcode when
  // one has no handler. Returns what ran, in the order it ran. A handler's exception goes to
  // `on_error` first, while the receives and collectives already posted are still alive:
  // tearing them down waits for them, and the peers they wait for may be waiting for this
  // rank; a multi-process caller ends the world there.
  std::vector<Executed> run(const std::vector<pipeline::Instruction>& list, const FillRules* fill = nullptr,
                            const std::function<void(const std::exception_ptr&)>& on_error = {}) const;

 private:
  std::array<Handler, pipeline::kOpCount> table_;
  std::function<void()> after_;
  std::function<double()> booked_;
};

}  // namespace braid::train
