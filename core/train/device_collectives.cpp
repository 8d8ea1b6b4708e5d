#include "core/train/device_collectives.hpp"

#include <cstdint>
#include <span>

#include "core/common/error.hpp"
#include "core/train/train_device.hpp"

namespace braid::train {

double DeviceDataParallel::allreduce_gradients(const std::vector<nn::Parameter*>& params) {
  std::size_t total = 0;
  for (const nn::Parameter* p : params)
    if (p->trainable) total += p->grad.data.size();
  nn::Tensor flat = backend_->empty({static_cast<std::int64_t>(total)});
  // Each gradient's place in the flat buffer, as a view of it.
  auto place_of = [&](std::size_t at, std::size_t n) {
    nn::Tensor view;
    view.shape = {static_cast<std::int64_t>(n)};
    view.data = nn::Storage::borrow(flat.ptr() + at, n, flat.device());
    return view;
  };
  std::size_t at = 0;
  for (const nn::Parameter* p : params) {
    if (!p->trainable) continue;
    nn::Tensor place = place_of(at, p->grad.data.size());
    backend_->copy(place, p->grad);
    at += p->grad.data.size();
  }
  backend_->synchronize();  // the plugin runs on its own stream
  const double waited = comm_->allreduce_sum(flat.ptr(), total, nullptr, DeviceCollectives::kDeadlineSeconds);
  at = 0;
  for (nn::Parameter* p : params) {
    if (!p->trainable) continue;
    backend_->copy(p->grad, place_of(at, p->grad.data.size()));
    at += p->grad.data.size();
  }
  return waited;
}

std::unique_ptr<DeviceCollectives> DeviceCollectives::open(const TrainDevice& device, runtime::World& world,
                                                           std::string& why_not) {
  why_not.clear();
  if (!device.backend || device.backend->device().is_host()) {
    why_not = "the tensors are host memory";
    return nullptr;
  }
  const bool gpu = device.backend->device().type == nn::DeviceType::cuda;
  if (gpu && world.local_size() > device.backend->device_count()) {
    why_not = std::to_string(world.local_size()) + " processes share " +
              std::to_string(device.backend->device_count()) + " GPU(s) on this node, which NCCL refuses";
  }
  // Every rank tries, then all agree: one that cannot start makes all stage through the host.
  std::unique_ptr<DeviceCollectives> c(new DeviceCollectives());
  if (why_not.empty()) {
    try {
      c->backend_ = device.backend;
      c->bootstrap_ = std::make_unique<runtime::WorldBootstrap>(world);
      c->plugin_ = runtime::load_device_comm_plugin(gpu ? "nccl" : "mpi");
      c->plugin_->init(c->bootstrap_->get());
    } catch (const Error& e) {
      why_not = e.what();
    }
  }
  std::int32_t failed[1] = {why_not.empty() ? 0 : 1};
  world.communicator().allreduce(std::span<std::int32_t>(failed));
  if (failed[0] == 0) return c;
  if (why_not.empty()) why_not = "another rank could not start its device communication plugin";
  return nullptr;
}

std::string DeviceCollectives::description() const {
  return std::string(plugin_->name()) + " (" + plugin_->backend_version() +
         "): the data-parallel gradient all-reduce on the device";
}

std::unique_ptr<DeviceDataParallel> DeviceCollectives::group(const std::vector<int>& world_ranks) const {
  return std::make_unique<DeviceDataParallel>(backend_,
                                              std::make_unique<runtime::DeviceCommunicator>(*plugin_, world_ranks));
}

}  // namespace braid::train
