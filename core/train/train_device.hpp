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
//  auto  the host ops called directly (until the trainer keeps tensors on a GPU, a GPU
//        does not change what auto picks);
//  host  the host backend, libbraid-host.so, through the device interface: the path a GPU
//        backend takes, on host memory;
//  cuda  refused with the reason: the trainer's stages read and write activations and
//        messages in host memory, so its tensors cannot live on a GPU yet.
// `threads` is the host ops' thread count either way. Throws Error(invalid_argument) for
// another name, Error(plugin) when the backend cannot start.
TrainDevice open_train_device(const std::string& name, int threads);

// "host backend (...): peak 12.3 MiB in use, 14.0 MiB reserved, 5234 allocations", or ""
// without a backend.
std::string device_memory_line(const TrainDevice& device);

}  // namespace braid::train
