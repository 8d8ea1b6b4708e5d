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

// Which part of the decoder a pipeline stage runs: blocks [first, last). The part with
// first == 0 also embeds (token + position tables, and takes the prefix); the part with
// last == layers also applies the final norm and the LM head.
struct DecoderPart {
  int first = 0, last = 0;
};

// The parts of an even split into `stages` (earlier stages get the extra block); throws
// Error(invalid_argument) when stages < 1 or > layers.
std::vector<DecoderPart> split_decoder(int layers, int stages);

// What a part's backward needs from its forward. Every part fills the row tables from the
// text, so the last part knows the prefix length and the text rows without the first's cache.
struct DecoderCache {
  DecoderPart part;  // the part whose forward filled this cache
  Tokens text;
  int64_t prefix = 0, sequence = 0;  // P and S = P + T
  std::vector<int32_t> prefix_rows;  // row b*S + p of each prefix token
  std::vector<int32_t> text_rows;    // row b*S + P + t of each text token
  std::vector<int32_t> positions;    // per sequence row: its position
  TransformerCache transformer;      // the part's blocks (and the final norm for the last part)
  Tensor text_hidden;                // (B*T, hidden): the LM head's input (last part only)
};

class Decoder : public Module {
 public:
  Decoder(ParameterStore& store, std::string name, const DecoderShape& shape, bool frozen);
  const DecoderShape& shape() const { return shape_; }
  int layers() const { return transformer_.layers(); }
  DecoderPart whole() const { return {0, layers()}; }

  // The whole decoder, i.e. forward_part / backward_part of whole().
  // prefix (B, P, hidden) or null; text (B, T); P + T <= max_positions. Returns the logits
  // (B, T, vocab) of every text position.
  Tensor forward(Ops& ops, const Tensor* prefix, const Tokens& text, DecoderCache& cache) const;
  // dlogits (B, T, vocab). Adds the parameter gradients; returns the prefix's gradient
  // (B, P, hidden), empty without a prefix.
  Tensor backward(Ops& ops, const Tensor& dlogits, const DecoderCache& cache) const;

  // First part: `input` = prefix (B,P,hidden) or null; others: `input` = the previous part's
  // output hidden (B,S,hidden) (S = P + T). Returns hidden (B,S,hidden), or the logits
  // (B,T,vocab) for the last part. `text` is needed by every part (lengths, positions).
  // Throws Error(invalid_argument) unless 0 <= first <= last <= layers and the shapes agree.
  Tensor forward_part(Ops& ops, const DecoderPart& part, const Tensor* input, const Tokens& text,
                      DecoderCache& cache) const;
  // d_output: d hidden, or d logits for the last part. Adds the part's parameter gradients;
  // returns d input: d hidden (B,S,hidden) for a non-first part, d prefix (B,P,hidden) (empty
  // without prefix) for the first.
  Tensor backward_part(Ops& ops, const DecoderPart& part, const Tensor& d_output, const DecoderCache& cache) const;
  // The parameters a part owns (embedding tables with the first, final norm + head with the
  // last), in the store's order.
  std::vector<Parameter*> part_parameters(const DecoderPart& part) const;

  // Megatron tensor parallelism for every later forward and backward (default: size 1, none):
  // the blocks split by heads and ffn columns, the token table and the LM head by vocabulary
  // (the logits a part returns are this rank's vocabulary columns); position table, norms and
  // row-parallel biases replicated. Slices the parameters for this rank, or gathers them
  // whole when tp.size is 1 (collective over the old group). Throws Error(invalid_argument)
  // naming the block or the vocabulary when tp.size does not divide the heads, the ffn width
  // or the vocabulary, or the group is malformed; a refused group changes nothing.
  void set_tensor_parallel(TensorParallel tp);
  // Block `layer`, and the hooks called around every block it runs (ZeRO; null: none).
  const TransformerBlock& block(int layer) const { return transformer_.block(layer); }
  void set_block_hooks(BlockHooks* hooks) { transformer_.set_block_hooks(hooks); }
  void set_recompute(spec::Recompute recompute) { transformer_.set_recompute(recompute); }
  const TensorParallel& tensor_parallel() const { return tp_.group(); }
  // Forgets the group's callback (its owner is going away); the slices stay.
  void detach_tensor_parallel() { tp_.detach(); }
  // The parameters tensor parallelism splits, of the whole decoder or of a part.
  std::vector<TpSplit> tp_splits() const { return tp_splits(whole()); }
  std::vector<TpSplit> tp_splits(const DecoderPart& part) const;

  // The causal LM loss of this decoder's logits (B, T, vocab, or this rank's vocabulary
  // columns under tensor parallelism): lm_loss, vocabulary-parallel when split.
  float loss(Ops& ops, const Tensor& logits, const Tokens& text, int64_t normalizer, Tensor* dlogits) const;

 private:
  void check_part(const DecoderPart& part) const;

  DecoderShape shape_;
  Parameter* token_table_;
  Parameter* position_table_;
  Transformer transformer_;
  Linear lm_head_;
  TensorParallelState tp_;
};

// Next-token targets of a text batch, one per (b, t): token t + 1 of sample b while
// t + 1 < lengths[b], else -1 (ignored).
std::vector<int32_t> next_token_targets(const Tokens& text);

// The causal LM loss of decoder logits (B, T, V): cross-entropy against
// next_token_targets, summed over counted positions and divided by `normalizer` (0: by
// their count here, the mean; see Ops::cross_entropy). Writes d loss / d logits unless null.
float lm_loss(Ops& ops, const Tensor& logits, const Tokens& text, int64_t normalizer, Tensor* dlogits);

}  // namespace braid::nn
