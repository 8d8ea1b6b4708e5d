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
  return forward_part(ops, whole(), tokens, nullptr, c);
}

void TextEncoder::backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const TextEncoderCache& c) const {
  backward_part(ops, whole(), d_tokens, d_pooled, c);
}

EncoderOutput TextEncoder::forward_part(Ops& ops, const EncoderPart& part, const Tokens& tokens,
                                        const Tensor* hidden_in, TextEncoderCache& c) const {
  check_encoder_part(part, layers(), name());
  tokens.check(name());
  if (tokens.batch < 1 || tokens.length > shape_.max_positions)
    throw Error(Status::invalid_argument, name() + ": " + std::to_string(tokens.batch) + " sequences of " +
                                              std::to_string(tokens.length) +
                                              " tokens; needs at least one, of at most " +
                                              std::to_string(shape_.max_positions) + " (max_positions)");
  const bool first = part.first == 0, last = part.last == layers();
  const int64_t batch = tokens.batch, length = tokens.length, hidden = shape_.transformer.hidden;
  c.part = part;
  c.tokens = tokens;
  c.positions.clear();
  c.last_rows.clear();
  c.transformer.last = Tensor();

  Tensor h;
  if (first) {
    c.positions.resize(tokens.ids.size());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < length; ++t) c.positions[static_cast<std::size_t>(b * length + t)] = row_id(t);
    Tensor x = vocab_parallel_embedding_forward(ops, *token_table_, tokens.ids, tp_.group());
    ops.add(x, gather_rows(ops, position_table_->value, c.positions));
    x.reshape({batch, length, hidden});
    h = transformer_.forward_blocks(ops, std::move(x), part.first, part.last, c.transformer, tp_.group());
  } else {
    if (!hidden_in || hidden_in->shape != Shape{batch, length, hidden})
      throw Error(Status::invalid_argument, name() + ": part [" + std::to_string(part.first) + ", " +
                                                std::to_string(part.last) + ") takes the previous part's hidden (" +
                                                std::to_string(batch) + ", " + std::to_string(length) + ", " +
                                                std::to_string(hidden) + "), got " +
                                                (hidden_in ? shape_string(hidden_in->shape) : std::string("none")));
    h = transformer_.forward_blocks(ops, *hidden_in, part.first, part.last, c.transformer, tp_.group());
  }
  EncoderOutput out;
  if (!last) {
    out.tokens = std::move(h);
    return out;
  }

  c.last_rows.resize(static_cast<std::size_t>(batch));
  for (int64_t b = 0; b < batch; ++b)
    c.last_rows[static_cast<std::size_t>(b)] = row_id(b * length + tokens.lengths[static_cast<std::size_t>(b)] - 1);
  out.tokens = transformer_.forward_final_norm(ops, std::move(h), c.transformer);
  out.tokens.reshape({batch * length, hidden});  // a table of rows for the gather
  out.pooled = gather_rows(ops, out.tokens, c.last_rows);
  out.tokens.reshape({batch, length, hidden});
  return out;
}

Tensor TextEncoder::backward_part(Ops& ops, const EncoderPart& part, const Tensor* d_tokens, const Tensor* d_pooled,
                                  const TextEncoderCache& c) const {
  check_encoder_part(part, layers(), name());
  check_encoder_cache(part, c.part, name());
  const bool first = part.first == 0, last = part.last == layers();
  const int64_t batch = c.tokens.batch, length = c.tokens.length, hidden = shape_.transformer.hidden;
  Tensor dx;
  if (last) {
    if (!d_tokens && !d_pooled)
      throw Error(Status::invalid_argument,
                  name() + ": backward needs the gradient of the tokens or of the pooled output");
    Tensor d = zeros(ops, {batch * length, hidden});
    if (d_pooled) {
      expect_shape(*d_pooled, {batch, hidden}, "text encoder backward", "d_pooled");
      scatter_add_rows(ops, c.last_rows, *d_pooled, d);
    }
    d.reshape({batch, length, hidden});
    if (d_tokens) {
      expect_shape(*d_tokens, d.shape, "text encoder backward", "d_tokens");
      ops.add(d, *d_tokens);
    }
    dx = transformer_.backward_blocks(ops, transformer_.backward_final_norm(ops, d, c.transformer), c.transformer,
                                      tp_.group());
  } else {
    check_middle_part_gradients(part, name(), d_tokens, d_pooled);
    expect_shape(*d_tokens, {batch, length, hidden}, "text encoder backward", "d hidden");
    dx = transformer_.backward_blocks(ops, *d_tokens, c.transformer, tp_.group());
  }
  if (!first) return dx;

  vocab_parallel_embedding_backward(ops, *token_table_, c.tokens.ids, dx, tp_.group());
  if (Tensor* g = position_table_->grad_or_null()) scatter_add_rows(ops, c.positions, dx, *g);
  return Tensor();
}

void TextEncoder::set_tensor_parallel(TensorParallel tp) {
  transformer_.check_tensor_parallel(tp);
  check_vocabulary_split(shape_.vocab, tp, name());
  std::vector<TpSplit> splits{{token_table_, 0}};
  transformer_.add_tp_splits(splits, 0, layers());
  tp_.set(std::move(tp), splits, name());
}

std::vector<Parameter*> TextEncoder::part_parameters(const EncoderPart& part) const {
  check_encoder_part(part, layers(), name());
  std::vector<Parameter*> owned;
  if (part.first == 0) {
    owned.push_back(token_table_);
    owned.push_back(position_table_);
  }
  const auto blocks = transformer_.part_parameters(part.first, part.last);
  owned.insert(owned.end(), blocks.begin(), blocks.end());
  return owned;
}

}  // namespace braid::nn
