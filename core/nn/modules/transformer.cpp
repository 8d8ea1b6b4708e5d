#include "core/nn/modules/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/common/error.hpp"

namespace braid::nn {
namespace {

float residual_init_std(const TransformerShape& shape) {
  return kInitStd / static_cast<float>(std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(shape.layers, 1))));
}

void check_input(const Tensor& x, int64_t hidden, const std::string& module) {
  if (x.rank() != 3 || x.dim(2) != hidden)
    throw Error(Status::invalid_argument, module + ": input must be (batch, sequence, " + std::to_string(hidden) +
                                              "), got " + shape_string(x.shape));
}

std::vector<TransformerBlock> make_blocks(ParameterStore& store, const std::string& name, const TransformerShape& shape,
                                          bool frozen) {
  std::vector<TransformerBlock> blocks;
  blocks.reserve(static_cast<std::size_t>(shape.layers));
  for (int64_t l = 0; l < shape.layers; ++l)
    blocks.emplace_back(store, name + ".blocks." + std::to_string(l), shape, frozen);
  return blocks;
}

}  // namespace

TransformerBlock::TransformerBlock(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen)
    : Module(std::move(name), frozen),
      shape_(shape),
      ln1_(store, this->name() + ".ln1", shape.hidden, frozen),
      q_(store, this->name() + ".attn.q", shape.hidden, shape.hidden, true, kInitStd, frozen),
      k_(store, this->name() + ".attn.k", shape.hidden, shape.hidden, true, kInitStd, frozen),
      v_(store, this->name() + ".attn.v", shape.hidden, shape.hidden, true, kInitStd, frozen),
      out_(store, this->name() + ".attn.out", shape.hidden, shape.hidden, true, residual_init_std(shape), frozen),
      ln2_(store, this->name() + ".ln2", shape.hidden, frozen),
      fc1_(store, this->name() + ".mlp.fc1", shape.hidden, shape.ffn, true, kInitStd, frozen),
      fc2_(store, this->name() + ".mlp.fc2", shape.ffn, shape.hidden, true, residual_init_std(shape), frozen) {
  if (shape.heads < 1 || shape.hidden % shape.heads != 0)
    throw Error(Status::invalid_argument, this->name() + ": " + std::to_string(shape.heads) +
                                              " heads do not divide hidden size " + std::to_string(shape.hidden));
  for (const Module* part :
       {static_cast<const Module*>(&ln1_), static_cast<const Module*>(&q_), static_cast<const Module*>(&k_),
        static_cast<const Module*>(&v_), static_cast<const Module*>(&out_), static_cast<const Module*>(&ln2_),
        static_cast<const Module*>(&fc1_), static_cast<const Module*>(&fc2_)})
    adopt(*part);
}

Tensor TransformerBlock::forward(Ops& ops, const Tensor& x, BlockCache& c) const {
  check_input(x, shape_.hidden, name());
  const AttentionOptions options{shape_.heads, shape_.causal};
  c.x = x;
  c.h1 = ln1_.forward(ops, x, c.ln1);
  c.q = q_.forward(ops, c.h1);
  c.k = k_.forward(ops, c.h1);
  c.v = v_.forward(ops, c.h1);
  ops.attention_forward(c.q, c.k, c.v, options, c.attn, c.attention);
  c.x2 = x;
  ops.add(c.x2, out_.forward(ops, c.attn));
  c.h2 = ln2_.forward(ops, c.x2, c.ln2);
  c.f = fc1_.forward(ops, c.h2);
  ops.gelu_forward(c.f, c.g);
  Tensor y = c.x2;
  ops.add(y, fc2_.forward(ops, c.g));
  return y;
}

Tensor TransformerBlock::backward(Ops& ops, const Tensor& dy, const BlockCache& c) const {
  expect_shape(dy, c.x.shape, "transformer block backward", "dy");
  const AttentionOptions options{shape_.heads, shape_.causal};
  // MLP branch; dy also flows straight down the residual.
  Tensor dg = fc2_.backward(ops, c.g, dy);
  Tensor df;
  ops.gelu_backward(c.f, dg, df);
  Tensor dx2 = ln2_.backward(ops, c.x2, c.ln2, fc1_.backward(ops, c.h2, df));
  ops.add(dx2, dy);
  // Attention branch; dx2 flows down the residual too.
  Tensor dattn = out_.backward(ops, c.attn, dx2);
  Tensor dq, dk, dv;
  ops.attention_backward(c.q, c.k, c.v, options, c.attention, dattn, dq, dk, dv);
  Tensor dh1 = q_.backward(ops, c.h1, dq);
  ops.add(dh1, k_.backward(ops, c.h1, dk));
  ops.add(dh1, v_.backward(ops, c.h1, dv));
  Tensor dx = ln1_.backward(ops, c.x, c.ln1, dh1);
  ops.add(dx, dx2);
  return dx;
}

Transformer::Transformer(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen)
    : Module(std::move(name), frozen),
      shape_(shape),
      blocks_(make_blocks(store, this->name(), shape, frozen)),
      final_norm_(store, this->name() + ".final_norm", shape.hidden, frozen) {
  for (const auto& b : blocks_) adopt(b);
  adopt(final_norm_);
}

Tensor Transformer::forward(Ops& ops, const Tensor& x, TransformerCache& cache) const {
  check_input(x, shape_.hidden, name());
  cache.blocks.resize(blocks_.size());
  Tensor h = x;
  for (std::size_t l = 0; l < blocks_.size(); ++l) h = blocks_[l].forward(ops, h, cache.blocks[l]);
  cache.last = std::move(h);
  return final_norm_.forward(ops, cache.last, cache.final_norm);
}

Tensor Transformer::backward(Ops& ops, const Tensor& dy, const TransformerCache& cache) const {
  if (cache.blocks.size() != blocks_.size())
    throw Error(Status::invalid_argument, name() + ": backward needs the cache of this module's forward");
  Tensor d = final_norm_.backward(ops, cache.last, cache.final_norm, dy);
  for (std::size_t l = blocks_.size(); l-- > 0;) d = blocks_[l].backward(ops, d, cache.blocks[l]);
  return d;
}

}  // namespace braid::nn
