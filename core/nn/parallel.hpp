// A parallel for over [0, n) on plain std::threads (OpenMP is avoided on purpose: the
// Debian OpenBLAS is built with pthreads and warns that it may hang inside OpenMP regions).
#pragma once

#include <cstdint>
#include <functional>

namespace braid::nn {

// Calls body(begin, end) on contiguous chunks that cover [0, n), using up to `threads`
// threads (the caller's included) and at least `min_chunk` indices per chunk so small
// work stays on one thread. Every index lands in exactly one chunk: when body(i) writes
// only what index i owns, the result does not depend on the thread count. The first
// exception thrown by a chunk is rethrown after all have finished.
void parallel_for(int threads, int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& body);

// Indices per chunk so that each chunk does at least ~64k flops of `work_per_index`.
int64_t chunk_for(double work_per_index);

}  // namespace braid::nn
