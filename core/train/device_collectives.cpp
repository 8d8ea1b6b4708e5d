#include "core/train/device_collectives.hpp"

#include <cstdint>
#include <span>

#include "core/common/error.hpp"

namespace braid::train {

double DeviceGroup::allreduce_gradients(const std::vector<nn::Parameter*>& params) {
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

namespace {

// Whether every rank of `world` succeeded (collective): so that all go on together.
bool all_succeeded(runtime::World& world, bool succeeded) {
  std::int32_t failed[1] = {succeeded ? 0 : 1};
  world.communicator().allreduce(std::span<std::int32_t>(failed));
  return failed[0] == 0;
}

}  // namespace

double DeviceGroup::allreduce_sum(nn::Tensor& t) {
  if (!(t.device() == backend_->device()))
    throw Error(Status::internal,
                "a device all-reduce of a tensor on " + t.device().name() + ", not " + backend_->device().name());
  backend_->synchronize();  // the plugin runs on its own stream
  return comm_->allreduce_sum(t.ptr(), t.data.size(), nullptr, DeviceCollectives::kDeadlineSeconds);
}

std::unique_ptr<DeviceCollectives> DeviceCollectives::open(const std::shared_ptr<nn::DeviceBackend>& backend,
                                                           runtime::World& world, std::string& why_not) {
  why_not.clear();
  if (!backend || backend->device().is_host()) {
    why_not = "the tensors are host memory";
    return nullptr;
  }
  const bool gpu = backend->device().type == nn::DeviceType::cuda;
  std::unique_ptr<DeviceCollectives> c(new DeviceCollectives());
  c->backend_ = backend;
  // First what each rank can tell alone, then starting the plugin, which is collective (NCCL
  // agrees on ids over the bootstrap): only once every rank is ready, and agreed on again, so
  // that no rank waits for one that gave up.
  if (gpu && world.local_size() > backend->device_count())
    why_not = std::to_string(world.local_size()) + " processes share " + std::to_string(backend->device_count()) +
              " GPU(s) on this node, which NCCL refuses";
  if (why_not.empty()) {
    try {
      c->bootstrap_ = std::make_unique<runtime::WorldBootstrap>(world);
      c->plugin_ = runtime::load_device_comm_plugin(gpu ? "nccl" : "mpi");
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  if (!all_succeeded(world, why_not.empty())) {
    if (why_not.empty()) why_not = "another rank cannot use its device communication plugin";
    return nullptr;
  }
  try {
    c->plugin_->init(c->bootstrap_->get());
  } catch (const std::exception& e) {
    why_not = e.what();
  }
  if (!all_succeeded(world, why_not.empty())) {
    if (why_not.empty()) why_not = "another rank's device communication plugin failed to start";
    return nullptr;
  }
  return c;
}

std::string DeviceCollectives::description() const {
  return std::string(plugin_->name()) + " (" + plugin_->backend_version() +
         "): the data-parallel and tensor-parallel all-reduces on the device";
}

std::unique_ptr<DeviceGroup> DeviceCollectives::group(const std::vector<int>& world_ranks) const {
  return std::make_unique<DeviceGroup>(backend_, std::make_unique<runtime::DeviceCommunicator>(*plugin_, world_ranks));
}

}  // namespace braid::train
