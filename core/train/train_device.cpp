#include "core/train/train_device.hpp"

#include <cstdio>
#include <cstdlib>

#include "core/common/error.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/staged_ops.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid::train {

namespace {

std::string backend_text(const nn::DeviceBackend& b) {
  return b.name() + " backend " + b.plugin().path() + " (device interface " +
         std::to_string(b.plugin().interface_version()) + ", " + b.info().name + ")";
}

}  // namespace

TrainDevice open_train_device(const std::string& name, int threads, int local_rank) {
  TrainDevice d;
  if (name == "auto") {
    auto ops = std::make_unique<nn::HostOps>(threads);
    d.description = "host ops (" + std::to_string(ops->threads()) + " threads)";
    d.ops = std::move(ops);
    return d;
  }
  if (name == "host" || name == "host-staged") {
    // The plugin's ops take their thread count from the environment when they start.
    ::setenv("BRAID_HOST_THREADS", std::to_string(threads).c_str(), 1);
    d.backend = nn::DeviceBackend::open("host");
    if (name == "host") {
      d.ops = std::make_unique<nn::DeviceOps>(d.backend);
      d.description = backend_text(*d.backend);
    } else {
      d.ops = std::make_unique<nn::StagedOps>(d.backend);
      d.description = backend_text(*d.backend) + ", staged";
    }
    return d;
  }
  if (name == "cuda") {
    // The GPUs of this node in turn: several processes may share one (each its own context).
    auto plugin = runtime::load_device_plugin("cuda");
    const auto devices = plugin->devices();
    if (devices.empty())
      throw Error(Status::plugin, "--device cuda: no GPU: " + (plugin->unavailable_reason().empty()
                                                                   ? std::string("the CUDA plugin sees 0 devices")
                                                                   : plugin->unavailable_reason()));
    const int index = local_rank % static_cast<int>(devices.size());
    plugin.reset();
    d.backend = nn::DeviceBackend::open("cuda", index);
    d.ops = std::make_unique<nn::StagedOps>(d.backend);
    d.description = backend_text(*d.backend) + ", device " + std::to_string(index) +
                    ", staged: every op copies its inputs to the GPU and its outputs back, as the trainer keeps its "
                    "tensors in host memory (correct, bound by the copies)";
    return d;
  }
  throw Error(Status::invalid_argument, "--device must be auto, host, host-staged or cuda, got '" + name + "'");
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
