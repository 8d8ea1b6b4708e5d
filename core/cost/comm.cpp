#include "core/cost/comm.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace braid::cost {

GroupShape group_shape(int first, int stride, int count, int devices_per_node) {
  GroupShape g;
  g.size = count;
  g.nodes = 0;
  g.per_node = 0;
  if (count <= 0) return g;
  const int last = first + (count - 1) * stride;
  // Walk the nodes the group spans, counting members i with first + i*stride in the node.
  for (int node = first / devices_per_node; node <= last / devices_per_node; ++node) {
    const int lo = node * devices_per_node, hi = lo + devices_per_node - 1;
    const int from = lo <= first ? 0 : (lo - first + stride - 1) / stride;
    const int to = std::min(count - 1, (hi - first) / stride);
    if (to < from) continue;
    g.per_node = g.nodes++ == 0 ? to - from + 1 : std::min(g.per_node, to - from + 1);
  }
  return g;
}

GroupShape group_shape(const std::vector<int>& devices, int devices_per_node) {
  std::map<int, int> on_node;
  for (int d : devices) ++on_node[d / devices_per_node];
  GroupShape g;
  g.size = static_cast<int>(devices.size());
  g.nodes = static_cast<int>(on_node.size());
  g.per_node = on_node.empty() ? 0 : g.size;
  for (const auto& [node, count] : on_node) g.per_node = std::min(g.per_node, count);
  return g;
}

double CommModel::bus_bandwidth(const GroupShape& g) const {
  const auto& intra = cluster_->intra_node;
  const auto& inter = cluster_->inter_node;
  double nvlink = intra.bandwidth * intra.efficiency;
  if (g.nodes <= 1) return nvlink;
  // k members per node drive k rings in parallel, each crossing nodes on its own port.
  int ports = std::min(g.per_node, inter.nics_per_node);
  return std::min(nvlink, ports * inter.bandwidth * inter.efficiency);
}

double CommModel::latency(const GroupShape& g) const {
  return g.nodes > 1 ? cluster_->inter_node.latency : cluster_->intra_node.latency;
}

double CommModel::reduction(double bytes, const GroupShape& g) const {
  const double rate = (g.nodes > 1 ? cluster_->inter_node : cluster_->intra_node).reduce_bandwidth;
  return rate > 0 ? (g.size - 1.0) / g.size * bytes / rate : 0;
}

double CommModel::all_reduce(double bytes, const GroupShape& g) const {
  if (g.size <= 1 || bytes <= 0) return 0;
  double n = g.size, bw = bus_bandwidth(g), a = latency(g);
  double ring = 2 * (n - 1) / n * bytes / bw + 2 * (n - 1) * a;
  double tree = 2 * bytes / bw + 2 * std::ceil(std::log2(n)) * a;
  return std::min(ring, tree) + reduction(bytes, g);
}

double CommModel::all_gather(double bytes, const GroupShape& g) const {
  if (g.size <= 1 || bytes <= 0) return 0;
  double n = g.size;
  return (n - 1) / n * bytes / bus_bandwidth(g) + (n - 1) * latency(g);
}

double CommModel::reduce_scatter(double bytes, const GroupShape& g) const {
  return all_gather(bytes, g) + (g.size > 1 && bytes > 0 ? reduction(bytes, g) : 0);
}

double CommModel::p2p(double bytes, bool cross_node) const {
  if (bytes <= 0) return 0;
  const auto& link = cross_node ? cluster_->inter_node : cluster_->intra_node;
  return bytes / (link.bandwidth * link.efficiency) + link.latency;
}

}  // namespace braid::cost
