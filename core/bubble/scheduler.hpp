// The Optimus bubble scheduler (Feng et al., ATC'25): a colocated plan's encoder
// work, cut into kernel-sized EncoderTasks, placed into the llm pipeline's bubbles.
//
//   plain   encoder first: every forward task before the llm starts, every backward
//           task after it ends (what a colocated engine does without a scheduler);
//   coarse  forwards fill each stage's pre-llm bubble (PP warm-up), backwards its
//           post-llm bubble (PP cool-down); what does not fit runs as late as the
//           llm's dependency allows, just before the llm forward that needs it;
//   fine    tasks may also fill every other pipeline wait and, kernel by kernel, the
//           sub-millisecond TP-collective waits inside llm forwards and backwards
//           (compute kernels only; the encoder's own communication never goes there).
//
// Each pass places tasks against a timeline of the llm's instructions, simulates the
// result event by event, re-places against the new timeline and keeps the best: the
// coarse pass never ends slower than plain, the fine pass never slower than coarse.
// Dependencies are explicit ordering messages, so the simulator (and a runtime)
// enforces them: encoder forward of microbatch j ends before the llm forward that
// needs it starts; the llm backward that feeds j ends before j's encoder backward
// starts; the encoder's own pipeline order holds. bubble::check verifies all of it.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/bubble/encoder_tasks.hpp"
#include "core/sim/simulator.hpp"

namespace braid::bubble {

// A figure of each schedule: encoder-first (plain), coarse, fine.
struct PerSchedule {
  double plain = 0, coarse = 0, fine = 0;
};

struct Report {
  double plain_step_s = 0, coarse_step_s = 0, fine_step_s = 0;
  // Share of the plain (encoder-first) schedule's idle device time each pass turned into
  // work. Its reference already holds the encoder: on every stage but the first, encoder
  // first runs the forwards inside the PP warm-up wait and the backwards inside the
  // cool-down, so this is what the passes add to that, not what the encoder fills.
  double recovered_coarse = 0, recovered_fine = 0;

  // Against the llm alone (the colocated step with no encoder task: the llm's 1F1B, its
  // DP and optimizer tail; Optimus' reference, whose bubbles the encoder is meant to
  // fill). Per device, mean over devices:
  double llm_step_s = 0;  // the llm alone's step
  double llm_idle_s = 0;  // its idle seconds (all causes: DP, PP, TP waits)
  double encoder_s = 0;   // encoder task seconds per step (compute and its own transfers)
  // Encoder seconds inside llm bubbles, H = encoder_s - (step - llm_step_s) (>= 0): the
  // encoder time that does not lengthen the step. Two shares of it, per schedule:
  //   bubble_filled  = H / llm_idle_s  the llm bubble time that encoder work fills;
  //   encoder_hidden = H / encoder_s   the encoder work that runs in llm bubbles. This is
  //                    the quantity Optimus' published coarse/fine shares rise with (they
  //                    grow as more GPUs leave each device less encoder work; see
  //                    docs/bubble-scheduler.md).
  PerSchedule bubble_filled, encoder_hidden;
  // Idle seconds per device by cause (sim::Cause order): plain schedule, fine schedule.
  std::array<double, sim::kCauseCount> bubbles_before{}, bubbles_after{};
  double scheduler_time_s = 0;
  int rounds = 0;                 // placements simulated
  long long encoder_tasks = 0;    // EncoderTasks per step on the busiest device
  long long tp_bubble_tasks = 0;  // of the fine schedule's tasks, those inside TP waits (all stages)
  long long dp_wait_tasks = 0;    // ... and those in the llm's DP waits (parameter all-gather, gradient reduction)
};

struct Schedules {
  Colocated layout;
  pipeline::Program plain, coarse, fine;
  // The fine program, run with online filling: an executor that finds the next instruction
  // waiting runs the next ready encoder task first. Simulated, it is the fine program.
  pipeline::Program online;
  Report report;
};

// Throws Error(Status::bad_config) when the plan is not a runnable colocated plan.
Schedules schedule(const cost::CostModel& cost, const plan::Plan& plan);

// The schedules of a colocated plan, the first being the default: optimus-fine,
// optimus-coarse, encoder-first, optimus-online.
std::vector<spec::Schedule> colocated_schedules();
// The program of `schedule`; Error(Status::unsupported) for one that is not colocated_schedules'.
const pipeline::Program& program_named(const Schedules& s, spec::Schedule schedule);

}  // namespace braid::bubble
