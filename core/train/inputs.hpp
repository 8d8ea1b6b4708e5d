// Model inputs from rendered samples: the image encoder runs one dense batch per image
// side (patch sequences of different lengths do not stack), the text towers take padded
// token batches.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/cost/cost_model.hpp"
#include "core/data/shapes.hpp"
#include "core/nn/modules/layers.hpp"

namespace braid::train {

struct SideGroup {
  int side = 0;
  std::vector<std::size_t> members;  // positions in the given span, ascending
  nn::Tensor images;                 // (members, 3, side, side)
};

// One group per distinct side, by ascending side.
std::vector<SideGroup> side_groups(std::span<const data::Sample> samples);
// The groups of samples[picked[k]], their members positions k in `picked`.
std::vector<SideGroup> side_groups(std::span<const data::Sample> samples, std::span<const std::size_t> picked);
// Tokens of the samples (or of `members` of them), padded with the tokenizer's pad id to the
// longest, or to pad_to when > 0. Throws Error(invalid_argument) when a caption is longer than
// pad_to or a member is out of range.
nn::Tokens tokens_of(std::span<const data::Sample> samples, std::int64_t pad_to = 0);
nn::Tokens tokens_of(std::span<const data::Sample> samples, std::span<const std::size_t> members,
                     std::int64_t pad_to = 0);
// A sample as it sizes the work the cost model prices: its image's side, its caption's tokens.
cost::TrainedSample trained_sample(const data::Sample& s);
// Text positions the LM loss counts (each sample's tokens but its last: nn::next_token_targets),
// summed.
std::int64_t counted_tokens(std::span<const data::Sample> samples);

}  // namespace braid::train
