// The text encoder: token embedding + learned position embedding, pre-LN blocks (causal
// or bidirectional), final norm, and CLIP's pooling: the final hidden state at each
// sample's last token (the <eos> the tokenizer appends), where a causal encoder has read
// the whole caption.
//
// Padding: the attention op has no key-padding mask. With causal attention (CLIP's text
// tower) positions before a sample's end never see its padding, so the pooled output does
// not depend on how far a batch is padded. A bidirectional encoder attends to the padding:
// pad every batch to one length (e.g. max_positions) so that an embedding does not depend
// on the batch it came in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/modules/transformer.hpp"

namespace braid::nn {

struct TextEncoderShape {
  TransformerShape transformer;
  int64_t vocab = 0;
  int64_t max_positions = 0;
};

struct TextEncoderCache {
  Tokens tokens;
  std::vector<int32_t> positions;  // per token (B*T): its position
  std::vector<int32_t> last_rows;  // per sample: the row b*T + lengths[b] - 1 it is pooled at
  TransformerCache transformer;
};

class TextEncoder : public Module {
 public:
  TextEncoder(ParameterStore& store, std::string name, const TextEncoderShape& shape, bool frozen);
  const TextEncoderShape& shape() const { return shape_; }

  // tokens (B, T), T <= max_positions: tokens (B, T, hidden); pooled (B, hidden) at each
  // sample's last token.
  EncoderOutput forward(Ops& ops, const Tokens& tokens, TextEncoderCache& cache) const;
  // Gradients of the tokens and/or of the pooled output (null: none). Adds the parameter
  // gradients (the token and position tables included).
  void backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const TextEncoderCache& cache) const;

 private:
  TextEncoderShape shape_;
  Parameter* token_table_;
  Parameter* position_table_;
  Transformer transformer_;
};

}  // namespace braid::nn
