#include "core/train/train_device.hpp"

#include <cstdio>

#include "core/common/error.hpp"
#include "core/nn/device_ops.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/staged_ops.hpp"

namespace braid::train {

namespace {

std::string backend_text(const nn::DeviceBackend& b) {
  return b.name() + " backend " + b.plugin().path() + " (device interface " +
         std::to_string(b.plugin().interface_version()) + ", " + b.info().name + ")";
}

}  // namespace

std::string train_device_problem(const std::string& name) {
  for (const char* known : {"auto", "host", "host-staged", "emulated", "cuda"})
    if (name == known) return "";
  return "--device must be auto, host, host-staged, emulated or cuda, got '" + name + "'";
}

TrainDevice open_train_device(const std::string& name, int threads, int local_rank) {
  TrainDevice d;
  if (name == "auto") {
    auto ops = std::make_unique<nn::HostOps>(threads);
    d.description = "host ops (" + std::to_string(ops->threads()) + " threads)";
    d.ops = std::move(ops);
    return d;
  }
  if (name == "host" || name == "host-staged") {
    d.backend = nn::DeviceBackend::open_for_process("host", threads, local_rank);
    if (name == "host") {
      d.ops = std::make_unique<nn::DeviceOps>(d.backend);
      d.description = backend_text(*d.backend);
    } else {
      d.ops = std::make_unique<nn::StagedOps>(d.backend);
      d.description = backend_text(*d.backend) + ", staged";
    }
    return d;
  }
  if (name != "emulated" && name != "cuda") throw Error(Status::invalid_argument, train_device_problem(name));
  if (name == "emulated") {
    d.backend = nn::DeviceBackend::open_for_process("emulated", threads, local_rank);
  } else {
    try {
      d.backend = nn::DeviceBackend::open_for_process("cuda", threads, local_rank);
    } catch (const Error& e) {
      throw Error(e.status(), std::string("--device cuda: no GPU: ") + e.what());
    }
  }
  d.ops = std::make_unique<nn::DeviceOps>(d.backend);
  d.description = backend_text(*d.backend) + ", " + d.backend->device().name() +
                  ", tensors resident (host staging for messages, collectives, checkpoints)";
  return d;
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
