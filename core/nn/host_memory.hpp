// How a process running the host ops keeps its memory: the reference modules allocate their
// activations afresh every step, and under glibc's default thresholds the top of the heap goes
// back to the kernel when a step frees them, to be faulted in again by the next step (a
// quarter to a third of a tiny model's step). Raising the trim threshold keeps freed memory in
// the process, and raising the mmap threshold serves blocks up to 32 MiB (glibc's largest) from
// the heap, as a caching allocator would. braid train and the training benchmark set this.
#pragma once

#include <string>

namespace braid::nn {

inline constexpr int kHostTrimThreshold = 256 << 20;  // bytes kept after a free
inline constexpr int kHostMmapThreshold = 32 << 20;   // larger blocks come from mmap

// Sets both thresholds in this process (mallopt); throws Error(internal) if glibc refuses.
void keep_freed_host_memory();
// The same settings as an environment assignment for a child process
// ("GLIBC_TUNABLES=glibc.malloc.trim_threshold=...:glibc.malloc.mmap_threshold=... ").
std::string keep_freed_host_memory_env();

}  // namespace braid::nn
