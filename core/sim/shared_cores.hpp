// Devices that are processes sharing their node's CPU cores (more processes x threads on a
// host than it has cores, as on a laptop or a CI runner): the OS time-slices the busy
// threads, so while more threads compute than there are cores, an instruction runs at
// efficiency x cores / busy threads of its speed (the efficiency, measured by `braid
// calibrate`, is what time-slicing and caches shared by turns cost), and at full speed
// while the others wait on messages. The simulator finds the timeline where every
// instruction's slowdown matches the load it overlaps (a fixed point, see simulate());
// this file computes the slowdowns of one timeline.
#pragma once

#include <vector>

#include "core/pipeline/program.hpp"

namespace braid::sim {

// When a rank's compute instruction ran: [start, end); end < start for instructions that
// compute nothing. spans[rank][instruction], ranks in the simulator's order (stage by
// stage, replicas in order).
struct Span {
  double start = 0, end = -1;
};
using Spans = std::vector<std::vector<Span>>;
// Multipliers of each compute instruction's time, indexed as Spans.
using Slowdowns = std::vector<std::vector<double>>;

class SharedCores {
 public:
  // True when the program's devices share cores and some node has more threads than cores.
  static bool applies(const pipeline::Program& program);
  explicit SharedCores(const pipeline::Program& program);

  // What each instruction of `spans` would take, as a multiple of its time alone, given the
  // threads busy beside it on its nodes: the reciprocal of its mean speed over its span
  // (a TP group in lock step runs at its slowest node's speed).
  Slowdowns slowdowns(const Spans& spans) const;

 private:
  struct Share {
    int node;
    int threads;
  };
  std::vector<std::vector<Share>> rank_nodes_;  // the threads a rank runs on each node it spans
  int nodes_ = 0;
  double cores_ = 0, efficiency_ = 1;
};

}  // namespace braid::sim
