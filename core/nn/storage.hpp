// Where a tensor's elements live. Either a vector the storage owns (host memory, value
// semantics, what the host trainer uses everywhere), or memory it borrows: a pointer and a
// count someone else owns (a device allocation, a buffer of the host framework), with an
// optional keeper that frees it when the last storage using it goes.
//
// The vector-like accessors (operator[], begin, end) are for host memory only. A view (no
// keeper) never changes size; host memory shared through a keeper is let go for a vector
// when asked to hold another size. Copying host storage copies the elements (into a vector);
// copying device storage copies them on the device through the backend that allocated it
// (a DeviceCopier), and throws for device memory without one. Copies between host and
// device are explicit: the backend's upload and download.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/common/host_buffer.hpp"

namespace braid::nn {

// emulated: the host backend run with BRAID_HOST_MEMORY=separate, whose memory is host
// memory that braid treats as a device's (no host access, explicit copies), so the GPU's
// data path is tested without a GPU.
enum class DeviceType : int32_t { host = 0, cuda = 1, emulated = 2 };

struct Device {
  DeviceType type = DeviceType::host;
  int32_t index = 0;
  bool is_host() const { return type == DeviceType::host; }
  bool operator==(const Device&) const = default;
  std::string name() const;  // "host", "cuda:0", "emulated:0"
};

class Storage;

// Makes copies of device memory on its device: the backend that allocated it. A storage
// that has one copies its device memory through it (value semantics, as host tensors
// have); one without refuses to be copied.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  virtual Storage duplicate(const Storage& from) const = 0;
};

class Storage {
 public:
  Storage() = default;
  Storage(std::size_t count, float fill) { assign(count, fill); }
  Storage(const std::vector<float>& values) : owned_(values.begin(), values.end()) {}  // NOLINT: host storage
  Storage(HostBuffer values) : owned_(std::move(values)) {}                            // NOLINT: keeps the memory
  Storage(std::initializer_list<float> values) : owned_(values) {}
  // Borrows `count` floats at `data` on `device`; `keeper` (may be null) owns them, and
  // `copier` (may be null) copies them.
  static Storage borrow(float* data, std::size_t count, Device device, std::shared_ptr<void> keeper = nullptr,
                        std::shared_ptr<const DeviceCopier> copier = nullptr);

  // The same elements, borrowed (copied as this storage's are): valid while this storage keeps
  // them, and for reading only where this one is const.
  Storage view() const { return borrow(const_cast<float*>(data()), size(), device_, nullptr, copier_); }

  Storage(const Storage& other);
  Storage& operator=(const Storage& other);
  Storage(Storage&& other) noexcept;
  Storage& operator=(Storage&& other) noexcept;

  std::size_t size() const { return borrowed_ ? borrowed_count_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  bool borrowed() const { return borrowed_ != nullptr; }
  // What keeps a view's memory alive (null for owned storage, or a view without one).
  const std::shared_ptr<void>& keeper() const { return keeper_; }
  const Device& device() const { return device_; }
  float* data() { return borrowed_ ? borrowed_ : owned_.data(); }
  const float* data() const { return borrowed_ ? borrowed_ : owned_.data(); }

  // Element access for host memory; debug builds refuse device memory here. data(), and a
  // span made from it (std::span's range constructor), is the raw pointer a backend takes.
  float& operator[](std::size_t i) { return host_data("read")[i]; }
  const float& operator[](std::size_t i) const { return host_data("read")[i]; }
  float* begin() { return host_data("iterate"); }
  float* end() { return host_data("iterate") + size(); }
  const float* begin() const { return host_data("iterate"); }
  const float* end() const { return host_data("iterate") + size(); }
  operator std::span<float>() { return {host_data("view"), size()}; }              // NOLINT: as a vector converts
  operator std::span<const float>() const { return {host_data("view"), size()}; }  // NOLINT

  // `count` copies of `value` (host only); a view must already hold `count`.
  void assign(std::size_t count, float value);
  // Owned storage grows or shrinks; a view only accepts its own size.
  void resize(std::size_t count, float fill = 0.0f);
  // `count` elements of unspecified value (host only), for an output its op writes whole:
  // nothing is zeroed or kept. Debug builds fill them with NaN, so a read before the write shows.
  void resize_for_overwrite(std::size_t count);
  bool operator==(const Storage& other) const;  // same elements (host)
  // `count` elements from `offset` as a view of this storage's memory: it copies as this
  // storage copies, and `keeper` keeps the memory alive (an owned vector has no keeper of
  // its own, so the caller keeps it).
  Storage slice(std::size_t offset, std::size_t count, std::shared_ptr<void> keeper);
  // The elements, leaving this storage empty: owned ones move out, borrowed host memory is
  // copied (and let go).
  HostBuffer release();

 private:
  void require_host(const char* what) const;
#ifdef NDEBUG
  float* host_data(const char*) { return data(); }
  const float* host_data(const char*) const { return data(); }
#else
  float* host_data(const char* what) { return require_host(what), data(); }
  const float* host_data(const char* what) const { return require_host(what), data(); }
#endif
  bool let_go_for(std::size_t count);
  // Owned memory of `count` elements of unspecified value (a view keeps its own).
  void own_unfilled(std::size_t count);

  HostBuffer owned_;
  float* borrowed_ = nullptr;
  std::size_t borrowed_count_ = 0;
  Device device_;
  std::shared_ptr<void> keeper_;
  std::shared_ptr<const DeviceCopier> copier_;
};

}  // namespace braid::nn
