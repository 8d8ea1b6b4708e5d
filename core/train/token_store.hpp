// The image tokens of one llm replica's microbatches in a step, sample by sample, and
// their gradients: what the encoder work hands to the llm's first stage and gets back,
// whether it ran in the same process (a monolithic stage, Optimus's own lane) or on
// other ranks (DistTrain's encoder ranks, Optimus's other stages). A sample's row block
// is its image tokens x the width the llm's first stage takes in.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/common/host_buffer.hpp"

namespace braid::train {

class TokenStore {
 public:
  // `floats[i][q]`: the floats of microbatch i's sample q (its tokens x width).
  void reset(std::vector<std::vector<std::int64_t>> floats);
  int microbatches() const { return static_cast<int>(floats_.size()); }
  std::size_t samples(int microbatch) const { return floats_[static_cast<std::size_t>(microbatch)].size(); }

  std::vector<float>& tokens(int microbatch, std::size_t q) { return at(tokens_, microbatch, q); }
  std::vector<float>& grads(int microbatch, std::size_t q) { return at(grads_, microbatch, q); }
  // Whether every one of `positions` has its tokens (or gradients).
  bool has(int microbatch, std::span<const std::size_t> positions, bool grads) const;
  // The rows of `positions`, concatenated (a message); Error(internal) when one is missing.
  HostBuffer pack(int microbatch, std::span<const std::size_t> positions, bool grads) const;
  // A buffer the size of pack()'s, for a receive.
  std::vector<float> buffer(int microbatch, std::span<const std::size_t> positions) const;
  // Splits a message back into the rows of `positions`.
  void unpack(int microbatch, std::span<const std::size_t> positions, const std::vector<float>& message, bool grads);

 private:
  using Rows = std::vector<std::vector<std::vector<float>>>;  // [microbatch][sample]
  std::vector<float>& at(Rows& rows, int microbatch, std::size_t q);
  std::vector<std::vector<std::int64_t>> floats_;
  Rows tokens_, grads_;
};

}  // namespace braid::train
