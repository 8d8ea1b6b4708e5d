#include "core/runtime/device_comm.hpp"

#include <dlfcn.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid::runtime {

DeviceCommPlugin::~DeviceCommPlugin() {
  if (initialised_) api_->finalize();
  if (handle_) dlclose(handle_);
}

void DeviceCommPlugin::init(const braid_comm_bootstrap_v2& bootstrap) {
  if (initialised_) return;
  if (api_->init(&bootstrap) != 0) {
    const char* why = api_->last_error();
    throw Error(Status::plugin, std::string(api_->name) + " plugin " + path_ +
                                    " failed to start: " + (why && why[0] ? why : "no message"));
  }
  initialised_ = true;
}

void DeviceCommPlugin::check(int code, const std::string& what) const {
  if (code == 0) return;
  const char* why = api_->last_error();
  throw Error(Status::plugin, std::string(api_->name) + " plugin: " + what + " failed (code " + std::to_string(code) +
                                  "): " + (why && why[0] ? why : "no message"));
}

std::unique_ptr<DeviceCommPlugin> load_device_comm_plugin(const std::string& name) {
  PluginLibrary lib = open_plugin(name, BRAID_COMM_PLUGIN_SYMBOL_V2, "communication", [](const void* p) -> std::string {
    auto* api = static_cast<const braid_comm_plugin_v2*>(p);
    if (api->interface_version != 2)
      return "interface version " + std::to_string(api->interface_version) + ", this braid reads 2 here";
    const void* functions[] = {
        reinterpret_cast<const void*>(api->last_error),  reinterpret_cast<const void*>(api->backend_version),
        reinterpret_cast<const void*>(api->init),        reinterpret_cast<const void*>(api->finalize),
        reinterpret_cast<const void*>(api->world),       reinterpret_cast<const void*>(api->comm_world),
        reinterpret_cast<const void*>(api->comm_create), reinterpret_cast<const void*>(api->comm_free),
        reinterpret_cast<const void*>(api->comm_rank),   reinterpret_cast<const void*>(api->comm_size),
        reinterpret_cast<const void*>(api->isend),       reinterpret_cast<const void*>(api->irecv),
        reinterpret_cast<const void*>(api->iallreduce),  reinterpret_cast<const void*>(api->iallgather),
        reinterpret_cast<const void*>(api->ibroadcast),  reinterpret_cast<const void*>(api->ireduce_scatter),
        reinterpret_cast<const void*>(api->test),        reinterpret_cast<const void*>(api->wait),
        reinterpret_cast<const void*>(api->barrier),     reinterpret_cast<const void*>(api->abort)};
    for (const void* f : functions)
      if (!f) return "a version-2 table with a NULL function (version 2 requires every one)";
    return api->name ? "" : "name is NULL";
  });
  std::unique_ptr<DeviceCommPlugin> plugin(new DeviceCommPlugin());
  plugin->handle_ = lib.handle;
  plugin->api_ = static_cast<const braid_comm_plugin_v2*>(lib.api);
  plugin->path_ = lib.path;
  return plugin;
}

DeviceCommunicator::DeviceCommunicator(const DeviceCommPlugin& plugin, const std::vector<int>& world_ranks)
    : plugin_(&plugin), world_ranks_(world_ranks) {
  const std::vector<int32_t> ranks(world_ranks.begin(), world_ranks.end());
  plugin.check(plugin.api().comm_create(ranks.data(), static_cast<int32_t>(ranks.size()), &comm_),
               "creating a communicator of " + std::to_string(ranks.size()) + " ranks");
}

DeviceCommunicator::~DeviceCommunicator() {
  if (comm_) plugin_->api().comm_free(comm_);  // a destructor cannot throw: best effort
}

DeviceRequest::DeviceRequest(DeviceRequest&& other) noexcept
    : plugin_(other.plugin_),
      handle_(std::exchange(other.handle_, nullptr)),
      what_(std::move(other.what_)),
      deadline_s_(other.deadline_s_) {}

DeviceRequest& DeviceRequest::operator=(DeviceRequest&& other) noexcept {
  // What this held is waited for when `other` goes.
  std::swap(plugin_, other.plugin_);
  std::swap(handle_, other.handle_);
  std::swap(what_, other.what_);
  std::swap(deadline_s_, other.deadline_s_);
  return *this;
}

