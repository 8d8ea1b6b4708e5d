// The training loop of `braid train`: builds the reference model and the executor for this
// rank, then per step the learning rate, the executor's step, the progress line and the
// metrics file on rank 0, periodic held-out evaluation, and checkpoints (resumable,
// bit-identical: the data of a step, the weights and the optimizer state are all that a
// step depends on).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/runtime/world.hpp"
#include "core/spec/run.hpp"
#include "core/train/agree.hpp"
#include "core/train/memory_meter.hpp"
#include "core/train/metrics.hpp"
#include "core/train/op_profile.hpp"
#include "core/train/timing.hpp"

namespace braid::train {

struct TrainOptions {
  spec::RunSpec run;  // its cluster holds the world's devices (see fit_cluster_to_world)
  plan::Plan plan;
  std::int64_t steps = 0;                  // 0: the run file's trainer.steps
  std::optional<std::uint64_t> seed;       // weights and data; default: the run's data seed
  std::string metrics_path;                // JSON lines; "" for none
  std::string checkpoint_dir;              // "" for no checkpoints
  bool resume = false;                     // continue from the newest valid checkpoint in checkpoint_dir
  bool override_lr_schedule = false;       // resume a checkpoint of another learning-rate schedule (lr_schedule.hpp)
  std::string gradients_dir;               // tests: each step's reduced gradients, as checkpoint shards
  bool reorder = true;                     // DistTrain intra-step reordering over DP replicas
  int data_workers = 1;                    // threads rendering the next steps' samples ahead (0: none)
  std::optional<spec::Schedule> schedule;  // the program's schedule (nullopt: the plan's default)
  std::string trace_path;                  // "": none; else a Chrome trace of the last step as measured
  bool profile_ops = false;                // time every op of the timed steps against its price (op_profile.hpp)
  // Called with an error thrown inside a step while its messages are still pending (the CLI
  // reports it and aborts the world); the error is rethrown when it returns.
  std::function<void(const std::exception_ptr&)> on_fatal;
  // Runs checks every rank makes before training (the layout, the model and data, the device,
  // the gradient-dump directory, each rank's program and stage, the checkpoint directory, the
  // resume) so that a failure is said once and every rank stops alike (the CLI:
  // agree_on_setup), throwing when one failed; null: the checks run as they are.
  Agree agree;
  int threads = 0;                  // host threads; 0: the run file's, else cores / local processes
  std::string device = "auto";      // auto | host | cuda: what runs the ops (see train_device.hpp)
  std::int64_t progress_every = 1;  // rank 0 prints a progress line every N steps; 0: none
  bool live_progress = false;       // a terminal: one progress line rewritten after every step
};

struct TrainReport {
  RunSummary summary;
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  double wait_seconds = 0;       // this rank's time blocked in receives and collectives
  std::string layout;            // this rank's part
  StepComparison comparison;     // measured against simulated, every rank's steps
  MemoryComparison memory;       // every rank's peak memory by kind against the cost model's (empty: no step ran)
  std::optional<OpProfile> ops;  // with TrainOptions::profile_ops and a step timed
};

// A copy of `run` whose cluster has exactly `world` devices (nodes of the run's node width,
// or one node of `world` when fewer), so the planner lays out the processes there are.
spec::RunSpec fit_cluster_to_world(const spec::RunSpec& run, int world);

// Runs the training; `out` gets rank 0's progress, evaluation and summary lines, `log` the
// notes every rank may print (resume decisions). Throws braid::Error on bad input or a
// failed collective; checkpoints already committed stay intact.
TrainReport train(const TrainOptions& options, runtime::World& world, std::ostream& out, std::ostream& log);

}  // namespace braid::train
