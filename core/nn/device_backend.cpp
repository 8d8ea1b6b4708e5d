#include "core/nn/device_backend.hpp"

#include <cstdlib>
#include <limits>
#include <string>

#include "core/common/error.hpp"
#include "core/common/scoped_env.hpp"

namespace braid::nn {
namespace {

constexpr std::size_t kErrorSize = 1024;

}  // namespace

std::shared_ptr<DeviceBackend> DeviceBackend::open(const std::string& plugin_name, int index) {
  return open_picking(plugin_name, [index](int) { return index; });
}

std::shared_ptr<DeviceBackend> DeviceBackend::open_for_process(const std::string& plugin_name, int threads,
                                                               int local_rank) {
  // The host plugin's ops take their thread count from the environment when they start.
  if ((plugin_name == "host" || plugin_name == "emulated") && threads > 0)
    ::setenv("BRAID_HOST_THREADS", std::to_string(threads).c_str(), 1);
  return open_picking(plugin_name, [&](int count) {
    if (count == 0) throw Error(Status::plugin, plugin_name + " backend sees no device");
    return local_rank % count;
  });
}

std::shared_ptr<DeviceBackend> DeviceBackend::open_picking(const std::string& plugin_name,
                                                           const std::function<int(int count)>& pick) {
  if (plugin_name == "emulated") {  // the host plugin reads it when the device is opened
    const ScopedEnv separate("BRAID_HOST_MEMORY", "separate");
    return open_picking("host", pick);
  }
  std::shared_ptr<DeviceBackend> b(new DeviceBackend());
  b->plugin_ = runtime::load_device_plugin(plugin_name);
  b->name_ = b->plugin_->name();
  if (!b->plugin_->v2())
    throw Error(Status::plugin, b->plugin_->path() + " implements device interface 1 only; running ops needs 2");
  if (!b->plugin_->unavailable_reason().empty())
    throw Error(Status::plugin, b->name_ + " backend is unavailable: " + b->plugin_->unavailable_reason());
  const auto devices = b->plugin_->devices();
  b->device_count_ = static_cast<int>(devices.size());
  const int index = pick(b->device_count_);
  if (index < 0 || index >= b->device_count_)
    throw Error(Status::plugin, b->name_ + " backend has " + std::to_string(devices.size()) + " device(s); device " +
                                    std::to_string(index) + " does not exist");
  b->info_ = devices[static_cast<std::size_t>(index)];
  b->index_ = index;
  b->device_ = b->info_.host_memory ? Device{DeviceType::host, 0}
               : b->name_ == "host" ? Device{DeviceType::emulated, index}  // BRAID_HOST_MEMORY=separate
                                    : Device{DeviceType::cuda, index};
  char error[kErrorSize] = "";
  b->check(b->api().stream_create(index, &b->stream_, error, sizeof error), "creating a stream", error);
  return b;
}

DeviceBackend::~DeviceBackend() {
  if (!stream_) return;
  char error[kErrorSize] = "";
  api().stream_synchronize(stream_, error, sizeof error);  // nothing may still use memory being unloaded
  api().stream_destroy(stream_, error, sizeof error);
}

void DeviceBackend::check(int rc, const std::string& what, const char* message) const {
  if (rc != 0) throw Error(Status::plugin, name_ + " backend: " + what + ": " + (message[0] ? message : "failed"));
}

std::shared_ptr<void> DeviceBackend::allocate(std::size_t bytes) const {
  char error[kErrorSize] = "";
  void* p = nullptr;
  check(api().alloc(index_, bytes, stream_, &p, error, sizeof error), "allocating " + std::to_string(bytes) + " bytes",
        error);
  // The deleter keeps the backend (and its plugin) loaded until the memory is back.
  return std::shared_ptr<void>(p, [self = shared_from_this()](void* q) {
    char e[kErrorSize] = "";
    self->api().free(self->index_, q, self->stream_, e, sizeof e);  // a destructor cannot throw: best effort
  });
}

Storage DeviceBackend::storage(std::size_t count) const {
  if (count > std::numeric_limits<std::size_t>::max() / sizeof(float))
    throw Error(Status::invalid_argument,
                "device memory for " + std::to_string(count) + " floats: more bytes than fit");
  std::shared_ptr<void> memory = allocate(count * sizeof(float));
  return Storage::borrow(static_cast<float*>(memory.get()), count, device_, memory, shared_from_this());
}

Tensor DeviceBackend::empty(const Shape& shape) {
  Tensor t;
  t.shape = shape;
  t.data = storage(static_cast<std::size_t>(shape_numel(shape)));
  return t;
}

Storage DeviceBackend::duplicate(const Storage& from) const {
  Storage to = storage(from.size());
  char error[kErrorSize] = "";
  check(api().copy(to.data(), from.data(), from.size() * sizeof(float), BRAID_COPY_DEVICE_TO_DEVICE, stream_, error,
                   sizeof error),
        "copying on the device", error);
  return to;
}

Tensor DeviceBackend::zeros(const Shape& shape) {
  Tensor t = empty(shape);
  zero(t);
  return t;
}

void DeviceBackend::zero(Tensor& t) {
  char error[kErrorSize] = "";
  check(api().memset_zero(t.ptr(), t.data.size() * sizeof(float), stream_, error, sizeof error), "zeroing", error);
}

Tensor DeviceBackend::upload(const Tensor& host) {
  Tensor t = empty(host.shape);
  upload_into(t, host);
  return t;
}

void DeviceBackend::upload_into(Tensor& to, const Tensor& host) {
  if (!(to.device() == device_) || to.numel() != host.numel())
    throw Error(Status::invalid_argument, name_ + " backend: uploading " + shape_string(host.shape) + " into " +
                                              shape_string(to.shape) + " on " + to.device().name());
  char error[kErrorSize] = "";
  check(api().copy(to.ptr(), host.ptr(), host.data.size() * sizeof(float), BRAID_COPY_HOST_TO_DEVICE, stream_, error,
                   sizeof error),
        "copying to the device", error);
  // The host tensor may go once this returns: wait unless the copy is already done.
  if (!info_.host_memory) synchronize();
}

Tensor DeviceBackend::download(const Tensor& dev) {
  const Tensor* one[1] = {&dev};
  return std::move(download_all(one).front());
}

std::vector<Tensor> DeviceBackend::download_all(std::span<const Tensor* const> devs) {
  std::vector<Tensor> out;
  out.reserve(devs.size());  // the copies write where each host tensor is now
  for (const Tensor* dev : devs) {
    Tensor& host = out.emplace_back(dev->shape);
    char error[kErrorSize] = "";
    check(api().copy(host.ptr(), dev->ptr(), host.data.size() * sizeof(float), BRAID_COPY_DEVICE_TO_HOST, stream_,
                     error, sizeof error),
          "copying to the host", error);
  }
  if (!devs.empty()) synchronize();
  return out;
}

template <class T>
const T& DeviceBackend::keep_for_copy(T host_side, std::size_t bytes) {
  // Bounded: a caller that never waits still lets them go now and then.
  constexpr std::size_t kMostKept = 256, kMostKeptBytes = std::size_t{256} << 20;
  if (kept_for_copies_.size() >= kMostKept || kept_bytes_ + bytes > kMostKeptBytes) synchronize();
  auto kept = std::make_shared<const T>(std::move(host_side));
  kept_for_copies_.push_back(kept);
  kept_bytes_ += bytes;
  return *kept;
}

Tensor DeviceBackend::upload_owned(Tensor host) {
  if (host.data.borrowed() || info_.host_memory) return upload(host);
  Tensor t = empty(host.shape);
  const std::size_t bytes = host.data.size() * sizeof(float);
  const HostBuffer& kept = keep_for_copy(host.data.release(), bytes);
  char error[kErrorSize] = "";
  check(api().copy(t.ptr(), kept.data(), bytes, BRAID_COPY_HOST_TO_DEVICE, stream_, error, sizeof error),
        "copying to the device", error);
  return t;
}

DeviceIds DeviceBackend::upload_ids(std::span<const int32_t> ids) {
  DeviceIds out{allocate(ids.size_bytes()), static_cast<int64_t>(ids.size())};
  const auto& kept = keep_for_copy(std::vector<int32_t>(ids.begin(), ids.end()), ids.size_bytes());
  char error[kErrorSize] = "";
  check(api().copy(out.data(), kept.data(), ids.size_bytes(), BRAID_COPY_HOST_TO_DEVICE, stream_, error, sizeof error),
        "copying ids to the device", error);
  return out;
}

void DeviceBackend::copy(Tensor& to, const Tensor& from) {
  if (!(to.device() == device_) || !(from.device() == device_))
    throw Error(Status::invalid_argument, name_ + " backend: copying on " + device_.name() + " from " +
                                              from.device().name() + " into " + to.device().name());
  if (to.numel() != from.numel())
    throw Error(Status::invalid_argument,
                name_ + " backend: copying " + shape_string(from.shape) + " into " + shape_string(to.shape));
  char error[kErrorSize] = "";
  check(api().copy(to.ptr(), from.ptr(), from.data.size() * sizeof(float), BRAID_COPY_DEVICE_TO_DEVICE, stream_, error,
                   sizeof error),
        "copying on the device", error);
}

void DeviceBackend::synchronize() {
  char error[kErrorSize] = "";
  check(api().stream_synchronize(stream_, error, sizeof error), "waiting for the stream", error);
  ++host_waits_;
  kept_for_copies_.clear();
  kept_bytes_ = 0;
}

DeviceMemoryStats DeviceBackend::memory_stats() const {
  braid_device_memory_stats_v2 s{};
  s.struct_size = sizeof s;
  char error[kErrorSize] = "";
  check(api().memory_stats(index_, &s, error, sizeof error), "reading memory statistics", error);
  return {s.in_use, s.peak_in_use, s.reserved, s.allocations};
}

}  // namespace braid::nn
