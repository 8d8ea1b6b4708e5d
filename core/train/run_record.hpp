// What a run's steps depend on besides its learning-rate schedule (lr_schedule.hpp): the model's
// modules, the data (sizes, distributions, seed), the batch and the contrastive groups, the
// optimizer's other settings, and the seed of the weights and data. Each checkpoint records them field by field, and a
// resume compares them: a run file moved, copied or renamed still continues its run, while one whose model, data or
// optimizer settings changed since the checkpoint is refused, naming the field. The cluster, the layout and the
// trainer's steps, evaluation, checkpointing and threads may change (the learning-rate schedule is lr_schedule.hpp's to
// compare).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/spec/run.hpp"
#include "core/train/checkpoint.hpp"

namespace braid::train {

struct RunRecord {
  // ("model.image_encoder.heads", "4"), ("data.image.median", "24"), ... in a fixed order.
  std::vector<std::pair<std::string, std::string>> fields;

  static RunRecord of(const spec::RunSpec& run, std::uint64_t seed);
  bool operator==(const RunRecord&) const = default;

  // Writes the record into a checkpoint (one blob of "field=value" lines); reads it back
  // (nullopt: a checkpoint written before braid recorded it).
  void record(CheckpointContents& c) const;
  static std::optional<RunRecord> recorded(const CheckpointContents& c);
};

// Resuming checkpoint `c` as the run `now`: "" when `c` records the same fields (or none),
// else what differs, for an error: "checkpoint 'F' was trained on another run: its
// data.image.median was 24, this run's 20 (and 2 more fields: ...)".
std::string run_change(const CheckpointContents& c, const RunRecord& now);

}  // namespace braid::train
