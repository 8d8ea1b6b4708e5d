#include "core/nn/parallel.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>
#include <vector>

namespace braid::nn {

void parallel_for(int threads, int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t most = (n + std::max<int64_t>(min_chunk, 1) - 1) / std::max<int64_t>(min_chunk, 1);
  const int64_t chunks = std::clamp<int64_t>(most, 1, std::max(threads, 1));
  if (chunks == 1) {
    body(0, n);
    return;
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  auto run = [&](int64_t c) {
    try {
      body(n * c / chunks, n * (c + 1) / chunks);
    } catch (...) {
      errors[static_cast<std::size_t>(c)] = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<std::size_t>(chunks - 1));
  for (int64_t c = 1; c < chunks; ++c) workers.emplace_back(run, c);
  run(0);
  for (auto& w : workers) w.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

int64_t chunk_for(double work_per_index) {
  constexpr double kMinWork = 65536.0;  // below this a thread costs more than it saves
  return static_cast<int64_t>(std::ceil(kMinWork / std::max(work_per_index, 1.0)));
}

}  // namespace braid::nn
