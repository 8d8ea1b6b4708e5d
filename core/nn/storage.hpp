// Where a tensor's elements live. Either a vector the storage owns (host memory, value
// semantics, what the host trainer uses everywhere), or memory it borrows: a pointer and a
// count someone else owns (a device allocation, a buffer of the host framework), with an
// optional keeper that frees it when the last storage using it goes.
//
// The vector-like accessors (operator[], begin, end) are for host memory only. A view (no
// keeper) never changes size; host memory shared through a keeper is let go for a vector
// when asked to hold another size. Copying host storage copies the elements (into a vector);
// copying device storage throws: device memory is copied by its backend, explicitly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace braid::nn {

enum class DeviceType : int32_t { host = 0, cuda = 1 };

struct Device {
  DeviceType type = DeviceType::host;
  int32_t index = 0;
  bool is_host() const { return type == DeviceType::host; }
  bool operator==(const Device&) const = default;
  std::string name() const;  // "host", "cuda:0"
};

class Storage {
 public:
  Storage() = default;
  Storage(std::size_t count, float fill) : owned_(count, fill) {}
  Storage(std::vector<float> values) : owned_(std::move(values)) {}  // NOLINT: a vector is host storage
  Storage(std::initializer_list<float> values) : owned_(values) {}
  // Borrows `count` floats at `data` on `device`; `keeper` (may be null) owns them.
  static Storage borrow(float* data, std::size_t count, Device device, std::shared_ptr<void> keeper = nullptr);

  Storage(const Storage& other);
  Storage& operator=(const Storage& other);
  Storage(Storage&& other) noexcept;
  Storage& operator=(Storage&& other) noexcept;

  std::size_t size() const { return borrowed_ ? borrowed_count_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  bool borrowed() const { return borrowed_ != nullptr; }
  const Device& device() const { return device_; }
  float* data() { return borrowed_ ? borrowed_ : owned_.data(); }
  const float* data() const { return borrowed_ ? borrowed_ : owned_.data(); }

  float& operator[](std::size_t i) { return data()[i]; }
  const float& operator[](std::size_t i) const { return data()[i]; }
  float* begin() { return data(); }
  float* end() { return data() + size(); }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size(); }
  operator std::span<float>() { return {data(), size()}; }              // NOLINT: as a vector converts
  operator std::span<const float>() const { return {data(), size()}; }  // NOLINT

  // `count` copies of `value` (host only); a view must already hold `count`.
  void assign(std::size_t count, float value);
  // Owned storage grows or shrinks; a view only accepts its own size.
  void resize(std::size_t count, float fill = 0.0f);
  bool operator==(const Storage& other) const;  // same elements (host)
  // The elements as a vector, leaving this storage empty: owned ones move out, borrowed
  // host memory is copied (and let go).
  std::vector<float> release();

 private:
  void require_host(const char* what) const;
  bool let_go_for(std::size_t count);

  std::vector<float> owned_;
  float* borrowed_ = nullptr;
  std::size_t borrowed_count_ = 0;
  Device device_;
  std::shared_ptr<void> keeper_;
};

}  // namespace braid::nn
