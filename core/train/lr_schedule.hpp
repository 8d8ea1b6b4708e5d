// The learning-rate schedule of a run (linear warm-up, then cosine down to a floor over the
// run's steps) and its record in each checkpoint. The schedule depends on the run's length,
// so a run resumed with another --steps (or another trainer section) is not the run its
// checkpoint began; braid refuses that unless asked for, as Megatron-LM's scheduler does
// (--override-opt_param-scheduler there, --override-lr-schedule here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/spec/run.hpp"
#include "core/train/checkpoint.hpp"

namespace braid::train {

struct LrSchedule {
  double peak = 0;                // trainer.learning_rate
  std::int64_t warmup_steps = 0;  // trainer.warmup_steps
  double min_ratio = 0;           // trainer.min_lr_ratio: the floor, as a share of the peak
  std::int64_t total_steps = 0;   // the run's --steps (or trainer.steps)

  static LrSchedule of(const spec::TrainerSpec& t, std::int64_t total_steps);
  // The rate of `step` (1-based); past total_steps, the floor.
  double at(std::int64_t step) const;
  // "20 steps (peak 0.001, warm-up 10 steps, floor 0.1 of the peak)"
  std::string describe() const;
  bool operator==(const LrSchedule&) const = default;

  // Writes the schedule into a checkpoint; reads it back (nullopt: a checkpoint written
  // before braid recorded it).
  void record(CheckpointContents& c) const;
  static std::optional<LrSchedule> recorded(const CheckpointContents& c);
};

// Resuming at `next_step` under `now` a checkpoint `c` trained under another schedule: "" when
// the checkpoint's steps (1 to next_step - 1) trained at the rates `now` gives them (or it
// records no schedule), else the first step that did not, for an error (refused) or a note
// (--override-lr-schedule).
std::string schedule_change(const CheckpointContents& c, const LrSchedule& now, std::int64_t next_step);

}  // namespace braid::train
