// Discrete-event simulation of a pipeline program. Each rank (one DP replica of a
// stage: its TP devices run in lock step) has a compute stream and a send stream;
// sends are non-blocking, receives wait for their messages, collectives (ReduceGrads
// of a stage's replicas, a group's BatchSync) wait for every member. Messages between
// two stages match in order per (sender, receiver, kind, microbatch); with unequal DP
// widths a receiver takes one message from each of the senders mapped to it.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/pipeline/program.hpp"

namespace braid::sim {

// Why a device's compute stream was idle. The pipeline causes follow Optimus'
// breakdown (Feng et al., ATC'25, Table 1): warm-up is idle time before the stage's
// first forward, cool-down after its last backward, other PP waits in between.
enum class Cause {
  dp_start,     // DP collectives before the first forward
  dp_end,       // DP collectives after the last backward (and waiting for the slowest replica)
  dp_shard,     // ZeRO-2/3 collectives during the pipeline
  pp_warmup,    // waiting before the stage's first forward
  pp_cooldown,  // waiting after the stage's last backward, and for its pipeline to finish the step
  pp_other,     // other waits on pipeline neighbours
  tp,           // tensor-parallel collectives inside forward/backward
  batch_sync,   // contrastive batch-sync: waiting for the group, and the sync itself
  imbalance,    // finished early, waiting for slower branches or modules outside its pipeline
};
constexpr int kCauseCount = 9;
const char* cause_name(Cause c);

struct StageStats {
  std::string name;
  int replicas = 1, devices_per_replica = 1;
  double busy_s = 0, idle_s = 0;  // per device, mean over replicas
  std::array<double, kCauseCount> bubbles{};
  double peak_memory_bytes = 0;  // static + peak activations, worst replica
  double finish_s = 0;
};

// One interval on a rank's timeline, for traces.
struct TraceEvent {
  int rank = 0;
  int lane = 0;  // 0 compute, 1 send, 2 collectives
  int stage = 0;
  int instruction = 0;
  double start = 0, duration = 0;
  // Of the duration, the collectives the instruction runs and waits for itself (tensor
  // parallelism's, ZeRO-2/3's per microbatch): idle, not compute, as braid train counts them.
  double waited = 0;
};

struct Result {
  double step_time_s = 0;
  double bubble_fraction = 0;                 // idle share of device time
  std::array<double, kCauseCount> bubbles{};  // idle seconds per device, mean over devices
  std::vector<StageStats> stages;
  double peak_memory_gib = 0;
  double mfu = 0;
  int ranks = 0, devices = 0;
  long long events = 0;  // instructions executed
  std::vector<TraceEvent> trace;
  std::vector<int> rank_stage, rank_replica;  // rank -> stage, replica
};

struct Options {
  bool trace = false;
  int trace_replicas = 1;  // replicas per stage recorded in the trace (-1: all)
};

// Throws Error(Status::invalid_argument) naming the stuck instruction of every
// blocked stage when the program deadlocks, or a send without its receive.
Result simulate(const pipeline::Program& program, const Options& options = {});

}  // namespace braid::sim
