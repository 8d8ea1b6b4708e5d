#include "core/nn/modules/image_encoder.hpp"

#include <algorithm>
#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {

ImageEncoder::ImageEncoder(ParameterStore& store, std::string name, const ImageEncoderShape& shape, bool frozen)
    : Module(std::move(name), frozen),
      shape_(shape),
      patch_weight_(&param(store, "patch_embed.weight",
                           {shape.transformer.hidden, shape.channels * shape.patch * shape.patch},
                           Init::normal(kInitStd))),
      patch_bias_(&param(store, "patch_embed.bias", {shape.transformer.hidden}, Init::constant(0.0f))),
      row_table_(&param(store, "pos_embed.rows",
                        {shape.max_image_size / std::max<int64_t>(shape.patch, 1), shape.transformer.hidden},
                        Init::normal(kInitStd))),
      col_table_(&param(store, "pos_embed.cols",
                        {shape.max_image_size / std::max<int64_t>(shape.patch, 1), shape.transformer.hidden},
                        Init::normal(kInitStd))),
      transformer_(store, this->name(), shape.transformer, frozen) {
  if (shape.patch < 1 || shape.max_image_size < shape.patch || shape.channels < 1)
    throw Error(Status::invalid_argument, this->name() + ": patch " + std::to_string(shape.patch) + ", channels " +
                                              std::to_string(shape.channels) + " and max_image_size " +
                                              std::to_string(shape.max_image_size) + " do not make an image encoder");
  adopt(transformer_);
}

EncoderOutput ImageEncoder::forward(Ops& ops, const Tensor& images, ImageEncoderCache& c) const {
  return forward_part(ops, whole(), &images, nullptr, c);
}

Tensor ImageEncoder::backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const ImageEncoderCache& c,
                              bool want_dimages) const {
  return backward_part(ops, whole(), d_tokens, d_pooled, c, want_dimages);
}

EncoderOutput ImageEncoder::forward_part(Ops& ops, const EncoderPart& part, const Tensor* images,
                                         const Tensor* hidden_in, ImageEncoderCache& c) const {
  check_encoder_part(part, layers(), name());
  const bool first = part.first == 0, last = part.last == layers();
  const int64_t hidden = shape_.transformer.hidden;
  c.part = part;
  c.images = Tensor();
  c.grid_rows.clear();
  c.grid_cols.clear();
  c.samples.clear();
  c.transformer.last = Tensor();

  Tensor h;
  if (first) {
    if (!images)
      throw Error(Status::invalid_argument, name() + ": images must be (batch >= 1, " +
                                                std::to_string(shape_.channels) + ", height, width), got none");
    h = transformer_.forward_blocks(ops, embed(ops, *images, c), part.first, part.last, c.transformer, tp_.group());
  } else {
    // The batch and the tokens per image come from the hidden; the grid is the first part's.
    if (!hidden_in || hidden_in->rank() != 3 || hidden_in->dim(0) < 1 || hidden_in->dim(1) < 1 ||
        hidden_in->dim(2) != hidden)
      throw Error(Status::invalid_argument,
                  name() + ": part [" + std::to_string(part.first) + ", " + std::to_string(part.last) +
                      ") takes the previous part's hidden (batch >= 1, patches >= 1, " + std::to_string(hidden) +
                      "), got " + (hidden_in ? shape_string(hidden_in->shape) : std::string("none")));
    c.batch = hidden_in->dim(0);
    c.patches = hidden_in->dim(1);
    h = transformer_.forward_blocks(ops, *hidden_in, part.first, part.last, c.transformer, tp_.group());
  }
  if (!last) {
    EncoderOutput out;
    out.tokens = std::move(h);
    return out;
  }
  return finish(ops, std::move(h), c);
}

