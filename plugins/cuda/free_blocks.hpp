// Small blocks freed on a stream the plugin made, kept for the next allocation of the same
// size on that stream. Stream order makes the reuse safe without a wait (whatever used the
// block was enqueued before whatever the next owner enqueues), and it saves the pool's two
// calls per allocation: a tiny model's step allocates about 3,500 times, each pair of pool
// calls 1.5-3 us of host time on an H200 machine, where its kernels take 1-4 us.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace braid_cuda {

class FreeBlocks {
 public:
  // Blocks up to kLargestBlock bytes, kMostBytes of them in all: past these the pool takes
  // them back, so what the cache holds beyond the pool's own reserve stays small.
  static constexpr size_t kLargestBlock = size_t{1} << 20;
  static constexpr size_t kMostBytes = size_t{64} << 20;

  // The size a request is served with, and cached under (a size past the address space stays
  // as asked, for the pool to refuse).
  static size_t rounded(size_t bytes) {
    return bytes > SIZE_MAX - 511 ? bytes : ((bytes ? bytes : 1) + 511) / 512 * 512;
  }

  // A kept block of exactly `bytes` (rounded), or nullptr.
  void* take(size_t bytes);
  // Keeps `ptr` of `bytes` (rounded) for a later take; false when it is too large or the cache is
  // full, and the caller gives it back to the pool.
  bool keep(void* ptr, size_t bytes);
  // Gives every kept block back to the pool, ordered on `stream` (before it goes, or when the pool
  // is out of memory).
  void release_all(cudaStream_t stream);

 private:
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> by_size_;
  size_t bytes_ = 0;
};

}  // namespace braid_cuda
