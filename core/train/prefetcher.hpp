// Decoupled preprocessing (DistTrain): the next steps' samples, picked by the loader (the
// DistTrain reordering over DP replicas), rendered and tokenized in worker threads ahead of
// training, behind a bounded queue, so the training loop does not wait for data it could
// have had. Steps come out in order and are the same samples, in the same order, as the
// loader gives without workers.
//
// A failure in a worker (a sample that cannot be rendered) reaches the trainer at that
// step as an Error naming the sample; the workers stop, and the destructor joins them: no
// thread outlives the prefetcher.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/data/shapes.hpp"
#include "core/train/loader.hpp"

namespace braid::train {

struct PrefetchOptions {
  int workers = 1;     // 0: render in the caller's thread, at take(); at most 1 describing samples
  int depth = 2;       // steps rendered ahead of the one taken last (at least one per worker)
  bool pixels = true;  // false: the samples described, without images (ShapesDataset::describe)
};

class Prefetcher {
 public:
  using Render = std::function<data::Sample(std::int64_t index)>;
  // Steps first .. last (inclusive) of `replica`'s share; `render` makes one sample (by
  // default the loader's dataset renders it, or describes it when options.pixels is false).
  // `loader` outlives the prefetcher.
  Prefetcher(const Loader& loader, int replica, std::int64_t first, std::int64_t last, PrefetchOptions options = {},
             Render render = {});
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The samples of `step`, the next step in order; blocks until they are ready (the caller
  // times the call: a wait, or the rendering itself without workers). Throws the worker's Error (naming the sample) if
  // it failed, Error(invalid_argument) for a step out of order or outside first .. last.
  std::vector<data::Sample> take(std::int64_t step);

 private:
  std::vector<data::Sample> make(std::int64_t step) const;
  void work();
  void stop();  // joins the workers

  const Loader& loader_;
  int replica_;
  std::int64_t next_take_, last_;
  PrefetchOptions options_;
  Render render_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::int64_t next_make_;  // the next step a worker picks up
  bool stopping_ = false;
  std::map<std::int64_t, std::vector<data::Sample>> ready_;
  std::map<std::int64_t, std::exception_ptr> failed_;
  std::vector<std::thread> workers_;
};

}  // namespace braid::train
