// Pruning of per-module options: an option is dropped when another one is no
// worse on every figure that enters the step time (and on devices). Pruning only
// dominated options keeps the searches exact: the tests compare them with brute force.
#pragma once

#include <algorithm>
#include <array>
#include <vector>

#include "core/plan/disaggregated.hpp"

namespace braid::plan {

// Keeps the options of `all` not dominated in the figures `key` returns (all minimised).
template <std::size_t N, class Key>
std::vector<ModuleAnalysis> pareto(std::vector<ModuleAnalysis> all, Key key) {
  std::vector<std::array<double, N>> k;
  k.reserve(all.size());
  for (const auto& a : all) k.push_back(key(a));
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Lexicographic order: a dominating option always comes before what it dominates.
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return k[a] < k[b]; });
  std::vector<std::size_t> kept;
  for (std::size_t i : order) {
    bool dominated = false;
    for (std::size_t j : kept) {
      bool no_worse = true;
      for (std::size_t d = 0; d < N && no_worse; ++d) no_worse = k[j][d] <= k[i][d];
      if (no_worse) {
        dominated = true;
        break;
      }
    }
    if (!dominated) kept.push_back(i);
  }
  std::vector<ModuleAnalysis> out;
  out.reserve(kept.size());
  for (std::size_t i : kept) out.push_back(std::move(all[i]));
  return out;
}

}  // namespace braid::plan
