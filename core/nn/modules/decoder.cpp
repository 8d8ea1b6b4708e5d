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

Tensor Decoder::forward(Ops& ops, const Tensor* prefix, const Tokens& text, DecoderCache& c) const {
  text.check(name());
  const int64_t batch = text.batch, length = text.length, hidden = shape_.transformer.hidden;
  if (batch < 1) throw Error(Status::invalid_argument, name() + ": needs at least one sequence");
  if (prefix && (prefix->rank() != 3 || prefix->dim(0) != batch || prefix->dim(2) != hidden))
    throw Error(Status::invalid_argument, name() + ": the prefix must be (" + std::to_string(batch) + ", tokens, " +
                                              std::to_string(hidden) + "), got " + shape_string(prefix->shape));
  const int64_t p = prefix ? prefix->dim(1) : 0, s = p + length;
  if (s > shape_.max_positions)
    throw Error(Status::invalid_argument, name() + ": " + std::to_string(p) + " prefix + " + std::to_string(length) +
                                              " text tokens exceed max_positions " +
                                              std::to_string(shape_.max_positions));
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
  // [prefix ; text] as rows of one (B*S, hidden) table: scatters into a zero tensor.
  Tensor x({batch * s, hidden});
  if (p > 0) scatter_add_rows(ops, c.prefix_rows, *prefix, x);
  scatter_add_rows(ops, c.text_rows, gather_rows(ops, token_table_->value, text.ids), x);
  ops.add(x, gather_rows(ops, position_table_->value, c.positions));
  x.reshape({batch, s, hidden});

  Tensor h = transformer_.forward(ops, x, c.transformer);
  h.reshape({batch * s, hidden});
  c.text_hidden = gather_rows(ops, h, c.text_rows);
  Tensor logits = lm_head_.forward(ops, c.text_hidden);
  logits.reshape({batch, length, shape_.vocab});
  return logits;
}

Tensor Decoder::backward(Ops& ops, const Tensor& dlogits, const DecoderCache& c) const {
  const int64_t batch = c.text.batch, length = c.text.length, hidden = shape_.transformer.hidden;
  expect_shape(dlogits, {batch, length, shape_.vocab}, "decoder backward", "dlogits");
  const Tensor d_text_hidden = lm_head_.backward(ops, c.text_hidden, reshaped(dlogits, {batch * length, shape_.vocab}));
  Tensor dh({batch * c.sequence, hidden});
  scatter_add_rows(ops, c.text_rows, d_text_hidden, dh);
  dh.reshape({batch, c.sequence, hidden});
  Tensor dx = transformer_.backward(ops, dh, c.transformer);
  dx.reshape({batch * c.sequence, hidden});
  if (Tensor* g = position_table_->grad_or_null()) scatter_add_rows(ops, c.positions, dx, *g);
  if (Tensor* g = token_table_->grad_or_null())
    scatter_add_rows(ops, c.text.ids, gather_rows(ops, dx, c.text_rows), *g);
  if (c.prefix == 0) return Tensor();
  Tensor dprefix = gather_rows(ops, dx, c.prefix_rows);
  dprefix.reshape({batch, c.prefix, hidden});
  return dprefix;
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
