// One device of a v2 device plugin (plugins/include/braid_device_v2.h), in C++: every call
// checked, a failure thrown as Error(Status::plugin) naming the backend and what it did.
// Tensors made here borrow memory from the plugin's caching allocator and give it back when
// their last copy goes; copies between host and device are explicit (upload, download).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/nn/tensor.hpp"
#include "core/runtime/plugin_loader.hpp"

namespace braid::nn {

struct DeviceMemoryStats {
  uint64_t in_use = 0, peak_in_use = 0, reserved = 0, allocations = 0;
};

// A device-side int32 buffer (token ids, targets), freed with its backend.
struct DeviceIds {
  std::shared_ptr<void> memory;
  int64_t count = 0;
  int32_t* data() const { return static_cast<int32_t*>(memory.get()); }
};

class DeviceBackend : public DeviceCopier, public std::enable_shared_from_this<DeviceBackend> {
 public:
  // Loads libbraid-<plugin>.so through the v2 interface and opens device `index` with one
  // stream; throws Error(Status::plugin) when the plugin is v1 only, has no such device, or
  // cannot start. "emulated" opens the host plugin as an emulated device (its memory not
  // host memory to braid: BRAID_HOST_MEMORY=separate while it opens).
  static std::shared_ptr<DeviceBackend> open(const std::string& plugin, int index = 0);
  // The device one process of a job uses: the `local_rank`-th of the node's devices, modulo
  // those the plugin sees (processes may share one); for the host plugin, with `threads`
  // threads for its ops (read when the plugin's ops start in this process).
  static std::shared_ptr<DeviceBackend> open_for_process(const std::string& plugin, int threads, int local_rank);
  ~DeviceBackend() override;
  DeviceBackend(const DeviceBackend&) = delete;
  DeviceBackend& operator=(const DeviceBackend&) = delete;

  const std::string& name() const { return name_; }  // "host", "cuda"
  const runtime::DeviceInfo& info() const { return info_; }
  int device_count() const { return device_count_; }  // the plugin's devices (this process sees)
  const Device& device() const { return device_; }
  const runtime::DevicePlugin& plugin() const { return *plugin_; }
  const braid_device_plugin_v2& api() const { return *plugin_->v2(); }
  braid_device_stream_v2 stream() const { return stream_; }
  bool supports(braid_device_op_v2 op) const { return api().supports(op) != 0; }

  // Throws Error(plugin) "<name> backend: <what>: <message>" unless rc is 0.
  void check(int rc, const std::string& what, const char* message) const;

  // Uninitialised, and zero-filled, device tensors of a shape.
  Tensor empty(const Shape& shape);
  Tensor zeros(const Shape& shape);
  Tensor upload(const Tensor& host);  // a host tensor's copy on the device
  // The same without waiting for the copy: `host`'s elements stay here until the next
  // synchronize(). Borrowed host memory, which its owner may change, is uploaded as above.
  Tensor upload_owned(Tensor host);
  void upload_into(Tensor& to, const Tensor& host);  // into a device tensor of as many elements
  Tensor download(const Tensor& dev);                // a device tensor's copy on the host (waits for the stream)
  std::vector<Tensor> download_all(std::span<const Tensor* const> devs);  // the same, one wait for them all
  // Enqueues the copy without waiting: a copy of the ids stays here until the next
  // synchronize(), as the interface asks of host memory given to a copy.
  DeviceIds upload_ids(std::span<const int32_t> ids);
  void zero(Tensor& t);                       // every element 0, on the stream
  void copy(Tensor& to, const Tensor& from);  // device to device, same element count
  // A new allocation holding `from`'s elements (what copying a tensor of this backend does).
  Storage duplicate(const Storage& from) const override;
  void synchronize();  // waits for everything issued on the stream (and lets the kept host sides go)
  DeviceMemoryStats memory_stats() const;
  // How often the host has waited for the stream: each synchronize() (a download, an upload
  // of a tensor) and each op whose result comes back to the host (a loss, a norm), which
  // DeviceOps counts. A GPU pays a round trip for each: a launch-bound step wants few.
  uint64_t host_waits() const { return host_waits_; }
  void count_host_wait() { ++host_waits_; }

 private:
  DeviceBackend() = default;
  static std::shared_ptr<DeviceBackend> open_picking(const std::string& plugin,
                                                     const std::function<int(int count)>& pick);
  std::shared_ptr<void> allocate(std::size_t bytes) const;
  Storage storage(std::size_t count) const;  // uninitialised, from the pool

  std::unique_ptr<runtime::DevicePlugin> plugin_;
  std::string name_;
  runtime::DeviceInfo info_;
  Device device_;
  int32_t index_ = 0;
  int device_count_ = 0;
  braid_device_stream_v2 stream_ = nullptr;
  uint64_t host_waits_ = 0;
  // Keeps the host side of a copy until the stream has run it; waits first when too much is kept.
  template <class T>
  const T& keep_for_copy(T host_side, std::size_t bytes);
  // Host sides of copies the stream may not have run, and their size.
  std::vector<std::shared_ptr<const void>> kept_for_copies_;
  std::size_t kept_bytes_ = 0;
};

}  // namespace braid::nn
