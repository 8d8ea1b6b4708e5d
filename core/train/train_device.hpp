// What runs a trainer's ops (`braid train --device`): braid's host ops called directly, or
// a device backend through the device interface v2 (nn::DeviceOps over a plugin), with the
// trainer's tensors resident in the backend's memory or staged per op.
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

// "" for a name open_train_device takes, else what is wrong with it.
std::string train_device_problem(const std::string& name);

// `name`:
//  auto         the host ops called directly;
//  host         the host backend, libbraid-host.so, through the device interface: the path
//               a GPU backend takes, on host memory (its memory is the trainer's);
//  host-staged  the same backend behind StagedOps: each op copies its inputs in and its
//               outputs out, as on a GPU (testable without one);
//  emulated     the host backend as an emulated device (BRAID_HOST_MEMORY=separate): the
//               trainer's tensors live in the backend's memory, which braid never touches as
//               host memory, and cross to the host only to be sent, reduced, checkpointed or
//               evaluated: the data path of cuda, testable without a GPU;
//  cuda         the CUDA backend on GPU local_rank % (GPUs on the node), resident as emulated.
// `threads` is the host ops' thread count. Throws Error(invalid_argument) for another name,
// Error(plugin) when the backend cannot start (no GPU...).
TrainDevice open_train_device(const std::string& name, int threads, int local_rank = 0);

// "host backend (...): peak 12.3 MiB in use, 14.0 MiB reserved, 5234 allocations", or ""
// without a backend.
std::string device_memory_line(const TrainDevice& device);

}  // namespace braid::train
