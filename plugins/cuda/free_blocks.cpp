#include "free_blocks.hpp"

namespace braid_cuda {

void* FreeBlocks::take(size_t bytes) {
  std::lock_guard lock(mutex_);
  auto it = by_size_.find(bytes);
  if (it == by_size_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  bytes_ -= bytes;
  return ptr;
}

bool FreeBlocks::keep(void* ptr, size_t bytes) {
  std::lock_guard lock(mutex_);
  if (bytes > kLargestBlock || bytes_ + bytes > kMostBytes) return false;
  by_size_[bytes].push_back(ptr);
  bytes_ += bytes;
  return true;
}

void FreeBlocks::release_all(cudaStream_t stream) {
  std::lock_guard lock(mutex_);
  for (auto& [bytes, blocks] : by_size_)
    for (void* ptr : blocks) cudaFreeAsync(ptr, stream);  // best effort: the stream or the pool is going
  by_size_.clear();
  bytes_ = 0;
}

}  // namespace braid_cuda
