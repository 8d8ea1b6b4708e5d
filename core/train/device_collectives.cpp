#include "core/train/device_collectives.hpp"

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "core/common/error.hpp"
#include "core/nn/flat_parameters.hpp"

namespace braid::train {

Pending DeviceGroup::post_allreduce_gradients(const std::vector<nn::Parameter*>& given, CommBytes& bytes) {
  // Declared after the buffer it writes, the request is destroyed first: dropped unfinished,
  // it waits before the buffer goes.
  struct InFlight {
    nn::Tensor flat;                          // empty when summed in place
    std::optional<CountedBytes> counted;      // the flat buffer's bytes, as communication
    std::vector<std::shared_ptr<void>> keep;  // summed in place: the layout's memory
    runtime::DeviceRequest request;
  };
  const std::vector<nn::Parameter*> params = nn::layout_order(given);
  std::size_t total = 0;
  for (const nn::Parameter* p : params) total += p->grad.data.size();
  auto in_flight = std::make_shared<InFlight>();
  float* in_place = nn::end_to_end_gradients(params, backend_->device());
  // Each gradient's place in the flat buffer, as a view of it, in layout order.
  auto each_place = [params, in_flight](const std::function<void(nn::Parameter&, nn::Tensor&)>& f) {
    std::size_t at = 0;
    for (nn::Parameter* p : params) {
      const std::size_t n = p->grad.data.size();
      nn::Tensor place;
      place.shape = {static_cast<std::int64_t>(n)};
      place.data = nn::Storage::borrow(in_flight->flat.ptr() + at, n, in_flight->flat.device());
      f(*p, place);
      at += n;
    }
  };
  if (in_place) in_flight->keep = nn::gradient_keepers(params);
  if (!in_place) {  // not laid out: through a buffer
    in_flight->flat = backend_->empty({static_cast<std::int64_t>(total)});
    in_flight->counted.emplace(total * sizeof(float), bytes.in_flight);
    each_place([&](nn::Parameter& p, nn::Tensor& place) { backend_->copy(place, p.grad); });
  }
  backend_->synchronize();  // the plugin runs on its own stream
  bytes.sample();           // the gradients and their copy, if any
  in_flight->request = comm_->post_allreduce_sum(in_place ? in_place : in_flight->flat.ptr(), total, nullptr,
                                                 DeviceCollectives::kDeadlineSeconds);
  Pending pending;
  pending.test = [in_flight] { return in_flight->request.test(); };
  pending.finish = [backend = backend_, in_flight, each_place, copied = !in_place] {
    const double waited = in_flight->request.wait();
    if (copied) each_place([&](nn::Parameter& p, nn::Tensor& place) { backend->copy(p.grad, place); });
    return waited;
  };
  return pending;
}

double DeviceGroup::allreduce_gradients(const std::vector<nn::Parameter*>& params, CommBytes& bytes) {
  return post_allreduce_gradients(params, bytes).finish();
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
  // Staging through host memory and MPI on request: what processes sharing a GPU do, so that
  // path runs (and is tested) on the emulated device too.
  const char* asked = std::getenv("BRAID_DEVICE_COLLECTIVES");
  const std::string choice = asked ? asked : "auto";
  if (choice == "host")
    why_not = "BRAID_DEVICE_COLLECTIVES=host";
  else if (choice != "auto")
    throw Error(Status::invalid_argument, "BRAID_DEVICE_COLLECTIVES must be auto or host, got '" + choice + "'");
  // First what each rank can tell alone, then starting the plugin, which is collective (NCCL
  // agrees on ids over the bootstrap): only once every rank is ready, and agreed on again, so
  // that no rank waits for one that gave up.
  if (why_not.empty() && gpu && world.local_size() > backend->device_count())
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
