#include "core/train/inputs.hpp"

#include <algorithm>
#include <string>

#include "core/common/error.hpp"

namespace braid::train {

namespace {

std::vector<SideGroup> stacked(std::vector<data::ImageGroup> groups) {
  std::vector<SideGroup> out;
  for (auto& g : groups) {
    const auto n = static_cast<std::int64_t>(g.members.size());
    out.push_back({g.side, std::move(g.members), nn::Tensor({n, 3, g.side, g.side}, std::move(g.pixels))});
  }
  return out;
}

}  // namespace

std::vector<SideGroup> side_groups(std::span<const data::Sample> samples) {
  return stacked(data::group_by_side(samples));
}

std::vector<SideGroup> side_groups(std::span<const data::Sample> samples, std::span<const std::size_t> picked) {
  return stacked(data::group_by_side(samples, picked));
}

nn::Tokens tokens_of(std::span<const data::Sample> samples, std::span<const std::size_t> members, std::int64_t pad_to) {
  // pad_tokens reads only the tokens: gather those, not the pixels.
  std::vector<data::Sample> picked(members.size());
  for (std::size_t k = 0; k < members.size(); ++k) {
    if (members[k] >= samples.size())
      throw Error(Status::invalid_argument, "tokens_of: member " + std::to_string(members[k]) + " of a batch of " +
                                                std::to_string(samples.size()) + " samples");
    picked[k].tokens = samples[members[k]].tokens;
  }
  return tokens_of(picked, pad_to);
}

nn::Tokens tokens_of(std::span<const data::Sample> samples, std::int64_t pad_to) {
  const data::TokenBatch b = data::pad_tokens(samples, pad_to);
  nn::Tokens t;
  t.batch = b.batch;
  t.length = b.length;
  t.ids = b.ids;
  t.lengths = b.lengths;
  return t;
}

cost::TrainedSample trained_sample(const data::Sample& s) { return {s.side, static_cast<int>(s.tokens.size())}; }

std::int64_t counted_tokens(std::span<const data::Sample> samples) {
  std::int64_t n = 0;
  for (const auto& s : samples) n += std::max<std::int64_t>(0, static_cast<std::int64_t>(s.tokens.size()) - 1);
  return n;
}

}  // namespace braid::train
