// Processes that take turns on their host's cores while they time compute (braid calibrate's
// cases, braid train's host probe): with more processes x threads on a host than it has cores,
// `per_turn` of them run a case at once while the others wait in a barrier, so the figures are
// those of a process with cores of its own (the cluster file's `shared_cores` lets the
// simulator slow down what runs side by side). Every case is `turns` barrier-separated phases;
// the process runs in phase `mine`. Waiters should hand their cores over (BRAID_MPI_WAIT=sleep
// while turns() > 1).
#pragma once

#include "core/runtime/communicator.hpp"

namespace braid::calibrate {

class Turns {
 public:
  // Collective over `all`: this process is `local_index` of the `local_count` on its host,
  // which has `cores` cores (GPUs on a GPU host), and runs `threads` threads. Every process
  // takes part in as many turns as the most crowded host needs, so the barriers match.
  static Turns on_host(runtime::Communicator& all, int local_index, int local_count, int cores, int threads);

  int turns() const { return turns_; }
  int per_turn() const { return per_turn_; }  // processes of this host at once
  // Before a case: finish the previous case's phases after this process's, then wait out the
  // phases before it (the first case starts with every process in step).
  void before_case();
  // After the last case of a measurement.
  void end();

 private:
  Turns(runtime::Communicator& all, int turns, int mine, int per_turn)
      : all_(all), turns_(turns), mine_(mine), per_turn_(per_turn) {}
  void barriers(int n);

  runtime::Communicator& all_;
  int turns_, mine_, per_turn_;
  bool started_ = false;
};

}  // namespace braid::calibrate