Tensor ImageEncoder::embed(Ops& ops, const Tensor& images, ImageEncoderCache& c) const {
  const int64_t p = shape_.patch;
  if (images.rank() != 4 || images.dim(0) < 1 || images.dim(1) != shape_.channels)
    throw Error(Status::invalid_argument, name() + ": images must be (batch >= 1, " + std::to_string(shape_.channels) +
                                              ", height, width), got " + shape_string(images.shape));
  const int64_t height = images.dim(2), width = images.dim(3);
  if (height < p || width < p || height % p != 0 || width % p != 0)
    throw Error(Status::invalid_argument, name() + ": image sides " + std::to_string(height) + " x " +
                                              std::to_string(width) + " are not multiples of the patch size " +
                                              std::to_string(p));
  if (height > shape_.max_image_size || width > shape_.max_image_size)
    throw Error(Status::invalid_argument, name() + ": image sides " + std::to_string(height) + " x " +
                                              std::to_string(width) + " exceed max_image_size " +
                                              std::to_string(shape_.max_image_size));
  const int64_t batch = images.dim(0), cols = width / p, patches = (height / p) * cols;
  c.images = images;
  c.batch = batch;
  c.patches = patches;
  c.grid_rows.resize(static_cast<std::size_t>(batch * patches));
  c.grid_cols.resize(c.grid_rows.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t n = 0; n < patches; ++n) {
      const auto i = static_cast<std::size_t>(b * patches + n);
      c.grid_rows[i] = row_id(n / cols);
      c.grid_cols[i] = row_id(n % cols);
    }
  Tensor x;
  ops.patch_embedding_forward(images, p, patch_weight_->value, &patch_bias_->value, x);
  ops.add(x, reshaped(gather_rows(ops, row_table_->value, c.grid_rows), x.shape));
  ops.add(x, reshaped(gather_rows(ops, col_table_->value, c.grid_cols), x.shape));
  return x;
}

EncoderOutput ImageEncoder::finish(Ops& ops, Tensor h, ImageEncoderCache& c) const {
  c.samples.resize(static_cast<std::size_t>(c.batch * c.patches));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t n = 0; n < c.patches; ++n) c.samples[static_cast<std::size_t>(b * c.patches + n)] = row_id(b);
  EncoderOutput out;
  out.tokens = transformer_.forward_final_norm(ops, std::move(h), c.transformer);
  out.pooled = zeros(ops, {c.batch, shape_.transformer.hidden});
  scatter_add_rows(ops, c.samples, out.tokens, out.pooled);
  ops.scale(out.pooled, 1.0f / static_cast<float>(c.patches));
  return out;
}

Tensor ImageEncoder::backward_part(Ops& ops, const EncoderPart& part, const Tensor* d_tokens, const Tensor* d_pooled,
                                   const ImageEncoderCache& c, bool want_dimages) const {
  check_encoder_part(part, layers(), name());
  check_encoder_cache(part, c.part, name());
  const bool first = part.first == 0, last = part.last == layers();
  Tensor dx;
  if (last) {
    dx = transformer_.backward_blocks(ops, head_gradient(ops, d_tokens, d_pooled, c), c.transformer, tp_.group());
  } else {
    check_middle_part_gradients(part, name(), d_tokens, d_pooled);
    expect_shape(*d_tokens, {c.batch, c.patches, shape_.transformer.hidden}, "image encoder backward", "d hidden");
    dx = transformer_.backward_blocks(ops, *d_tokens, c.transformer, tp_.group());
  }
  if (!first) return dx;
  return embed_backward(ops, dx, c, want_dimages);
}

Tensor ImageEncoder::head_gradient(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled,
                                   const ImageEncoderCache& c) const {
  const Shape token_shape{c.batch, c.patches, shape_.transformer.hidden};
  if (!d_tokens && !d_pooled)
    throw Error(Status::invalid_argument,
                name() + ": backward needs the gradient of the tokens or of the pooled output");
  Tensor d;
  if (d_pooled) {  // the mean's gradient: each token gets its sample's row / N
    expect_shape(*d_pooled, {c.batch, shape_.transformer.hidden}, "image encoder backward", "d_pooled");
    d = reshaped(gather_rows(ops, *d_pooled, c.samples), token_shape);
    ops.scale(d, 1.0f / static_cast<float>(c.patches));
  }
  if (d_tokens) {
    expect_shape(*d_tokens, token_shape, "image encoder backward", "d_tokens");
    if (d.data.empty())
      d = *d_tokens;
    else
      ops.add(d, *d_tokens);
  }
  return transformer_.backward_final_norm(ops, d, c.transformer);
}

