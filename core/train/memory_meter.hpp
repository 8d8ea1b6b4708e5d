// What one rank of the trainer holds, by the planner's kinds of memory, measured at the
// boundaries of the instructions it runs; and those peaks next to what the cost model
// predicts for the same plan and rank (plan::device_memory), so that "measured memory =
// predicted memory" is a figure every run prints.
//
// Kinds, as plan::MemoryBreakdown counts them:
//   weights, gradients, optimizer  the bytes of the tensors this rank trains (value and its
//                                  ZeRO shard, grad and its ZeRO shard, Adam m and v) as they
//                                  are at the sample: whatever sharding (ZeRO, tensor
//                                  parallelism) made of them, plus registered sources
//   communication                  registered sources only: the host (or device) buffers braid's
//                                  DP collectives copy through (comm_buffer.hpp); the planner's
//                                  counterpart is cost::CostModel::collective_buffer_bytes
//   messages                       registered sources only: point-to-point sends in flight,
//                                  which the cost model does not predict
//   activations                    everything else the step allocates: heap in use (glibc's
//                                  mallinfo2, all arenas and mmapped blocks) minus the heap in
//                                  use when the step began, minus what the other kinds grew by
//                                  since then, floored at 0. That is activations, caches and
//                                  temporaries alive across an instruction boundary: what the
//                                  planner's "activations" stands for. Other threads of the
//                                  process (data workers rendering samples ahead) add their
//                                  allocations too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/plan/plan.hpp"
#include "core/runtime/communicator.hpp"
#include "core/spec/run.hpp"
#include "core/train/stage_work.hpp"

namespace braid::cost {
class CostModel;
}  // namespace braid::cost

namespace braid::train {

enum class MemoryKind { weights, gradients, optimizer, activations, communication, messages };
inline constexpr int kMemoryKinds = 6;
// "weights", "gradients", "optimizer", "activations", "communication", "messages"
const char* memory_kind_name(MemoryKind k);
// Whether the cost model predicts the kind (all but messages).
inline bool predicted_kind(MemoryKind k) { return k != MemoryKind::messages; }

// Bytes by kind, and their total.
struct MemoryBytes {
  std::array<double, kMemoryKinds> bytes{};
  // The sum of the kinds at one moment (for peaks: the largest such sum, which may be less
  // than the sum of the kinds' own peaks).
  double total = 0;

  double& operator[](MemoryKind k) { return bytes[static_cast<std::size_t>(k)]; }
  double operator[](MemoryKind k) const { return bytes[static_cast<std::size_t>(k)]; }
};

class MemoryMeter {
 public:
  // `params` (the executor's) are read at every sample; they outlive the meter.
  explicit MemoryMeter(const std::vector<TrainedParameter>& params);

  // Adds `bytes()` to `kind` at every sample: communication buffers in flight (the stage
  // work's sends). Sources hold heap memory of this process (it is taken out of the activations).
  // Error(invalid_argument) for activations, which are measured, not reported.
  void add_source(MemoryKind kind, std::function<std::size_t()> bytes);

  // Heap memory the process holds but does not use, e.g. the freed blocks a device
  // backend's caching pool keeps in host memory: taken out of the heap in use.
  void add_idle_heap(std::function<std::size_t()> bytes);

  // Activations that live in a device's memory (tensors resident there): measured from its
  // bytes in use, `in_use()`, instead of from the heap.
  void measure_activations_on_device(std::function<std::size_t()> in_use);

  // At the start of a step, before any of its activations exist: a sample, and before the
  // first step the heap baseline activations are measured from.
  void begin_step();
  // After an instruction: the bytes of every kind now, and the peaks.
  void sample();

  // Each kind's largest value over every sample so far; total: the largest total at a sample.
  const MemoryBytes& peak() const { return peak_; }
  const MemoryBytes& last() const { return last_; }
  std::int64_t samples() const { return samples_; }

  // Bytes of heap this process has in use (mallinfo2: uordblks + hblkhd).
  static std::size_t heap_in_use();

 private:
  // Weights, gradients, optimizer and communication now (activations 0).
  MemoryBytes tracked() const;

  const std::vector<TrainedParameter>* params_;
  std::vector<std::pair<MemoryKind, std::function<std::size_t()>>> sources_;
  std::vector<std::function<std::size_t()>> idle_;
  std::function<std::size_t()> device_in_use_;
  double heap_used() const;  // the device's bytes in use, or the heap in use less the idle heap
  double heap_at_start_ = 0, tracked_at_start_ = 0;
  MemoryBytes peak_, last_;
  std::int64_t samples_ = 0;
};

// One rank's measured peaks and the cost model's prediction for its device.
struct RankMemory {
  MemoryBytes measured;
  // communication: the DP collectives' buffers; total: at the peak, without the reserved memory,
  // which the measurement's baseline (the heap before the first step) leaves out too.
  MemoryBytes predicted;
  double predicted_reserved = 0;  // the cluster's reserved memory (runtime, communicator buffers)
};

struct MemoryComparison {
  spec::Precision run_precision = spec::Precision::fp32;  // the run file's
  spec::Precision predicted_as = spec::Precision::fp32;   // the trainer's: the prediction uses it
  std::vector<RankMemory> ranks;                          // by rank
  std::string prediction_error;                           // why there is no prediction ("" when there is)
};

// Collective over `world`: every rank's peaks from `mine`, and for each rank the memory `cost`
// predicts for its device under `plan` (computed on every rank): the cost model the trainer
// prices its step on (the run file `run` as the trainer runs it, as_trained.hpp, on the samples
// it trains, with braid's kernels).
MemoryComparison compare_with_prediction(const MemoryMeter& mine, const spec::RunSpec& run, const cost::CostModel& cost,
                                         const plan::Plan& plan, runtime::Communicator& world);
// A header line, then per rank and kind: measured MiB, predicted MiB, measured/predicted.
std::string format_memory_comparison(const MemoryComparison& c);
// The same as one JSON object for the metrics file: {"step": step, "memory": true, ...}.
std::string memory_json(const MemoryComparison& c, std::int64_t step);

}  // namespace braid::train
