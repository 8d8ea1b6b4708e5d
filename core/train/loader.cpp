#include "core/train/loader.hpp"

#include <string>

#include "core/common/error.hpp"
#include "core/data/reorder.hpp"

namespace braid::train {

Loader::Loader(const data::ShapesDataset& dataset, LoaderOptions options) : dataset_(dataset), options_(options) {
  const auto& o = options_;
  if (o.replicas < 1 || o.global_batch < o.replicas || o.global_batch % o.replicas != 0)
    throw Error(Status::invalid_argument, "loader: a global batch of " + std::to_string(o.global_batch) +
                                              " does not split evenly over " + std::to_string(o.replicas) +
                                              " data-parallel replicas");
}

std::vector<std::int64_t> Loader::indices(std::int64_t step, int replica) const {
  const auto& o = options_;
  if (step < 1) throw Error(Status::invalid_argument, "loader: steps count from 1 (got " + std::to_string(step) + ")");
  if (replica < 0 || replica >= o.replicas)
    throw Error(Status::invalid_argument,
                "loader: replica " + std::to_string(replica) + " of " + std::to_string(o.replicas));
  const std::int64_t first = (step - 1) * o.global_batch, share = o.global_batch / o.replicas;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(share));
  if (!o.reorder || o.replicas == 1) {
    for (std::int64_t i = 0; i < share; ++i) out.push_back(first + replica * share + i);
    return out;
  }
  std::vector<double> costs(static_cast<std::size_t>(o.global_batch));
  for (std::int64_t i = 0; i < o.global_batch; ++i) {
    const double side = dataset_.side(first + i);
    costs[static_cast<std::size_t>(i)] = side * side;
  }
  const data::RankAssignment a = data::assign_lpt(costs, o.replicas);
  for (std::int64_t i = 0; i < o.global_batch; ++i)
    if (a.rank[static_cast<std::size_t>(i)] == replica) out.push_back(first + i);
  return out;
}

std::vector<data::Sample> Loader::samples(std::int64_t step, int replica) const {
  std::vector<data::Sample> out;
  for (std::int64_t i : indices(step, replica)) out.push_back(dataset_.get(i));
  return out;
}

}  // namespace braid::train
