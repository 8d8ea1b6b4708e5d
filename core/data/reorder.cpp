#include "core/data/reorder.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <string>

#include "core/common/error.hpp"

namespace braid::data {
namespace {

void check(std::span<const double> costs, int ranks) {
  if (ranks < 1)
    throw Error(Status::invalid_argument, "samples need at least one rank (got " + std::to_string(ranks) + ")");
  if (costs.size() % static_cast<std::size_t>(ranks) != 0) {
    throw Error(Status::invalid_argument, std::to_string(costs.size()) + " samples do not split equally over " +
                                              std::to_string(ranks) + " ranks");
  }
  for (std::size_t i = 0; i < costs.size(); ++i) {
    if (!(std::isfinite(costs[i]) && costs[i] >= 0)) {
      throw Error(Status::invalid_argument,
                  "the cost of sample " + std::to_string(i) + " is not a finite non-negative number");
    }
  }
}

}  // namespace

RankAssignment assign_in_order(std::span<const double> costs, int ranks) {
  check(costs, ranks);
  RankAssignment a;
  a.ranks = ranks;
  a.rank.resize(costs.size());
  a.load.assign(static_cast<std::size_t>(ranks), 0);
  const std::size_t per = costs.size() / static_cast<std::size_t>(ranks);
  for (std::size_t i = 0; i < costs.size(); ++i) {
    a.rank[i] = static_cast<int>(i / per);
    a.load[i / per] += costs[i];
  }
  return a;
}

RankAssignment assign_lpt(std::span<const double> costs, int ranks) {
  check(costs, ranks);
  RankAssignment a;
  a.ranks = ranks;
  a.rank.resize(costs.size());
  a.load.assign(static_cast<std::size_t>(ranks), 0);
  std::vector<int> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    const double cx = costs[static_cast<std::size_t>(x)], cy = costs[static_cast<std::size_t>(y)];
    return cx != cy ? cx > cy : x < y;
  });
  // Ranks with room, least loaded first; a full rank leaves the heap.
  using Entry = std::pair<double, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> open;
  for (int r = 0; r < ranks; ++r) open.emplace(0.0, r);
  const std::size_t room = costs.size() / static_cast<std::size_t>(ranks);
  std::vector<std::size_t> count(static_cast<std::size_t>(ranks), 0);
  for (int i : order) {
    const auto [load, r] = open.top();
    open.pop();
    const auto ri = static_cast<std::size_t>(r);
    a.rank[static_cast<std::size_t>(i)] = r;
    a.load[ri] = load + costs[static_cast<std::size_t>(i)];
    if (++count[ri] < room) open.emplace(a.load[ri], r);
  }
  return a;
}

std::vector<int> split_microbatches(const RankAssignment& a, int microbatches) {
  const std::size_t per = a.ranks > 0 ? a.rank.size() / static_cast<std::size_t>(a.ranks) : 0;
  if (microbatches < 1 || per % static_cast<std::size_t>(microbatches) != 0) {
    throw Error(Status::invalid_argument, "the " + std::to_string(per) + " samples of a rank do not split into " +
                                              std::to_string(microbatches) + " equal microbatches");
  }
  const std::size_t size = per / static_cast<std::size_t>(microbatches);
  std::vector<int> out(a.rank.size());
  std::vector<std::size_t> seen(static_cast<std::size_t>(a.ranks), 0);
  for (std::size_t i = 0; i < a.rank.size(); ++i)
    out[i] = static_cast<int>(seen[static_cast<std::size_t>(a.rank[i])]++ / size);
  return out;
}

Straggler straggler(std::span<const double> loads) {
  Straggler s;
  if (loads.empty()) return s;
  const double max = *std::max_element(loads.begin(), loads.end());
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / static_cast<double>(loads.size());
  s.ratio = mean > 0 ? max / mean : 1;
  s.time = max - mean;
  return s;
}

CellGrid cell_grid(std::span<const int> dp_widths) {
  constexpr long long kMaxCells = 1 << 20;
  CellGrid g;
  long long cells = 1;
  int groups = 0;
  for (int d : dp_widths) {
    if (d < 1)
      throw Error(Status::invalid_argument, "a data-parallel width must be at least 1 (got " + std::to_string(d) + ")");
    cells = std::lcm(cells, static_cast<long long>(d));
    if (cells > kMaxCells) {
      throw Error(Status::invalid_argument, "the lcm of the data-parallel widths exceeds " + std::to_string(kMaxCells));
    }
    groups = std::gcd(groups, d);
  }
  g.cells = static_cast<int>(cells);
  g.groups = std::max(groups, 1);
  return g;
}

}  // namespace braid::data
