#include "core/nn/modules/decoder.hpp"

#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

Decoder::Decoder(ParameterStore& store, std::string name, const DecoderShape& shape, bool frozen)
    : Module(std::move(name), frozen),
      shape_(shape),
      token_table_(&param(store, "token_embed", {shape.vocab, shape.transformer.hidden}, Init::normal(kInitStd))),
      position_table_(
          &param(store, "pos_embed", {shape.max_positions, shape.transformer.hidden}, Init::normal(kInitStd))),
      transformer_(store, this->name(), shape.transformer, frozen),
      lm_head_(store, this->name() + ".lm_head", shape.transformer.hidden, shape.vocab, false, kInitStd, frozen) {
  if (!shape.transformer.causal)
    throw Error(Status::invalid_argument, this->name() + ": a decoder trained on next tokens must be causal");
  adopt(transformer_);
  adopt(lm_head_);
}

std::vector<DecoderPart> split_decoder(int layers, int stages) {
  if (stages < 1)
    throw Error(Status::invalid_argument,
                "split_decoder: needs at least one pipeline stage, got " + std::to_string(stages));
  if (stages > layers)
    throw Error(Status::invalid_argument, "split_decoder: " + std::to_string(stages) + " pipeline stages do not fit " +
                                              std::to_string(layers) +
                                              " decoder layers (each stage needs at least one block)");
  std::vector<DecoderPart> parts;
  int first = 0;
  for (int stage = 0; stage < stages; ++stage) {
    const int blocks = layers / stages + (stage < layers % stages ? 1 : 0);
    parts.push_back({first, first + blocks});
    first += blocks;
  }
  return parts;
}

Tensor Decoder::forward(Ops& ops, const Tensor* prefix, const Tokens& text, DecoderCache& c) const {
  return forward_part(ops, whole(), prefix, text, c);
}

Tensor Decoder::backward(Ops& ops, const Tensor& dlogits, const DecoderCache& c) const {
  return backward_part(ops, whole(), dlogits, c);
}

void Decoder::check_part(const DecoderPart& part) const {
  if (part.first < 0 || part.first > part.last || part.last > layers())
    throw Error(Status::invalid_argument, name() + ": part [" + std::to_string(part.first) + ", " +
                                              std::to_string(part.last) + ") is not a range of its " +
                                              std::to_string(layers()) + " blocks");
}

Tensor Decoder::forward_part(Ops& ops, const DecoderPart& part, const Tensor* input, const Tokens& text,
                             DecoderCache& c) const {
  check_part(part);
  text.check(name());
  const bool first = part.first == 0, last = part.last == layers();
  const int64_t batch = text.batch, length = text.length, hidden = shape_.transformer.hidden;
  if (batch < 1) throw Error(Status::invalid_argument, name() + ": needs at least one sequence");
  int64_t p = 0;
  if (first) {
    if (input && (input->rank() != 3 || input->dim(0) != batch || input->dim(2) != hidden))
      throw Error(Status::invalid_argument, name() + ": the prefix must be (" + std::to_string(batch) + ", tokens, " +
                                                std::to_string(hidden) + "), got " + shape_string(input->shape));
    p = input ? input->dim(1) : 0;
  } else {
    if (!input || input->rank() != 3 || input->dim(0) != batch || input->dim(1) < length || input->dim(2) != hidden)
      throw Error(Status::invalid_argument, name() + ": part [" + std::to_string(part.first) + ", " +
                                                std::to_string(part.last) + ") takes the previous part's hidden (" +
                                                std::to_string(batch) + ", prefix + " + std::to_string(length) +
                                                " text tokens, " + std::to_string(hidden) + "), got " +
                                                (input ? shape_string(input->shape) : std::string("none")));
    p = input->dim(1) - length;
  }
  const int64_t s = p + length;
  if (s > shape_.max_positions)
    throw Error(Status::invalid_argument, name() + ": " + std::to_string(p) + " prefix + " + std::to_string(length) +
                                              " text tokens exceed max_positions " +
                                              std::to_string(shape_.max_positions));
  c.part = part;
  c.text = text;
  c.prefix = p;
  c.sequence = s;
  c.prefix_rows.resize(static_cast<std::size_t>(batch * p));
  c.text_rows.resize(static_cast<std::size_t>(batch * length));
  c.positions.resize(static_cast<std::size_t>(batch * s));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < p; ++i) c.prefix_rows[static_cast<std::size_t>(b * p + i)] = row_id(b * s + i);
    for (int64_t t = 0; t < length; ++t) c.text_rows[static_cast<std::size_t>(b * length + t)] = row_id(b * s + p + t);
    for (int64_t i = 0; i < s; ++i) c.positions[static_cast<std::size_t>(b * s + i)] = row_id(i);
  }
  c.text_hidden = Tensor();
  c.transformer.last = Tensor();

  Tensor h;
  if (first) {
    // [prefix ; text] as rows of one (B*S, hidden) table: scatters into a zero tensor.
    Tensor x = zeros(ops, {batch * s, hidden});
    if (p > 0) scatter_add_rows(ops, c.prefix_rows, *input, x);
    scatter_add_rows(ops, c.text_rows, vocab_parallel_embedding_forward(ops, *token_table_, text.ids, tp_.group()), x);
    ops.add(x, gather_rows(ops, position_table_->value, c.positions));
    x.reshape({batch, s, hidden});
    h = transformer_.forward_blocks(ops, std::move(x), part.first, part.last, c.transformer, tp_.group());
  } else {
    h = transformer_.forward_blocks(ops, *input, part.first, part.last, c.transformer, tp_.group());
  }
  if (!last) return h;

  h = transformer_.forward_final_norm(ops, std::move(h), c.transformer);
  h.reshape({batch * s, hidden});
  c.text_hidden = gather_rows(ops, h, c.text_rows);
  Tensor logits = column_parallel_forward(ops, lm_head_, c.text_hidden, tp_.group());
  logits.reshape({batch, length, shape_.vocab / tp_.group().size});
  return logits;
}

