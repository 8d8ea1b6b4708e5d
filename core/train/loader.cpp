#include "core/train/loader.hpp"

#include <string>

#include "core/common/error.hpp"
#include "core/data/reorder.hpp"

namespace braid::train {

Loader::Loader(const data::ShapesDataset& dataset, LoaderOptions options) : dataset_(dataset), options_(options) {
  const auto& o = options_;
  if (o.replicas < 1)
    throw Error(Status::invalid_argument,
                "loader: replicas is " + std::to_string(o.replicas) + "; at least 1 data-parallel replica is needed");
  if (o.groups < 1 || o.global_batch % o.groups != 0)
    throw Error(Status::invalid_argument, "loader: a global batch of " + std::to_string(o.global_batch) +
                                              " does not split into " + std::to_string(o.groups) +
                                              " contrastive groups");
  const std::int64_t group = o.global_batch / o.groups;
  if (group < o.replicas || group % o.replicas != 0)
    throw Error(Status::invalid_argument, "loader: a " +
                                              std::string(o.groups > 1 ? "contrastive group" : "global batch") +
                                              " of " + std::to_string(group) + " does not split evenly over " +
                                              std::to_string(o.replicas) + " data-parallel replicas");
}

std::vector<std::int64_t> Loader::indices(std::int64_t step, int replica) const {
  const auto& o = options_;
  if (step < 1) throw Error(Status::invalid_argument, "loader: steps count from 1 (got " + std::to_string(step) + ")");
  if (replica < 0 || replica >= o.replicas)
    throw Error(Status::invalid_argument, "loader: replica " + std::to_string(replica) + " is out of range [0, " +
                                              std::to_string(o.replicas) + ")");
  const std::int64_t group = o.global_batch / o.groups, share = group / o.replicas;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(share * o.groups));
  for (int g = 0; g < o.groups; ++g) {
    const std::int64_t first = (step - 1) * o.global_batch + g * group;
    if (!o.reorder || o.replicas == 1) {
      for (std::int64_t i = 0; i < share; ++i) out.push_back(first + replica * share + i);
      continue;
    }
    // Patch counts (see loader.hpp): sides are on the patch grid, so this is exact.
    const double patch = dataset_.config().patch;
    std::vector<double> costs(static_cast<std::size_t>(group));
    for (std::int64_t i = 0; i < group; ++i) {
      const double per_side = dataset_.side(first + i) / patch;
      costs[static_cast<std::size_t>(i)] = per_side * per_side;
    }
    const data::RankAssignment a = data::assign_lpt(costs, o.replicas);
    for (std::int64_t i = 0; i < group; ++i)
      if (a.rank[static_cast<std::size_t>(i)] == replica) out.push_back(first + i);
  }
  return out;
}

std::vector<data::Sample> Loader::samples(std::int64_t step, int replica) const {
  const std::vector<std::int64_t> picked = indices(step, replica);
  std::vector<data::Sample> out;
  out.reserve(picked.size());
  for (std::int64_t i : picked) out.push_back(dataset_.get(i));
  return out;
}

}  // namespace braid::train
