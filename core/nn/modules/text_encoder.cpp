#include "core/nn/modules/text_encoder.hpp"

#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

TextEncoder::TextEncoder(ParameterStore& store, std::string name, const TextEncoderShape& shape, bool frozen)
    : Module(std::move(name), frozen),
      shape_(shape),
      token_table_(&param(store, "token_embed", {shape.vocab, shape.transformer.hidden}, Init::normal(kInitStd))),
      position_table_(
          &param(store, "pos_embed", {shape.max_positions, shape.transformer.hidden}, Init::normal(kInitStd))),
      transformer_(store, this->name(), shape.transformer, frozen) {
  adopt(transformer_);
}

EncoderOutput TextEncoder::forward(Ops& ops, const Tokens& tokens, TextEncoderCache& c) const {
  tokens.check(name());
  if (tokens.batch < 1 || tokens.length > shape_.max_positions)
    throw Error(Status::invalid_argument, name() + ": " + std::to_string(tokens.batch) + " sequences of " +
                                              std::to_string(tokens.length) +
                                              " tokens; needs at least one, of at most " +
                                              std::to_string(shape_.max_positions) + " (max_positions)");
  const int64_t batch = tokens.batch, length = tokens.length, hidden = shape_.transformer.hidden;
  c.tokens = tokens;
  c.positions.resize(tokens.ids.size());
  c.last_rows.resize(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < length; ++t) c.positions[static_cast<std::size_t>(b * length + t)] = row_id(t);
    c.last_rows[static_cast<std::size_t>(b)] = row_id(b * length + tokens.lengths[static_cast<std::size_t>(b)] - 1);
  }
  Tensor x = gather_rows(ops, token_table_->value, tokens.ids);
  ops.add(x, gather_rows(ops, position_table_->value, c.positions));
  x.reshape({batch, length, hidden});

  EncoderOutput out;
  out.tokens = transformer_.forward(ops, x, c.transformer);
  out.tokens.reshape({batch * length, hidden});  // a table of rows for the gather
  out.pooled = gather_rows(ops, out.tokens, c.last_rows);
  out.tokens.reshape({batch, length, hidden});
  return out;
}

void TextEncoder::backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const TextEncoderCache& c) const {
  const int64_t batch = c.tokens.batch, length = c.tokens.length, hidden = shape_.transformer.hidden;
  if (!d_tokens && !d_pooled)
    throw Error(Status::invalid_argument,
                name() + ": backward needs the gradient of the tokens or of the pooled output");
  Tensor d({batch * length, hidden});
  if (d_pooled) {
    expect_shape(*d_pooled, {batch, hidden}, "text encoder backward", "d_pooled");
    scatter_add_rows(ops, c.last_rows, *d_pooled, d);
  }
  d.reshape({batch, length, hidden});
  if (d_tokens) {
    expect_shape(*d_tokens, d.shape, "text encoder backward", "d_tokens");
    ops.add(d, *d_tokens);
  }
  const Tensor dx = transformer_.backward(ops, d, c.transformer);
  if (Tensor* g = token_table_->grad_or_null()) scatter_add_rows(ops, c.tokens.ids, dx, *g);
  if (Tensor* g = position_table_->grad_or_null()) scatter_add_rows(ops, c.positions, dx, *g);
}

}  // namespace braid::nn
