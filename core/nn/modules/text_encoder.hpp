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

#include "core/nn/modules/encoder_part.hpp"
#include "core/nn/modules/transformer.hpp"

namespace braid::nn {

struct TextEncoderShape {
  TransformerShape transformer;
  int64_t vocab = 0;
  int64_t max_positions = 0;
};

// What a part's backward needs from its forward. Every part keeps the tokens (the lengths
// say where the last part pools).
struct TextEncoderCache {
  EncoderPart part;  // the part whose forward filled this cache
  Tokens tokens;
  std::vector<int32_t> positions;  // per token (B*T): its position (first part)
  std::vector<int32_t> last_rows;  // per sample: the row b*T + lengths[b] - 1 it is pooled at (last part)
  TransformerCache transformer;    // the part's blocks (and the final norm for the last part)
};

class TextEncoder : public Module {
 public:
  TextEncoder(ParameterStore& store, std::string name, const TextEncoderShape& shape, bool frozen);
  const TextEncoderShape& shape() const { return shape_; }
  int layers() const { return transformer_.layers(); }
  EncoderPart whole() const { return {0, layers()}; }

  // The whole encoder, i.e. forward_part / backward_part of whole().
  // tokens (B, T), T <= max_positions: tokens (B, T, hidden); pooled (B, hidden) at each
  // sample's last token.
  EncoderOutput forward(Ops& ops, const Tokens& tokens, TextEncoderCache& cache) const;
  // Gradients of the tokens and/or of the pooled output (null: none). Adds the parameter
  // gradients (the token and position tables included).
  void backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const TextEncoderCache& cache) const;

  // Every part takes the `tokens` (B, T); the first embeds them (`hidden` ignored), the others
  // take `hidden` (B, T, hidden), the previous part's output. Returns in `tokens` the part's
  // output hidden (B, T, hidden): the final tokens for the last part, which alone also fills
  // `pooled` (B, hidden). Throws Error(invalid_argument) unless 0 <= first <= last <= layers
  // and the inputs are there with the right shapes.
  EncoderOutput forward_part(Ops& ops, const EncoderPart& part, const Tokens& tokens, const Tensor* hidden,
                             TextEncoderCache& cache) const;
  // The last part takes the gradients of the tokens and/or of the pooled output, as backward;
  // other parts the gradient of their output hidden in `d_tokens` (`d_pooled` must be null).
  // Adds the part's parameter gradients; returns d hidden (B, T, hidden) for a non-first part,
  // empty for the first.
  Tensor backward_part(Ops& ops, const EncoderPart& part, const Tensor* d_tokens, const Tensor* d_pooled,
                       const TextEncoderCache& cache) const;
  // The parameters a part owns (token and position tables with the first, the final norm with
  // the last), in the store's order.
  std::vector<Parameter*> part_parameters(const EncoderPart& part) const;

  // Megatron tensor parallelism of the blocks for every later forward and backward (default:
  // size 1, none), and the token table by vocabulary (vocabulary-parallel embedding). Slices the parameters for this
  // rank, or gathers them whole when tp.size is 1 (collective over the old group). Throws Error(invalid_argument)
  // naming the block or the vocabulary when tp.size does not divide the heads or the ffn width or the vocabulary, or
  // the group is malformed; a refused group changes nothing.
  void set_tensor_parallel(TensorParallel tp);
  // Block `layer`, and the hooks called around every block it runs (ZeRO; null: none).
  const TransformerBlock& block(int layer) const { return transformer_.block(layer); }
  void set_block_hooks(BlockHooks* hooks) { transformer_.set_block_hooks(hooks); }
  void set_recompute(spec::Recompute recompute) { transformer_.set_recompute(recompute); }
  const TensorParallel& tensor_parallel() const { return tp_.group(); }
  // Forgets the group's callback (its owner is going away); the slices stay.
  void detach_tensor_parallel() { tp_.detach(); }

 private:
  TextEncoderShape shape_;
  Parameter* token_table_;
  Parameter* position_table_;
  Transformer transformer_;
  TensorParallelState tp_;
};

}  // namespace braid::nn
