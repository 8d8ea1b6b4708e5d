#include "core/calibrate/probe.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include "core/calibrate/turns.hpp"
#include "core/common/scoped_env.hpp"
#include "core/nn/device_backend.hpp"

namespace braid::calibrate {

ProbeShape probe_shape(const ComputeOptions& o) {
  if (o.device && !o.device->device().is_host()) return {2048, 1024};  // launch-bound below that
  return {1024, 128};                                                  // 33.6 MFLOP a GEMM: a millisecond of one core
}

double probe_linear(runtime::Communicator& all, int local_index, int local_count, const ComputeOptions& o,
                    ProbeShape shape) {
  const bool gpu = o.device && !o.device->device().is_host();
  const int cores = gpu ? o.device->device_count() : static_cast<int>(std::thread::hardware_concurrency());
  Turns turns = Turns::on_host(all, local_index, local_count, std::max(1, cores), gpu ? 1 : o.threads);
  std::optional<ScopedEnv> sleepy;  // a process waiting for its turn hands its core over
  if (turns.turns() > 1 && !std::getenv("BRAID_MPI_WAIT")) sleepy.emplace("BRAID_MPI_WAIT", "sleep");
  turns.before_case();
  double seconds[1] = {time_linear(o, shape.rows, shape.width)};
  turns.end();
  all.allreduce(std::span<double>(seconds), runtime::ReduceOp::max);
  return seconds[0];
}

}  // namespace braid::calibrate
