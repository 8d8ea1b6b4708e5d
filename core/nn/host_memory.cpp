#include "core/nn/host_memory.hpp"

#include <malloc.h>

#include "core/common/error.hpp"

namespace braid::nn {

void keep_freed_host_memory() {
  if (mallopt(M_TRIM_THRESHOLD, kHostTrimThreshold) != 1 || mallopt(M_MMAP_THRESHOLD, kHostMmapThreshold) != 1)
    throw Error(Status::internal, "mallopt refused the trim or mmap threshold");
}

std::string keep_freed_host_memory_env() {
  return "GLIBC_TUNABLES=glibc.malloc.trim_threshold=" + std::to_string(kHostTrimThreshold) +
         ":glibc.malloc.mmap_threshold=" + std::to_string(kHostMmapThreshold) + " ";
}

}  // namespace braid::nn
