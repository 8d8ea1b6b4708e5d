// What a run measured of its steps, next to what the simulator predicts for the very
// program the ranks executed: the step time, the ratio, and the idle time per rank by
// cause (pipeline warm-up, cool-down and other waits, DP, TP, batch-sync); and a measured
// step as a Chrome trace in the format of `braid simulate --trace`, so the two load side
// by side in Perfetto.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/pipeline/program.hpp"
#include "core/runtime/communicator.hpp"
#include "core/sim/simulator.hpp"
#include "core/train/interpreter.hpp"
#include "core/train/rank_program.hpp"
#include "core/train/stage_work.hpp"
#include "core/train/trained_load.hpp"

namespace braid::train {

// This rank's steps, summed.
struct MeasuredSteps {
  std::int64_t steps = 0;
  double seconds = 0;
  double data_seconds = 0;
  std::array<double, sim::kCauseCount> idle{};
  std::array<double, pipeline::kComputeKinds> compute{};
  // Times the host waited for the device (DeviceBackend::host_waits); -1: no device.
  std::int64_t host_waits = -1;
  // The steps (indices among the timed ones, ascending: replayed_steps) whose images are kept
  // for the simulator to replay, and those images (StepResult's), in order.
  std::vector<std::int64_t> replayed;
  std::vector<RankSides> sides;
  void add(const StepResult& r);
};

// Timed steps at most that the simulator replays on their own images, evenly spread.
constexpr std::int64_t kReplayedSteps = 16;
// Which of `steps` timed steps (indices from 0, ascending).
std::vector<std::int64_t> replayed_steps(std::int64_t steps);

struct StepComparison {
  spec::Schedule schedule = spec::Schedule::one_f_one_b;
  std::int64_t steps = 0;
  double measured_step_s = 0;  // the slowest rank's mean step
  // The program's simulated step on the batches the ranks trained (trained_load.hpp), the
  // mean over up to kReplayedSteps of the timed steps; without them, as priced.
  double simulated_step_s = 0;
  double priced_step_s = 0;  // the program as priced: every microbatch at the trained images' mean
  std::int64_t replayed_steps = 0;
  std::vector<std::string> as_trained;  // the run file's settings the program is priced otherwise (AsTrained)
  std::string replay_problem;           // why there was no replay, when one was asked for and failed (rank 0)
  // Taking the step's samples, per rank and step (mean over ranks): measured (StepResult::
  // data_seconds), and simulated as the replay prices the samples made in the step's time.
  double measured_data_s = 0, simulated_data_s = 0;
  std::array<double, sim::kCauseCount> measured_idle_s{}, simulated_idle_s{};  // per rank and step
  // Compute per rank and step by pipeline::WorkKind, mean over ranks (devices); simulated as
  // simulated_step_s is (where forwards and backwards are mispriced apart, a pipeline's
  // critical path is, even when their sum is right).
  std::array<double, pipeline::kComputeKinds> measured_compute_s{}, simulated_compute_s{};
  double host_waits_per_step = -1;  // the most of any rank; -1: no device
  // The host's speed before the first step and after the last (calibrate/probe.hpp): the
  // cluster file's probe (a GEMM case) timed again over its calibrated time, the slowest
  // rank's; 1 is the host as calibrated, 1.2 a host 20% slower. 0: not probed (no probe in
  // the file).
  double probe_before = 0, probe_after = 0;
  double ratio() const { return simulated_step_s > 0 ? measured_step_s / simulated_step_s : 0; }
};

// Collective over `world`: every rank's steps against the simulation of `program`, replayed on
// the batches each step trained when `load` is given (rank 0 prices them).
StepComparison compare_with_simulation(const MeasuredSteps& mine, const pipeline::Program& program,
                                       runtime::Communicator& world, TrainedLoad* load);
// "measured step 12.34 ms ..., simulated ...: measured/simulated 0.53" and the idle lines.
std::string format_comparison(const StepComparison& c);
// The same as one JSON object for the metrics file: {"step": step, "summary": true, ...}.
std::string comparison_json(const StepComparison& c, std::int64_t step);

// Collective over `world`: every rank's `executed` instructions of one step laid out as a
// simulated step's trace (one process per rank); rank 0 writes it to `path` atomically.
void write_measured_trace(const std::string& path, const RankProgram& program, const std::vector<Executed>& executed,
                          runtime::Communicator& world);

}  // namespace braid::train
