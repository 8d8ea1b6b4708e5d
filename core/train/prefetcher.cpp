#include "core/train/prefetcher.hpp"

#include <algorithm>
#include <string>

#include "core/common/error.hpp"

namespace braid::train {

Prefetcher::Prefetcher(const Loader& loader, int replica, std::int64_t first, std::int64_t last,
                       PrefetchOptions options, Render render)
    : loader_(loader),
      replica_(replica),
      next_take_(first),
      last_(last),
      options_(options),
      render_(std::move(render)),
      next_make_(first) {
  if (!render_) {
    render_ = [this](std::int64_t i) {
      return options_.pixels ? loader_.dataset().get(i) : loader_.dataset().describe(i);
    };
    // Describing a sample is a lookup, not a render: one worker keeps ahead of it.
    if (!options_.pixels) options_.workers = std::min(options_.workers, 1);
  }
  // A worker renders a whole step: with fewer steps allowed ahead than workers, the others
  // would only wait.
  options_.depth = std::max({options_.depth, options_.workers, 1});
  try {
    for (int w = 0; w < options_.workers; ++w) workers_.emplace_back([this] { work(); });
  } catch (...) {  // no thread could be started: stop those that were
    stop();
    throw;
  }
}

Prefetcher::~Prefetcher() { stop(); }

void Prefetcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

// One step's samples, each named when it fails.
std::vector<data::Sample> Prefetcher::make(std::int64_t step) const {
  std::vector<data::Sample> out;
  for (std::int64_t index : loader_.indices(step, replica_)) {
    try {
      out.push_back(render_(index));
    } catch (const Error& e) {
      throw Error(e.status(), "data worker: sample " + std::to_string(index) + " of step " + std::to_string(step) +
                                  ": " + e.what());
    } catch (const std::exception& e) {
      throw Error(Status::internal, "data worker: sample " + std::to_string(index) + " of step " +
                                        std::to_string(step) + ": " + e.what());
    }
  }
  return out;
}

void Prefetcher::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // At most `depth` steps past the one being taken, and nothing after a failure.
    changed_.wait(lock, [&] {
      return stopping_ || (failed_.empty() && next_make_ <= last_ && next_make_ < next_take_ + options_.depth);
    });
    if (stopping_) return;
    const std::int64_t step = next_make_++;
    lock.unlock();
    std::vector<data::Sample> samples;
    std::exception_ptr error;
    try {
      samples = make(step);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    try {
      if (!error) ready_.emplace(step, std::move(samples));
    } catch (...) {  // out of memory storing them: the trainer gets that as the step's failure
      error = std::current_exception();
    }
    if (error) failed_.emplace(step, error);
    changed_.notify_all();
  }
}

std::vector<data::Sample> Prefetcher::take(std::int64_t step) {
  if (step != next_take_ || step > last_)
    throw Error(Status::invalid_argument, "prefetcher: step " + std::to_string(step) + " asked, step " +
                                              std::to_string(next_take_) + " is next (of " + std::to_string(last_) +
                                              ")");
  std::vector<data::Sample> out;
  if (workers_.empty()) {
    out = make(step);
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    // Ready, failed, or never to be made (the workers stopped at an earlier failure).
    changed_.wait(
        lock, [&] { return ready_.count(step) || failed_.count(step) || (!failed_.empty() && next_make_ <= step); });
    if (!ready_.count(step)) std::rethrow_exception(failed_.count(step) ? failed_.at(step) : failed_.begin()->second);
    out = std::move(ready_.at(step));
    ready_.erase(step);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    next_take_ = step + 1;
  }
  changed_.notify_all();
  return out;
}

}  // namespace braid::train