Tensor Decoder::backward_part(Ops& ops, const DecoderPart& part, const Tensor& d_output, const DecoderCache& c) const {
  check_part(part);
  if (part.first != c.part.first || part.last != c.part.last)
    throw Error(Status::invalid_argument, name() + ": the backward of part [" + std::to_string(part.first) + ", " +
                                              std::to_string(part.last) + ") got the cache of part [" +
                                              std::to_string(c.part.first) + ", " + std::to_string(c.part.last) + ")");
  const bool first = part.first == 0, last = part.last == layers();
  const int64_t batch = c.text.batch, length = c.text.length, hidden = shape_.transformer.hidden;
  Tensor dx;
  if (last) {
    const int64_t columns = shape_.vocab / tp_.group().size;
    expect_shape(d_output, {batch, length, columns}, "decoder backward", "dlogits");
    Tensor d_text_hidden = column_parallel_backward(ops, lm_head_, c.text_hidden,
                                                    reshaped(d_output, {batch * length, columns}), tp_.group());
    tp_allreduce(tp_.group(), d_text_hidden);  // each rank had the part through its vocabulary
    Tensor dh = zeros(ops, {batch * c.sequence, hidden});
    scatter_add_rows(ops, c.text_rows, d_text_hidden, dh);
    dh.reshape({batch, c.sequence, hidden});
    dx = transformer_.backward_blocks(ops, transformer_.backward_final_norm(ops, dh, c.transformer), c.transformer,
                                      tp_.group());
  } else {
    expect_shape(d_output, {batch, c.sequence, hidden}, "decoder backward", "d hidden");
    dx = transformer_.backward_blocks(ops, d_output, c.transformer, tp_.group());
  }
  if (!first) return dx;

  dx.reshape({batch * c.sequence, hidden});
  if (Tensor* g = position_table_->grad_or_null()) scatter_add_rows(ops, c.positions, dx, *g);
  vocab_parallel_embedding_backward(ops, *token_table_, c.text.ids, gather_rows(ops, dx, c.text_rows), tp_.group());
  if (c.prefix == 0) return Tensor();
  Tensor dprefix = gather_rows(ops, dx, c.prefix_rows);
  dprefix.reshape({batch, c.prefix, hidden});
  return dprefix;
}

std::vector<Parameter*> Decoder::part_parameters(const DecoderPart& part) const {
  check_part(part);
  std::vector<Parameter*> owned;
  auto take = [&](const Module& m) { owned.insert(owned.end(), m.parameters().begin(), m.parameters().end()); };
  if (part.first == 0) {
    owned.push_back(token_table_);
    owned.push_back(position_table_);
  }
  const auto blocks = transformer_.part_parameters(part.first, part.last);
  owned.insert(owned.end(), blocks.begin(), blocks.end());
  if (part.last == layers()) {
    take(lm_head_);
  }
  return owned;
}

void Decoder::set_tensor_parallel(TensorParallel tp) {
  transformer_.check_tensor_parallel(tp);
  check_vocabulary_split(shape_.vocab, tp, name());
  tp_.set(std::move(tp), tp_splits(), name());
}

std::vector<TpSplit> Decoder::tp_splits(const DecoderPart& part) const {
  check_part(part);
  std::vector<TpSplit> splits;
  if (part.first == 0) splits.push_back({token_table_, 0});
  transformer_.add_tp_splits(splits, part.first, part.last);
  if (part.last == layers()) add_column_parallel(splits, lm_head_);
  return splits;
}

float Decoder::loss(Ops& ops, const Tensor& logits, const Tokens& text, int64_t normalizer, Tensor* dlogits) const {
  if (logits.rank() != 3 || logits.dim(0) != text.batch || logits.dim(1) != text.length)
    throw Error(Status::invalid_argument, name() + ": logits " + shape_string(logits.shape) + " do not match " +
                                              std::to_string(text.batch) + " sequences of " +
                                              std::to_string(text.length) + " tokens");
  return vocab_parallel_cross_entropy(ops, logits, next_token_targets(text), normalizer, dlogits, tp_.group());
}

std::vector<int32_t> next_token_targets(const Tokens& text) {
  text.check("next_token_targets");
  std::vector<int32_t> targets(text.ids.size(), -1);
  for (int64_t b = 0; b < text.batch; ++b)
    for (int64_t t = 0; t + 1 < text.lengths[static_cast<std::size_t>(b)]; ++t)
      targets[static_cast<std::size_t>(b * text.length + t)] =
          text.ids[static_cast<std::size_t>(b * text.length + t + 1)];
  return targets;
}

float lm_loss(Ops& ops, const Tensor& logits, const Tokens& text, int64_t normalizer, Tensor* dlogits) {
  if (logits.rank() != 3 || logits.dim(0) != text.batch || logits.dim(1) != text.length)
    throw Error(Status::invalid_argument, "lm_loss: logits " + shape_string(logits.shape) + " do not match " +
                                              std::to_string(text.batch) + " sequences of " +
                                              std::to_string(text.length) + " tokens");
  const std::vector<int32_t> targets = next_token_targets(text);
  return ops.cross_entropy(logits, targets, normalizer, dlogits);
}

}  // namespace braid::nn
