#include "core/sim/shared_cores.hpp"

#include <algorithm>
#include <map>

namespace braid::sim {

namespace {

// Busy threads on one node over time: a step function, `threads[i]` from `at[i]` on.
struct Load {
  std::vector<double> at;
  std::vector<int> threads;

  // Mean speed over [start, end), which begins at a breakpoint: 1 while the threads fit the
  // cores, else cores / threads x efficiency.
  double mean_speed(double start, double end, double cores, double efficiency) const {
    std::size_t k = static_cast<std::size_t>(std::upper_bound(at.begin(), at.end(), start) - at.begin());
    k = k > 0 ? k - 1 : 0;
    double done = 0;
    for (; k < at.size() && at[k] < end; ++k) {
      const double from = std::max(start, at[k]), to = k + 1 < at.size() ? std::min(end, at[k + 1]) : end;
      if (to > from) done += (to - from) * (threads[k] > cores ? efficiency * cores / threads[k] : 1.0);
    }
    return done / (end - start);
  }
};

}  // namespace

bool SharedCores::applies(const pipeline::Program& p) {
  if (p.cores_per_node <= 0 || p.devices_per_node <= 0) return false;
  const int per_node = std::min(p.devices, p.devices_per_node);
  return per_node * p.threads_per_device > p.cores_per_node;
}

SharedCores::SharedCores(const pipeline::Program& p) : cores_(p.cores_per_node), efficiency_(p.shared_core_efficiency) {
  for (const auto& st : p.stages) {
    for (int r = 0; r < st.replicas; ++r) {
      std::map<int, int> threads;  // node -> threads of this rank there
      for (int t = 0; t < st.devices_per_replica; ++t)
        threads[st.device(r, t) / p.devices_per_node] += p.threads_per_device;
      std::vector<Share> shares;
      for (auto [node, n] : threads) {
        shares.push_back({node, n});
        nodes_ = std::max(nodes_, node + 1);
      }
      rank_nodes_.push_back(std::move(shares));
    }
  }
}

Slowdowns SharedCores::slowdowns(const Spans& spans) const {
  // Every span's start and end as +threads / -threads on the nodes its rank runs on.
  std::vector<std::vector<std::pair<double, int>>> edges(static_cast<std::size_t>(nodes_));
  for (std::size_t r = 0; r < spans.size(); ++r) {
    for (const Span& s : spans[r]) {
      if (s.end <= s.start) continue;
      for (const Share& share : rank_nodes_[r]) {
        edges[static_cast<std::size_t>(share.node)].emplace_back(s.start, share.threads);
        edges[static_cast<std::size_t>(share.node)].emplace_back(s.end, -share.threads);
      }
    }
  }
  std::vector<Load> loads(edges.size());
  for (std::size_t n = 0; n < edges.size(); ++n) {
    auto& e = edges[n];
    std::sort(e.begin(), e.end());
    int busy = 0;
    for (std::size_t i = 0; i < e.size();) {
      const double t = e[i].first;
      for (; i < e.size() && e[i].first == t; ++i) busy += e[i].second;
      loads[n].at.push_back(t);
      loads[n].threads.push_back(busy);
    }
  }
  Slowdowns out(spans.size());
  for (std::size_t r = 0; r < spans.size(); ++r) {
    out[r].assign(spans[r].size(), 1.0);
    for (std::size_t i = 0; i < spans[r].size(); ++i) {
      const Span& s = spans[r][i];
      if (s.end <= s.start) continue;
      double speed = 1;
      for (const Share& share : rank_nodes_[r])
        speed = std::min(speed,
                         loads[static_cast<std::size_t>(share.node)].mean_speed(s.start, s.end, cores_, efficiency_));
      out[r][i] = 1 / speed;
    }
  }
  return out;
}

}  // namespace braid::sim
