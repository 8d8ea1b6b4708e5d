// How fast this host computes now, against its calibration. braid train times one case of
// braid calibrate's GEMM ladder before its first step and after its last: a step measured
// slower than simulated is then told apart from a host that slowed down since it was
// calibrated (a shared virtual machine's speed drifts by 10-30% over minutes).
#pragma once

#include <cstdint>

#include "core/calibrate/measure.hpp"
#include "core/runtime/communicator.hpp"

namespace braid::calibrate {

// The case: the linear op (three GEMMs) of `rows` x `width` activations through a `width` x
// `width` weight, a point of the ladder on the device it runs on, compute-bound there.
struct ProbeShape {
  std::int64_t rows = 0, width = 0;
};
ProbeShape probe_shape(const ComputeOptions& o);

// Collective over `all`: every process times the case as braid calibrate times its GEMMs (in
// turns where the processes' threads outnumber the host's cores, the waiting ones sleeping);
// the slowest process's seconds. This process is `local_index` of `local_count` on its host.
// `o` should be quick (the trainer's probes take tens of milliseconds), as when calibrated.
double probe_linear(runtime::Communicator& all, int local_index, int local_count, const ComputeOptions& o,
                    ProbeShape shape);

}  // namespace braid::calibrate
