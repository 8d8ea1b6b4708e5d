// Collectives and point-to-point transfers with the alpha-beta model: a latency per
// step plus bytes over the bandwidth of the slowest link the group spans.
#pragma once

#include <vector>

#include "core/spec/cluster.hpp"

namespace braid::cost {

// Where a communication group sits: how many members, how many share a node,
// how many nodes it spans. That is all the alpha-beta model needs.
struct GroupShape {
  int size = 1;
  int per_node = 1;  // members on a node; spanning nodes, the fewest on any (they drive its ports)
  int nodes = 1;

  bool operator==(const GroupShape&) const = default;
};

// Members first, first+stride, ..., first+(count-1)*stride on nodes of `devices_per_node`.
GroupShape group_shape(int first, int stride, int count, int devices_per_node);
// Members `devices` (distinct), wherever they lie.
GroupShape group_shape(const std::vector<int>& devices, int devices_per_node);

class CommModel {
 public:
  explicit CommModel(const spec::ClusterSpec& cluster) : cluster_(&cluster) {}

  // Bandwidth a ring over this group achieves (bytes/s): NVLink inside a node; across
  // nodes, one network port per member of a node, capped by NVLink.
  double bus_bandwidth(const GroupShape& g) const;
  double latency(const GroupShape& g) const;

  // `bytes` is the size of the full buffer on each member. All-reduce and reduce-scatter
  // add the summing of (n-1)/n of the buffer where the link gives a reduce bandwidth.
  double all_reduce(double bytes, const GroupShape& g) const;      // min(ring, tree) + reduction
  double all_gather(double bytes, const GroupShape& g) const;      // bytes = gathered output
  double reduce_scatter(double bytes, const GroupShape& g) const;  // bytes = input to reduce
  // One message between two devices.
  double p2p(double bytes, bool cross_node) const;

 private:
  double reduction(double bytes, const GroupShape& g) const;
  const spec::ClusterSpec* cluster_;
};

}  // namespace braid::cost
