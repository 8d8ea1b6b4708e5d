#include "core/nn/storage.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

std::string Device::name() const {
  switch (type) {
    case DeviceType::host:
      return "host";
    case DeviceType::cuda:
      return "cuda:" + std::to_string(index);
    case DeviceType::emulated:
      return "emulated:" + std::to_string(index);
  }
  return "device type " + std::to_string(static_cast<int>(type)) + ":" + std::to_string(index);
}

Storage Storage::borrow(float* data, std::size_t count, Device device, std::shared_ptr<void> keeper,
                        std::shared_ptr<const DeviceCopier> copier) {
  if (!data && count > 0)
    throw Error(Status::invalid_argument, "tensor storage: null pointer for " + std::to_string(count) + " elements");
  Storage s;
  static float no_elements = 0.0f;  // a borrowed storage is never null, even when empty
  s.borrowed_ = data ? data : &no_elements;
  s.borrowed_count_ = count;
  s.device_ = device;
  s.keeper_ = std::move(keeper);
  s.copier_ = std::move(copier);
  return s;
}

Storage Storage::slice(std::size_t offset, std::size_t count, std::shared_ptr<void> keeper) {
  if (offset > size() || count > size() - offset)
    throw Error(Status::invalid_argument, "tensor storage: a slice of " + std::to_string(count) + " elements at " +
                                              std::to_string(offset) + " of " + std::to_string(size()));
  return borrow(data() + offset, count, device_, std::move(keeper), copier_);
}

Storage::Storage(const Storage& other) : device_() {
  if (!other.device_.is_host() && other.copier_) {
    *this = other.copier_->duplicate(other);
    return;
  }
  other.require_host("copy");
  owned_.assign(other.begin(), other.end());
}

Storage& Storage::operator=(const Storage& other) {
  if (this != &other) *this = Storage(other);
  return *this;
}

Storage::Storage(Storage&& other) noexcept { *this = std::move(other); }

Storage& Storage::operator=(Storage&& other) noexcept {  // the moved-from storage is empty, host
  if (this == &other) return *this;
  owned_ = std::move(other.owned_);
  borrowed_ = std::exchange(other.borrowed_, nullptr);
  borrowed_count_ = std::exchange(other.borrowed_count_, 0);
  device_ = std::exchange(other.device_, Device{});
  keeper_ = std::move(other.keeper_);
  copier_ = std::move(other.copier_);
  other.owned_.clear();
  return *this;
}

void Storage::require_host(const char* what) const {
  if (!device_.is_host())
    throw Error(Status::invalid_argument, std::string("tensor storage: cannot ") + what + " memory on " +
                                              device_.name() + " from the host; copy it with its backend");
}

// A borrowed storage of another size: host memory it shares the ownership of (a backend's
// allocation) is let go for a vector; a plain view, or device memory, cannot change size.
bool Storage::let_go_for(std::size_t count) {
  if (!borrowed_ || count == borrowed_count_) return false;
  if (!keeper_ || !device_.is_host())
    throw Error(Status::invalid_argument, "tensor storage: borrowed memory holds " + std::to_string(borrowed_count_) +
                                              " elements and cannot hold " + std::to_string(count));
  *this = Storage();
  return true;
}

void Storage::own_unfilled(std::size_t count) {
  if (borrowed_ || owned_.size() == count) return;
  owned_.clear();  // nothing to keep: a larger buffer is not filled with the old elements
  owned_.resize(count);
}

void Storage::assign(std::size_t count, float value) {
  require_host("fill");
  let_go_for(count);
  own_unfilled(count);
  // +0 as memset writes it: std::fill's loop of stores stays scalar at -O2, 8x slower on a
  // gradient buffer (zeroed every step) than memset.
  if (empty()) return;  // memset's pointer must not be null, even for no bytes
  if (value == 0.0f && !std::signbit(value))
    std::memset(data(), 0, size() * sizeof(float));
  else
    std::fill(begin(), end(), value);
}

void Storage::resize(std::size_t count, float fill) {
  if (borrowed_ && count != borrowed_count_) {              // keeps the elements that fit, as a vector would
    if (!keeper_ || !device_.is_host()) let_go_for(count);  // throws: a view or device memory
    HostBuffer kept(begin(), begin() + std::min(count, borrowed_count_));
    let_go_for(count);
    owned_ = std::move(kept);
  }
  if (!borrowed_) owned_.resize(count, fill);
}

void Storage::resize_for_overwrite(std::size_t count) {
  require_host("write");
  let_go_for(count);
  own_unfilled(count);
#ifndef NDEBUG
  std::fill(begin(), end(), std::numeric_limits<float>::quiet_NaN());
#endif
}

bool Storage::operator==(const Storage& other) const {
  require_host("compare");
  other.require_host("compare");
  return std::equal(begin(), end(), other.begin(), other.end());
}

HostBuffer Storage::release() {
  require_host("take");
  HostBuffer out = borrowed_ ? HostBuffer(begin(), end()) : std::move(owned_);
  *this = Storage();
  return out;
}

}  // namespace braid::nn
