// The decoder LLM: token embedding + learned position embedding over the sequence
// [prefix ; text] (the prefix: projected image tokens of an MLLM, or nothing), causal pre-LN
// blocks, final norm, and an untied LM head over the text positions, trained with the
// causal LM loss: text position t predicts text token t + 1; the prefix, padding and each
// sample's last token predict nothing.
//
// Padding sits after a sample's tokens, so under the causal mask no counted position sees
// it: losses do not depend on how far a batch is padded.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/nn/modules/transformer.hpp"

namespace braid::nn {

struct DecoderShape {
  TransformerShape transformer;  // causal
  int64_t vocab = 0;
  int64_t max_positions = 0;  // prefix + text
};

struct DecoderCache {
  Tokens text;
  int64_t prefix = 0, sequence = 0;  // P and S = P + T
  std::vector<int32_t> prefix_rows;  // row b*S + p of each prefix token
  std::vector<int32_t> text_rows;    // row b*S + P + t of each text token
  std::vector<int32_t> positions;    // per sequence row: its position
  TransformerCache transformer;
  Tensor text_hidden;  // (B*T, hidden): the LM head's input
};

class Decoder : public Module {
 public:
  Decoder(ParameterStore& store, std::string name, const DecoderShape& shape, bool frozen);
  const DecoderShape& shape() const { return shape_; }

  // prefix (B, P, hidden) or null; text (B, T); P + T <= max_positions. Returns the logits
  // (B, T, vocab) of every text position.
  Tensor forward(Ops& ops, const Tensor* prefix, const Tokens& text, DecoderCache& cache) const;
  // dlogits (B, T, vocab). Adds the parameter gradients; returns the prefix's gradient
  // (B, P, hidden), empty without a prefix.
  Tensor backward(Ops& ops, const Tensor& dlogits, const DecoderCache& cache) const;

 private:
  DecoderShape shape_;
  Parameter* token_table_;
  Parameter* position_table_;
  Transformer transformer_;
  Linear lm_head_;
};

// Next-token targets of a text batch, one per (b, t): token t + 1 of sample b while
// t + 1 < lengths[b], else -1 (ignored).
std::vector<int32_t> next_token_targets(const Tokens& text);

// The causal LM loss of decoder logits (B, T, V): cross-entropy against
// next_token_targets, summed over counted positions and divided by `normalizer` (0: by
// their count here, the mean; see Ops::cross_entropy). Writes d loss / d logits unless null.
float lm_loss(Ops& ops, const Tensor& logits, const Tokens& text, int64_t normalizer, Tensor* dlogits);

}  // namespace braid::nn
