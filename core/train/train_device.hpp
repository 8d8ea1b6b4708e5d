// What runs a trainer's ops (`braid train --device`): braid's host ops called directly, or
// a device backend through the device interface v2 (nn::DeviceOps over a plugin).
#pragma once

#include <memory>
#include <string>

#include "core/nn/device_backend.hpp"
#include "core/nn/ops.hpp"

namespace braid::train {

struct TrainDevice {
  std::unique_ptr<nn::Ops> ops;
  std::shared_ptr<nn::DeviceBackend> backend;  // null for the host ops called directly
  std::string description;                     // for the run's first lines
};

// `name`:
//  auto         the host ops called directly;
//  host         the host backend, libbraid-host.so, through the device interface: the path
//               a GPU backend takes, on host memory (its memory is the trainer's);
//  host-staged  the same backend behind StagedOps: each op copies its inputs in and its
//               outputs out, as on a GPU (testable without one);
//  cuda         the CUDA backend behind StagedOps, on GPU local_rank % (GPUs on the node):
//               the trainer keeps its tensors in host memory, so every op copies (correct,
//               bound by the copies) until its stages keep them on the device.
// `threads` is the host ops' thread count. Throws Error(invalid_argument) for another name,
// Error(plugin) when the backend cannot start (no GPU...).
TrainDevice open_train_device(const std::string& name, int threads, int local_rank = 0);

// "host backend (...): peak 12.3 MiB in use, 14.0 MiB reserved, 5234 allocations", or ""
// without a backend.
std::string device_memory_line(const TrainDevice& device);

}  // namespace braid::train