DeviceRequest::~DeviceRequest() {
  if (!handle_) return;
  if (plugin_->api().wait(std::exchange(handle_, nullptr), deadline_s_) != 0)
    std::fprintf(stderr, "braid: %s, dropped before it completed, failed: %s\n", what_.c_str(),
                 plugin_->api().last_error());
}

double DeviceRequest::wait() {
  if (!handle_) return 0;
  const auto start = std::chrono::steady_clock::now();
  plugin_->check(plugin_->api().wait(std::exchange(handle_, nullptr), deadline_s_), "waiting for " + what_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool DeviceRequest::test() {
  if (!handle_) return true;
  std::int32_t done = 0;
  const int code = plugin_->api().test(handle_, &done);
  if (code != 0) handle_ = nullptr;  // a failed request is released (braid_comm_v2.h)
  plugin_->check(code, "testing " + what_);
  if (done) handle_ = nullptr;
  return done != 0;
}

DeviceRequest DeviceCommunicator::posted(int code, braid_comm_request_v2* request, std::string what,
                                         double deadline_s) const {
  plugin_->check(code, what);
  return DeviceRequest(*plugin_, request, std::move(what), deadline_s);
}

DeviceRequest DeviceCommunicator::post_allreduce_sum(float* data, std::size_t count, void* stream, double deadline_s) {
  braid_comm_request_v2* request = nullptr;
  const int code =
      plugin_->api().iallreduce(comm_, data, data, count, BRAID_COMM_FLOAT32, BRAID_COMM_SUM, stream, &request);
  return posted(code, request, "an all-reduce of " + std::to_string(count) + " floats", deadline_s);
}

double DeviceCommunicator::allreduce_sum(float* data, std::size_t count, void* stream, double deadline_s) {
  return post_allreduce_sum(data, count, stream, deadline_s).wait();
}

double DeviceCommunicator::send(const void* data, std::size_t bytes, int peer, void* stream, double deadline_s) {
  braid_comm_request_v2* request = nullptr;
  const int code = plugin_->api().isend(comm_, data, bytes, peer, 0, stream, &request);
  return posted(code, request, "a send of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer),
                deadline_s)
      .wait();
}

double DeviceCommunicator::recv(void* data, std::size_t bytes, int peer, void* stream, double deadline_s) {
  braid_comm_request_v2* request = nullptr;
  const int code = plugin_->api().irecv(comm_, data, bytes, peer, 0, stream, &request);
  return posted(code, request, "a receive of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer),
                deadline_s)
      .wait();
}

double DeviceCommunicator::allgather(const void* send, void* recv, std::size_t bytes, void* stream, double deadline_s) {
  braid_comm_request_v2* request = nullptr;
  const int code = plugin_->api().iallgather(comm_, send, recv, bytes, stream, &request);
  return posted(code, request, "an all-gather of " + std::to_string(bytes) + " bytes each", deadline_s).wait();
}

WorldBootstrap::WorldBootstrap(const World& world) : world_(&world) {
  if (!world.has_communicator())
    throw Error(Status::unsupported,
                "a device communication plugin's bootstrap needs a world with communicators "
                "(World::from_plugin), not one a host bootstrapped");
  bootstrap_.struct_size = sizeof bootstrap_;
  bootstrap_.rank = world.rank();
  bootstrap_.size = world.size();
  bootstrap_.local_rank = world.local_rank();
  bootstrap_.local_size = world.local_size();
  bootstrap_.context = this;
  bootstrap_.broadcast = &WorldBootstrap::broadcast;
}

// Called by exactly the listed processes, in one order (braid_comm_v2.h), as
// World::group's communicators must be made.
int WorldBootstrap::broadcast(void* context, const int32_t* world_ranks, int32_t count, void* data, std::size_t bytes) {
  try {
    const auto* self = static_cast<const WorldBootstrap*>(context);
    if (count <= 1) return 0;
    Communicator group = self->world_->group(std::vector<int>(world_ranks, world_ranks + count));
    group.broadcast(std::span<std::byte>(static_cast<std::byte*>(data), bytes), 0);
    return 0;
  } catch (...) {
    return 1;
  }
}

}  // namespace braid::runtime
