// Turns a placement of encoder tasks into a program: the llm's instructions with the
// EncoderTasks inserted where placed, and the ordering messages that make every
// dependency explicit (so the simulator, and a runtime, enforce them).
#pragma once

#include <vector>

#include "core/bubble/encoder_tasks.hpp"

namespace braid::bubble {

// One placed task: encoder microbatch `microbatch`'s task `task` (index into its
// host's forward or backward list), emitted before llm instruction `slot` of its
// stage, or inside that instruction's TP waits.
struct Entry {
  int slot = 0;
  bool in_tp = false;
  bool backward = false;
  int encoder = 0, microbatch = 0, task = 0;
  bool in_dp = false;  // in a DP wait: a forward task before the stage's first llm instruction
                       // (the parameter all-gather), a backward one after its last (the reduction)
};
using Placement = std::vector<std::vector<Entry>>;  // per llm stage, in placement order

struct Emitted {
  pipeline::Program program;
  std::vector<std::vector<int>> llm_pc;  // [stage][llm instruction] -> its index in the program
};

// Microbatch ids of the ordering messages inside an encoder's own pipeline, apart
// from the llm's microbatch ids.
constexpr int kEncoderTag = 1 << 24;
constexpr int encoder_tag(int encoder, int microbatch) { return kEncoderTag + (encoder << 16) + microbatch; }

// `without_encoders`: the llm alone (the placement must be empty).
Emitted emit(const Colocated& c, const Placement& placement, bool without_encoders = false);

// What the scheduler and checker simulate of a program: one replica per stage, since the
// replicas of a colocated stage run alike; all of them where devices share cores, since
// there every replica's work loads the node (sim::SharedCores).
pipeline::Program simulated_replicas(pipeline::Program p);

}  // namespace braid::bubble
