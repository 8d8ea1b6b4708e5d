#include "core/runtime/grid.hpp"

#include <algorithm>
#include <climits>

#include "core/common/error.hpp"
#include "core/common/text.hpp"

namespace braid::runtime {
namespace {

constexpr std::array<Axis, kAxisCount> kAllAxes = {Axis::tp, Axis::cp, Axis::dp, Axis::pp};

std::size_t at(Axis a) { return static_cast<std::size_t>(a); }

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = order.find('-', start);
    out.push_back(order.substr(start, dash == std::string::npos ? std::string::npos : dash - start));
    if (dash == std::string::npos) return out;
    start = dash + 1;
  }
}

}  // namespace

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::tp:
      return "tp";
    case Axis::cp:
      return "cp";
    case Axis::dp:
      return "dp";
    case Axis::pp:
      return "pp";
  }
  return "?";
}

std::optional<Axis> parse_axis(const std::string& name) {
  for (Axis a : kAllAxes) {
    if (name == axis_name(a)) return a;
  }
  return std::nullopt;
}

int GridSizes::of(Axis axis) const {
  switch (axis) {
    case Axis::tp:
      return tp;
    case Axis::cp:
      return cp;
    case Axis::dp:
      return dp;
    case Axis::pp:
      return pp;
  }
  return 1;
}

Grid::Grid(std::string what, const GridSizes& sizes, const std::string& order, int offset, int ranks)
    : name_(std::move(what)), offset_(offset) {
  auto fail = [&](const std::string& why) { throw Error(Status::bad_config, name_ + ": " + why); };
  long long product = 1;
  std::string shape;
  for (Axis a : kAllAxes) {
    const int n = sizes.of(a);
    if (n < 1) fail(std::string(axis_name(a)) + " must be at least 1 (got " + std::to_string(n) + ")");
    sizes_[at(a)] = n;
    product *= n;
    if (product > INT_MAX) fail("the grid's sizes multiply beyond " + std::to_string(INT_MAX) + " ranks");
    if (a != Axis::cp || n > 1)
      shape += (shape.empty() ? "" : " x ") + std::string(axis_name(a)) + " " + std::to_string(n);
  }
  for (const auto& token : split_order(order)) {
    auto a = parse_axis(token);
    if (!a) fail("the grid order '" + order + "' names '" + token + "'; its axes are tp, cp, dp and pp");
    if (std::find(order_.begin(), order_.end(), *a) != order_.end())
      fail("the grid order '" + order + "' names " + token + " twice");
    order_.push_back(*a);
  }
  named_ = order_;
  // As Megatron's RankGenerator: an axis of size 1 may go unnamed; it varies slowest.
  for (Axis a : kAllAxes) {
    if (std::find(order_.begin(), order_.end(), a) != order_.end()) continue;
    if (sizes_[at(a)] > 1) {
      fail("the grid order '" + order + "' leaves out " + axis_name(a) + ", which has size " +
           std::to_string(sizes_[at(a)]));
    }
    order_.push_back(a);
  }
  if (offset < 0) fail("the first rank must be at least 0 (got " + std::to_string(offset) + ")");
  if (product != ranks) {
    fail(shape + " makes " + std::to_string(product) + " ranks, not the " + std::to_string(ranks) + " it spans");
  }
  if (static_cast<long long>(offset) + product > INT_MAX) fail("ranks beyond " + std::to_string(INT_MAX));
  size_ = static_cast<int>(product);
  int stride = 1;
  for (Axis a : order_) {
    strides_[at(a)] = stride;
    stride *= sizes_[at(a)];
  }
}

std::string Grid::order() const {
  std::string out;
  for (Axis a : named_) append_item(out, axis_name(a), "-");
  return out;
}

Coords Grid::coords(int rank) const {
  if (!contains(rank)) {
    throw Error(Status::invalid_argument, name_ + ": rank " + std::to_string(rank) + " is outside its ranks " +
                                              std::to_string(offset_) + ".." + std::to_string(offset_ + size_ - 1));
  }
  Coords c{};
  const int local = rank - offset_;
  for (Axis a : order_) c[at(a)] = local / stride_of(a) % size_of(a);
  return c;
}

int Grid::rank_at(const Coords& c) const {
  int rank = offset_;
  for (Axis a : order_) {
    if (c[at(a)] < 0 || c[at(a)] >= size_of(a)) {
      throw Error(Status::invalid_argument, name_ + ": " + axis_name(a) + " coordinate " + std::to_string(c[at(a)]) +
                                                " is outside 0.." + std::to_string(size_of(a) - 1));
    }
    rank += c[at(a)] * stride_of(a);
  }
  return rank;
}

bool Grid::masked(Axis axis, const std::vector<Axis>& mask) const {
  return std::find(mask.begin(), mask.end(), axis) != mask.end();
}

std::vector<int> Grid::group_of(int rank, const std::vector<Axis>& mask) const {
  Coords c = coords(rank);
  int base = rank;
  int count = 1;
  for (Axis a : order_) {
    if (!masked(a, mask)) continue;
    base -= c[at(a)] * stride_of(a);
    count *= size_of(a);
  }
  std::vector<int> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int j = 0; j < count; ++j) {
    int rest = j, r = base;
    for (Axis a : order_) {
      if (!masked(a, mask)) continue;
      r += rest % size_of(a) * stride_of(a);
      rest /= size_of(a);
    }
    out.push_back(r);
  }
  return out;
}

std::vector<std::vector<int>> Grid::groups(const std::vector<Axis>& mask) const {
  int count = 1;
  for (Axis a : order_) count *= masked(a, mask) ? 1 : size_of(a);
  std::vector<std::vector<int>> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int g = 0; g < count; ++g) {
    int rest = g, first = offset_;
    for (Axis a : order_) {
      if (masked(a, mask)) continue;
      first += rest % size_of(a) * stride_of(a);
      rest /= size_of(a);
    }
    out.push_back(group_of(first, mask));
  }
  return out;
}

int Grid::group_index(int rank, const std::vector<Axis>& mask) const {
  const Coords c = coords(rank);
  int index = 0, scale = 1;
  for (Axis a : order_) {
    if (masked(a, mask)) continue;
    index += c[at(a)] * scale;
    scale *= size_of(a);
  }
  return index;
}

std::string Grid::group_name(int rank, const std::vector<Axis>& mask) const {
  const Coords c = coords(rank);
  std::string axes, fixed;
  for (Axis a : named_) {
    if (masked(a, mask)) append_item(axes, axis_name(a), "-");
  }
  for (auto it = named_.rbegin(); it != named_.rend(); ++it) {
    if (masked(*it, mask)) continue;
    append_item(fixed, std::string(axis_name(*it)) + "=" + std::to_string(c[at(*it)]), ",");
  }
  return name_ + "." + (axes.empty() ? "none" : axes) + "[" + fixed + "]";
}

}  // namespace braid::runtime