Tensor ImageEncoder::embed_backward(Ops& ops, const Tensor& dx, const ImageEncoderCache& c, bool want_dimages) const {
  if (Tensor* g = row_table_->grad_or_null()) scatter_add_rows(ops, c.grid_rows, dx, *g);
  if (Tensor* g = col_table_->grad_or_null()) scatter_add_rows(ops, c.grid_cols, dx, *g);
  Tensor dimages;
  ops.patch_embedding_backward(c.images, shape_.patch, patch_weight_->value, dx, want_dimages ? &dimages : nullptr,
                               patch_weight_->grad_or_null(), patch_bias_->grad_or_null());
  return dimages;
}

void ImageEncoder::forward_embed(Ops& ops, const Tensor& images, ImageEncoderSteps& s) const {
  s.cache = ImageEncoderCache();
  s.cache.part = whole();
  s.cache.transformer.first = 0;
  s.cache.transformer.blocks.resize(static_cast<std::size_t>(layers()));
  s.h = embed(ops, images, s.cache);
}

void ImageEncoder::forward_kernel(Ops& ops, int layer, int kernel, ImageEncoderSteps& s) const {
  if (layer < 0 || layer >= layers())
    throw Error(Status::invalid_argument, name() + ": no layer " + std::to_string(layer));
  if (tp_.group().splits_sequence())
    throw Error(Status::unsupported, name() + ": a run kernel by kernel takes no sequence parallelism");
  BlockCache& b = s.cache.transformer.blocks[static_cast<std::size_t>(layer)];
  const TransformerBlock& block = transformer_.block(layer);
  BlockHooks* hooks = transformer_.block_hooks();
  if (kernel == 0) {
    b.x = std::move(s.h);
    if (hooks) hooks->before_block(block, false);
  }
  block.forward_kernel(ops, kernel, b, tp_.group());
  if (kernel + 1 == TransformerBlock::kKernels) {
    s.h = std::move(b.y);
    block.drop_recomputed(b);
    if (hooks) hooks->after_block(block, false);
  }
}

EncoderOutput ImageEncoder::forward_finish(Ops& ops, ImageEncoderSteps& s) const {
  return finish(ops, std::move(s.h), s.cache);
}

void ImageEncoder::backward_start(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled,
                                  ImageEncoderSteps& s) const {
  s.d = head_gradient(ops, d_tokens, d_pooled, s.cache);
}

void ImageEncoder::backward_kernel(Ops& ops, int layer, int kernel, ImageEncoderSteps& s) const {
  if (layer < 0 || layer >= layers())
    throw Error(Status::invalid_argument, name() + ": no layer " + std::to_string(layer));
  const TransformerBlock& block = transformer_.block(layer);
  BlockHooks* hooks = transformer_.block_hooks();
  BlockCache& b = s.cache.transformer.blocks[static_cast<std::size_t>(layer)];
  if (kernel + 1 == TransformerBlock::kKernels) {
    s.grad = BlockGrad();
    if (hooks) hooks->before_block(block, true);
    block.recompute_forward(ops, b, tp_.group());  // the layer's first backward task recomputes it
  }
  s.grad.dy = &s.d;  // again each time: the steps may have moved since the last kernel
  block.backward_kernel(ops, kernel, b, s.grad, tp_.group());
  if (kernel == 0) {
    s.d = std::move(s.grad.dx);
    s.grad = BlockGrad();
    block.drop_recomputed(b);
    if (hooks) hooks->after_block(block, true);
  }
}

Tensor ImageEncoder::backward_embed(Ops& ops, ImageEncoderSteps& s, bool want_dimages) const {
  return embed_backward(ops, s.d, s.cache, want_dimages);
}

void ImageEncoder::set_tensor_parallel(TensorParallel tp) {
  transformer_.check_tensor_parallel(tp);
  std::vector<TpSplit> splits;
  transformer_.add_tp_splits(splits, 0, layers());
  tp_.set(std::move(tp), splits, name());
}

std::vector<Parameter*> ImageEncoder::part_parameters(const EncoderPart& part) const {
  check_encoder_part(part, layers(), name());
  std::vector<Parameter*> owned;
  if (part.first == 0) {
    owned.push_back(patch_weight_);
    owned.push_back(patch_bias_);
    owned.push_back(row_table_);
    owned.push_back(col_table_);
  }
  const auto blocks = transformer_.part_parameters(part.first, part.last);
  owned.insert(owned.end(), blocks.begin(), blocks.end());
  return owned;
}

}  // namespace braid::nn
