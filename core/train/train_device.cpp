#include "core/train/train_device.hpp"

#include <cstdio>
#include <cstdlib>

#include "core/common/error.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"

namespace braid::train {

TrainDevice open_train_device(const std::string& name, int threads) {
  TrainDevice d;
  if (name == "auto") {
    auto ops = std::make_unique<nn::HostOps>(threads);
    d.description = "host ops (" + std::to_string(ops->threads()) + " threads)";
    d.ops = std::move(ops);
    return d;
  }
  if (name == "host") {
    // The plugin's ops take their thread count from the environment when they start.
    ::setenv("BRAID_HOST_THREADS", std::to_string(threads).c_str(), 1);
    d.backend = nn::DeviceBackend::open("host");
    d.ops = std::make_unique<nn::DeviceOps>(d.backend);
    d.description = "host backend " + d.backend->plugin().path() + " (device interface " +
                    std::to_string(d.backend->plugin().interface_version()) + ", " + d.backend->info().name + ")";
    return d;
  }
  if (name == "cuda")
    throw Error(Status::unsupported,
                "--device cuda: the CUDA backend implements the device interface (braid info lists it), but the "
                "trainer's stages still read and write activations and messages in host memory, so training cannot "
                "keep its tensors on a GPU yet; use --device host (the same path on host memory) or auto");
  throw Error(Status::invalid_argument, "--device must be auto, host or cuda, got '" + name + "'");
}

std::string device_memory_line(const TrainDevice& device) {
  if (!device.backend) return "";
  const nn::DeviceMemoryStats s = device.backend->memory_stats();
  char line[256];
  std::snprintf(line, sizeof line,
                "device memory (%s backend): peak %.1f MiB in use, %.1f MiB reserved, %llu allocations\n",
                device.backend->name().c_str(), static_cast<double>(s.peak_in_use) / (1 << 20),
                static_cast<double>(s.reserved) / (1 << 20), static_cast<unsigned long long>(s.allocations));
  return line;
}

}  // namespace braid::train
