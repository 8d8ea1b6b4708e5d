// The rank grid of one module (Megatron's RankGenerator / HyperCommGrid): sizes per
// parallel axis, an order string naming the axes fastest-varying first ("tp-dp-pp":
// the tp ranks of a replica are consecutive, then the replicas of a stage, then the
// stages), and the first rank. A process group is a masked sub-grid: the ranks that
// share every coordinate outside the mask.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

namespace braid::runtime {

enum class Axis { tp, cp, dp, pp };
constexpr int kAxisCount = 4;

const char* axis_name(Axis axis);
std::optional<Axis> parse_axis(const std::string& name);

struct GridSizes {
  int tp = 1, cp = 1, dp = 1, pp = 1;
  int of(Axis axis) const;
};

// A rank's position on each axis, indexed by Axis.
using Coords = std::array<int, kAxisCount>;

class Grid {
 public:
  // `what` names the grid in errors and group names. Throws Error(Status::bad_config)
  // when a size is below 1, the order names an unknown or repeated axis or leaves out
  // an axis larger than 1 (axes left out are appended, slowest), the offset is
  // negative, or the sizes' product is not `ranks`.
  Grid(std::string what, const GridSizes& sizes, const std::string& order, int offset, int ranks);

  const std::string& name() const { return name_; }
  int size() const { return size_; }  // ranks in the grid
  int offset() const { return offset_; }
  int size_of(Axis axis) const { return sizes_[static_cast<std::size_t>(axis)]; }
  // The axes the order string names, fastest first ("tp-dp-pp").
  const std::vector<Axis>& named_axes() const { return named_; }
  std::string order() const;

  bool contains(int rank) const { return rank >= offset_ && rank - offset_ < size_; }
  // Throws Error(Status::invalid_argument) for a rank outside the grid.
  Coords coords(int rank) const;
  int rank_at(const Coords& c) const;

  // The group along the `mask` axes that holds `rank`, its ranks in grid order.
  std::vector<int> group_of(int rank, const std::vector<Axis>& mask) const;
  // Every group along `mask`: a partition of the grid. Group i holds the ranks whose
  // coordinates off the mask, read as a number in grid order, equal i.
  std::vector<std::vector<int>> groups(const std::vector<Axis>& mask) const;
  // Which of groups(mask) holds `rank`.
  int group_index(int rank, const std::vector<Axis>& mask) const;
  // "vision.dp[pp=0,tp=1]": the grid, the mask, and the fixed coordinates of the
  // other named axes, slowest first.
  std::string group_name(int rank, const std::vector<Axis>& mask) const;

 private:
  bool masked(Axis axis, const std::vector<Axis>& mask) const;
  int stride_of(Axis axis) const { return strides_[static_cast<std::size_t>(axis)]; }

  std::string name_;
  Coords sizes_{};
  Coords strides_{};
  std::vector<Axis> order_;  // all axes, fastest first
  std::vector<Axis> named_;
  int offset_ = 0;
  int size_ = 1;
};

}  // namespace braid::runtime
