// A device communication plugin (libbraid-<name>.so exporting braidCommPlugin_v2, see
// plugins/include/braid_comm_v2.h: NCCL) and the bootstrap braid gives it: a World whose
// communicators (the MPI plugin's) carry each new communicator's unique id, so the device
// plugin never links MPI.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/runtime/world.hpp"
#include "plugins/include/braid_comm_v2.h"

namespace braid::runtime {

class DeviceCommPlugin {
 public:
  // Finalizes (when initialised) and unloads.
  ~DeviceCommPlugin();
  DeviceCommPlugin(const DeviceCommPlugin&) = delete;
  DeviceCommPlugin& operator=(const DeviceCommPlugin&) = delete;

  const std::string& path() const { return path_; }
  const char* name() const { return api_->name; }
  std::string backend_version() const { return api_->backend_version(); }  // "NCCL 2.28.3"
  const braid_comm_plugin_v2& api() const { return *api_; }

  // Joins the world `bootstrap` describes; throws Error(Status::plugin) with the plugin's
  // reason (no GPU, several processes on one GPU, ...). The bootstrap must outlive the plugin.
  void init(const braid_comm_bootstrap_v2& bootstrap);
  bool initialised() const { return initialised_; }
  // Throws Error(Status::plugin, "<name> plugin: <what> failed (code c): <last_error>") unless code is 0.
  void check(int code, const std::string& what) const;

 private:
  friend std::unique_ptr<DeviceCommPlugin> load_device_comm_plugin(const std::string&);
  DeviceCommPlugin() = default;
  void* handle_ = nullptr;
  const braid_comm_plugin_v2* api_ = nullptr;
  std::string path_;
  bool initialised_ = false;
};

// An operation of a device plugin in flight. Dropped before wait(), it is waited for (the
// plugin may still write its buffers), at most its deadline, and a failure is reported on
// stderr: a destructor cannot throw.
class DeviceRequest {
 public:
  DeviceRequest() = default;
  DeviceRequest(const DeviceCommPlugin& plugin, braid_comm_request_v2* handle, std::string what, double deadline_s)
      : plugin_(&plugin), handle_(handle), what_(std::move(what)), deadline_s_(deadline_s) {}
  DeviceRequest(DeviceRequest&& other) noexcept;
  DeviceRequest& operator=(DeviceRequest&& other) noexcept;
  DeviceRequest(const DeviceRequest&) = delete;
  DeviceRequest& operator=(const DeviceRequest&) = delete;
  ~DeviceRequest();

  // Blocks until the device ran it, at most the deadline (past it the plugin aborts the
  // communicator and this throws its message); returns the seconds blocked. No-op once done.
  double wait();
  // True once the device ran it (never blocks); throws when it failed.
  bool test();

 private:
  const DeviceCommPlugin* plugin_ = nullptr;
  braid_comm_request_v2* handle_ = nullptr;
  std::string what_;
  double deadline_s_ = 0;
};

// A communicator of a device plugin over listed world ranks, made by exactly those ranks
// (collective, in the same order on each, as World::group's) and freed with the object.
class DeviceCommunicator {
 public:
  DeviceCommunicator(const DeviceCommPlugin& plugin, const std::vector<int>& world_ranks);
  ~DeviceCommunicator();
  DeviceCommunicator(const DeviceCommunicator&) = delete;
  DeviceCommunicator& operator=(const DeviceCommunicator&) = delete;

  int size() const { return static_cast<int>(world_ranks_.size()); }
  // Sums `count` float32 at `data` (this process's device memory) in place over the group,
  // on `stream` (null: the device's default); blocks until the device ran it, at most
  // `deadline_s` seconds (<= 0: none; past it the plugin aborts the communicator and this
  // throws its message). Returns the seconds blocked.
  double allreduce_sum(float* data, std::size_t count, void* stream, double deadline_s);
  // The same, posted: the memory at `data` is the plugin's until the request completes.
  DeviceRequest post_allreduce_sum(float* data, std::size_t count, void* stream, double deadline_s);
  // `bytes` at `data` to group rank `peer`, or from it (NCCL matches them by issue order);
  // every member's `bytes` at `send` into `recv` (size() * bytes, in group rank order). Each
  // blocks as allreduce_sum does and returns the seconds blocked.
  double send(const void* data, std::size_t bytes, int peer, void* stream, double deadline_s);
  double recv(void* data, std::size_t bytes, int peer, void* stream, double deadline_s);
  double allgather(const void* send, void* recv, std::size_t bytes, void* stream, double deadline_s);

 private:
  DeviceRequest posted(int code, braid_comm_request_v2* request, std::string what, double deadline_s) const;
  const DeviceCommPlugin* plugin_;
  std::vector<int> world_ranks_;
  braid_comm_v2* comm_ = nullptr;
};

// Loads libbraid-<name>.so through braidCommPlugin_v2 (not initialised); throws
// Error(Status::plugin) naming every file tried and why.
std::unique_ptr<DeviceCommPlugin> load_device_comm_plugin(const std::string& name);

// A bootstrap over `world`'s communicators: rank, size and local placement from the
// world, broadcast over a communicator of the listed ranks made for the call. The world
// must have communicators (from_plugin) and outlive the bootstrap's use.
class WorldBootstrap {
 public:
  explicit WorldBootstrap(const World& world);
  // The bootstrap points at this object: it stays where it was made.
  WorldBootstrap(const WorldBootstrap&) = delete;
  WorldBootstrap& operator=(const WorldBootstrap&) = delete;
  const braid_comm_bootstrap_v2& get() const { return bootstrap_; }

 private:
  static int broadcast(void* context, const int32_t* world_ranks, int32_t count, void* data, std::size_t bytes);
  const World* world_;
  braid_comm_bootstrap_v2 bootstrap_{};
};

}  // namespace braid::runtime
