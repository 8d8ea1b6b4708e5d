// The trainer's all-reduces on the device's memory, through a device communication plugin
// (braid_comm_v2.h): NCCL for `--device cuda` with a GPU per process, the MPI plugin's
// interface v2 for `--device emulated`, so CI runs this path. They are the data-parallel
// gradient all-reduce and tensor parallelism's all-reduces. Without a plugin they cross to
// the host and go through the MPI plugin (host_staging.hpp), as the trainer's other
// messages and collectives do.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/nn/device_backend.hpp"
#include "core/nn/modules/parameter.hpp"
#include "core/runtime/device_comm.hpp"
#include "core/runtime/world.hpp"
#include "core/train/comm_buffer.hpp"
#include "core/train/interpreter.hpp"

namespace braid::train {

// One group's communicator on the device (a DP or a TP group).
class DeviceGroup {
 public:
  DeviceGroup(std::shared_ptr<nn::DeviceBackend> backend, std::unique_ptr<runtime::DeviceCommunicator> comm)
      : backend_(std::move(backend)), comm_(std::move(comm)) {}
  // Sums the gradients of `params` (the trainable ones) over the group in one all-reduce on
  // the device, in the order allreduce_gradients uses on the host: in place where they lie
  // end to end, else through a buffer on the device reported to `bytes` (comm_buffer.hpp).
  // Returns the seconds blocked.
  double allreduce_gradients(const std::vector<nn::Parameter*>& params, CommBytes& bytes);
  // The same, posted: copied out now and back when it finishes where there is a buffer. The
  // params and `bytes` must outlive it.
  Pending post_allreduce_gradients(const std::vector<nn::Parameter*>& params, CommBytes& bytes);
  // Sums `t` (on the backend's device) over the group in place; returns the seconds blocked.
  double allreduce_sum(nn::Tensor& t);

 private:
  std::shared_ptr<nn::DeviceBackend> backend_;
  std::unique_ptr<runtime::DeviceCommunicator> comm_;
};

class DeviceCollectives {
 public:
  // Seconds a device collective may wait before its communicator is aborted with an error
  // (a rank that died or hangs), rather than waiting forever as NCCL would.
  static constexpr double kDeadlineSeconds = 600.0;

  // The plugin for `device`, started on every rank of `world` (collective), or null with
  // `why_not` saying why: a device without one (the host ops; the host backend on host
  // memory), processes sharing a GPU (NCCL refuses them), or a plugin that failed to load or
  // start on some rank. Ranks agree before starting it and after, so none waits for another
  // that gave up.
  static std::unique_ptr<DeviceCollectives> open(const std::shared_ptr<nn::DeviceBackend>& backend,
                                                 runtime::World& world, std::string& why_not);
  // "nccl (NCCL 2.28.3): the data-parallel and tensor-parallel all-reduces on the device"
  std::string description() const;
  // A communicator over `world_ranks`, made by exactly those ranks, in the order
  // World::group's communicators are made.
  std::unique_ptr<DeviceGroup> group(const std::vector<int>& world_ranks) const;
  // The started plugin and the backend whose memory it moves (braid calibrate times links with them).
  const runtime::DeviceCommPlugin& plugin() const { return *plugin_; }
  const std::shared_ptr<nn::DeviceBackend>& backend() const { return backend_; }

 private:
  DeviceCollectives() = default;
  std::shared_ptr<nn::DeviceBackend> backend_;
  std::unique_ptr<runtime::WorldBootstrap> bootstrap_;  // the plugin keeps a pointer to it
  std::unique_ptr<runtime::DeviceCommPlugin> plugin_;
};

}  // namespace braid::train
