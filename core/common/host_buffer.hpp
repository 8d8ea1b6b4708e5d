// Host memory for floats that grows without zeroing: the buffer kernels write whole (tensor
// outputs), stacked pixels, and the messages the trainer sends. Moves between these owners
// keep the memory; a std::vector<float> would have to be copied, since its allocator differs.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace braid {

// Grows a vector without value-initialising what it adds (resize(n) default-initialises a
// float: leaves it as it was); every other construct is the standard one. Zeroing an output a
// kernel then writes whole took 7.6% of a tiny-clip run's CPU samples (perf record, 2 ranks).
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}  // NOLINT: allocators convert
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using HostBuffer = std::vector<float, UninitializedAllocator<float>>;

}  // namespace braid
