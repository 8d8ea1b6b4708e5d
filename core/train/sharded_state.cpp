#include "core/train/sharded_state.hpp"

#include <algorithm>
#include <charconv>
#include <set>
#include <system_error>
#include <utility>

#include "core/common/error.hpp"
#include "core/nn/modules/tensor_parallel_group.hpp"
#include "core/nn/tensor_parallel.hpp"

namespace braid::train {
namespace {

constexpr std::string_view kStepPrefix = "adam_step/";

// Copies `slice` into its place in `whole`: slice `index` along `axis` (0: a block of rows,
// contiguous; 1: a block of columns of a matrix). Copied rather than added into zeros so that
// every bit (the sign of a zero included) comes back as it was saved.
void place_slice(nn::Tensor& whole, const nn::Tensor& slice, int axis, int index) {
  if (axis == 0) {
    std::copy(slice.data.begin(), slice.data.end(), whole.data.begin() + index * slice.numel());
    return;
  }
  const std::int64_t rows = slice.shape[0], cols = slice.shape[1], width = whole.shape[1];
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(slice.ptr() + r * cols, slice.ptr() + (r + 1) * cols, whole.ptr() + r * width + index * cols);
}

struct Slices {
  int axis = 0, count = 1;
  nn::Tensor whole;        // the slices placed so far
  std::vector<bool> seen;  // by index
};

}  // namespace

std::string state_name(const std::string& kind, const nn::Parameter& p) {
  std::string name = kind + "/" + p.name;
  if (!p.slice.whole())
    name +=
        "@" + std::to_string(p.slice.axis) + ":" + std::to_string(p.slice.index) + "/" + std::to_string(p.slice.count);
  return name;
}

std::optional<StateName> parse_state_name(const std::string& name) {
  const auto at = name.rfind('@');
  if (name.find('/') == std::string::npos) return std::nullopt;
  if (at == std::string::npos) return StateName{name, {}};
  // "<axis>:<index>/<count>", each a decimal; a count beyond any real TP width is not ours.
  constexpr int kMostSlices = 1 << 16;
  int axis = -1, index = -1, count = -1;
  const char* p = name.data() + at + 1;
  const char* end = name.data() + name.size();
  auto number = [&](int& out, char then) {
    const auto [next, ec] = std::from_chars(p, end, out);
    if (ec != std::errc() || (then && (next == end || *next != then))) return false;
    p = then ? next + 1 : next;
    return true;
  };
  if (!number(axis, ':') || !number(index, '/') || !number(count, '\0') || p != end || axis < 0 || axis > 1 ||
      count < 1 || count > kMostSlices || index < 0 || index >= count)
    return std::nullopt;
  return StateName{name.substr(0, at), {axis, index, count}};
}

std::map<std::string, nn::Tensor> whole_tensors(const std::vector<CheckpointContents>& shards,
                                                const std::string& label) {
  const std::string where = "checkpoint '" + (label.empty() && !shards.empty() ? shards.front().source : label) + "': ";
  std::map<std::string, nn::Tensor> whole;
  std::map<std::string, Slices> sliced;
  std::set<std::string> empty;  // tensors seen without elements (optimizer state not created yet)
  // Whole copies first: a tensor some rank holds whole needs none of its slices.
  for (const CheckpointContents& c : shards)
    for (const NamedTensor& t : c.tensors())
      if (const auto name = parse_state_name(t.name); name && name->slice.whole() && t.tensor.numel() > 0)
        whole.try_emplace(name->key, t.tensor);
  for (const CheckpointContents& c : shards) {
    for (const NamedTensor& t : c.tensors()) {
      const auto name = parse_state_name(t.name);
      if (!name || whole.count(name->key)) continue;
      if (t.tensor.numel() == 0) {
        empty.insert(name->key);
        continue;
      }
      const nn::TensorSlice& s = name->slice;
      nn::Shape shape = t.tensor.shape;
      if (shape.empty() || (s.axis == 1 && shape.size() != 2))
        throw Error(Status::bad_config, "checkpoint '" + c.source + "': " + t.name + " has shape " +
                                            nn::shape_string(shape) + ", not a slice along axis " +
                                            std::to_string(s.axis));
      shape[static_cast<std::size_t>(s.axis)] *= s.count;
      auto [it, added] = sliced.try_emplace(name->key);
      Slices& into = it->second;
      if (added) {
        into = {s.axis, s.count, nn::Tensor(shape), std::vector<bool>(static_cast<std::size_t>(s.count))};
      } else if (into.axis != s.axis || into.count != s.count || into.whole.shape != shape) {
        throw Error(Status::bad_config, "checkpoint '" + c.source + "': " + t.name + " (shape " +
                                            nn::shape_string(t.tensor.shape) + ") does not match the other slices of " +
                                            name->key + ": " + std::to_string(into.count) + " along axis " +
                                            std::to_string(into.axis) + " of " + nn::shape_string(into.whole.shape));
      }
      if (into.seen[static_cast<std::size_t>(s.index)]) continue;  // a replica of a slice already placed
      into.seen[static_cast<std::size_t>(s.index)] = true;
      place_slice(into.whole, t.tensor, s.axis, s.index);
    }
  }
  for (auto& [key, s] : sliced) {
    std::string missing;
    for (int i = 0; i < s.count; ++i)
      if (!s.seen[static_cast<std::size_t>(i)]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
    if (!missing.empty())
      throw Error(Status::bad_config, where + "slice " + missing + " of the " + std::to_string(s.count) +
                                          " slices of " + key + " along axis " + std::to_string(s.axis) +
                                          " is in no shard");
    whole.emplace(key, std::move(s.whole));
  }
  for (const auto& key : empty) whole.try_emplace(key);
  return whole;
}

nn::Tensor slice_of(const nn::Tensor& whole, const nn::Parameter& p) {
  if (whole.shape != p.full_shape)
    throw Error(Status::bad_config, p.name + ": the checkpoint has shape " + nn::shape_string(whole.shape) +
                                        ", the model " + nn::shape_string(p.full_shape));
  return nn::cut_slice(whole, p.slice);
}

WholeState::WholeState(const std::vector<CheckpointContents>& shards, std::string file)
    : whole_(whole_tensors(shards, file)), file_(std::move(file)) {
  for (const CheckpointContents& c : shards)
    for (const NamedBlob& b : c.blobs())
      if (b.name.starts_with(kStepPrefix)) steps_.try_emplace(b.name.substr(kStepPrefix.size()), c.get_int(b.name));
}

HeldState WholeState::held_by(const nn::Parameter& p) const {
  const std::string where = "checkpoint '" + file_ + "': ";
  const auto tensor = [&](const std::string& kind) -> const nn::Tensor& {
    const auto it = whole_.find(kind + "/" + p.name);
    if (it == whole_.end())
      throw Error(Status::bad_config,
                  where + "no " + kind + " of parameter " + p.name + ", which this rank trains (another model?)");
    if (it->second.numel() > 0 && it->second.shape != p.full_shape)
      throw Error(Status::bad_config, where + kind + " of parameter " + p.name + " has shape " +
                                          nn::shape_string(it->second.shape) + ", the model " +
                                          nn::shape_string(p.full_shape));
    return it->second;
  };
  HeldState held;
  const nn::Tensor& value = tensor("param");
  if (value.numel() == 0)
    throw Error(Status::bad_config,
                where + "parameter " + p.name + " has no elements, the model " + nn::shape_string(p.full_shape));
  held.value = slice_of(value, p);
  const nn::Tensor& m = tensor("adam_m");
  const nn::Tensor& v = tensor("adam_v");
  if (m.numel() > 0 || v.numel() > 0) {
    if (m.numel() == 0 || v.numel() == 0)
      throw Error(Status::bad_config, where + "parameter " + p.name + " has one AdamW moment but not the other");
    held.adam.m = slice_of(m, p);
    held.adam.v = slice_of(v, p);
  }
  const auto step = steps_.find(p.name);
  if (step == steps_.end())
    throw Error(Status::bad_config, where + "no " + std::string(kStepPrefix) + p.name + ", which this rank trains");
  held.adam.step = step->second;
  return held;
}

}  // namespace braid::train
