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

// Under sequence parallelism a rank's layer norm sees 1/size of the positions: its weight
// gradients are partial sums, added up over the group before they join the parameters'.
Tensor layernorm_backward_summed(Ops& ops, const LayerNorm& ln, const Tensor& x, const LayerNormSaved& saved,
                                 const Tensor& dy, const TensorParallel& tp) {
  Parameter* gamma = ln.gamma_param();
  Parameter* beta = ln.beta_param();
  if (!gamma->trainable) return ln.backward(ops, x, saved, dy);
  const int64_t n = gamma->value.numel();
  Tensor grads({2, n});
  Tensor dgamma = zeros(ops, gamma->value.shape), dbeta = zeros(ops, beta->value.shape), dx;
  ops.layernorm_backward(x, gamma->value, saved, dy, &dx, &dgamma, &dbeta);
  Tensor scratch_g, scratch_b;  // the partial sums in host memory, for one all-reduce
  const Tensor& host_g = host_view(tp, dgamma, scratch_g);
  const Tensor& host_b = host_view(tp, dbeta, scratch_b);
  std::copy(host_g.data.begin(), host_g.data.end(), grads.data.begin());
  std::copy(host_b.data.begin(), host_b.data.end(), grads.data.begin() + n);
  tp_allreduce(tp, grads);
  Tensor sum_g({n}), sum_b({n});
  std::copy(grads.data.begin(), grads.data.begin() + n, sum_g.data.begin());
  std::copy(grads.data.begin() + n, grads.data.end(), sum_b.data.begin());
  ops.add(gamma->grad, reshaped(to_group_device(tp, std::move(sum_g)), gamma->grad.shape));
  ops.add(beta->grad, reshaped(to_group_device(tp, std::move(sum_b)), beta->grad.shape));
  return dx;
}

// `t`, or under sequence parallelism its all-gather over the group (held in `gathered`): a
// reference either way, so the path without it copies nothing (a `?:` of a gathered
// temporary and `t` would copy `t`).
const Tensor& whole_sequence(const Tensor& t, const TensorParallel& tp, Tensor& gathered) {
  if (!tp.splits_sequence()) return t;
  gathered = sequence_allgather(t, tp);
  return gathered;
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

Tensor TransformerBlock::forward(Ops& ops, Tensor x, BlockCache& c, const TensorParallel& tp) const {
  check_input(x, shape_.hidden, name());
  c.x = std::move(x);
  for (int k = 0; k < kKernels; ++k) forward_kernel(ops, k, c, tp);
  Tensor y = std::move(c.y);
  drop_recomputed(c);
  return y;
}

void TransformerBlock::recompute_forward(Ops& ops, BlockCache& c, const TensorParallel& tp) const {
  if (recompute_ != spec::Recompute::full) return;
  for (int k = 0; k < kKernels; ++k) forward_kernel(ops, k, c, tp);
  c.y = Tensor();  // the next block's input, which the backward does not read
}

void TransformerBlock::drop_recomputed(BlockCache& c) const {
  if (recompute_ != spec::Recompute::full) return;
  Tensor x = std::move(c.x);
  c = BlockCache();
  c.x = std::move(x);
}

void TransformerBlock::forward_kernel(Ops& ops, int kernel, BlockCache& c, const TensorParallel& tp) const {
  switch (kernel) {
    case 0:
      c.h1 = ln1_.forward(ops, c.x, c.ln1);
      return;
    case 1: {  // column-parallel by heads: this rank's q, k, v hold heads [rank, rank + 1) * heads / size
      Tensor gathered;
      const Tensor& h1 = whole_sequence(c.h1, tp, gathered);
      c.q = column_parallel_forward(ops, q_, h1, tp);
      c.k = column_parallel_forward(ops, k_, h1, tp);
      c.v = column_parallel_forward(ops, v_, h1, tp);
      return;
    }
    case 2:
      ops.attention_forward(c.q, c.k, c.v, AttentionOptions{shape_.heads / tp.size, shape_.causal}, c.attn,
                            c.attention);
      if (recompute_ == spec::Recompute::selective) c.attention = AttentionSaved();  // the backward's to redo
      return;
    case 3:
      c.partial = tp.splits_sequence() ? row_parallel_forward_scatter(ops, out_, c.attn, tp)
                                       : row_parallel_forward(ops, out_, c.attn, tp);
      return;
    case 4:  // added into the row-parallel output, which is not kept: no copy of x (the same bits)
      ops.add(c.partial, c.x);
      c.x2 = std::move(c.partial);
      c.partial = Tensor();
      return;
    case 5:
      c.h2 = ln2_.forward(ops, c.x2, c.ln2);
      return;
    case 6: {
      Tensor gathered;
      c.f = column_parallel_forward(ops, fc1_, whole_sequence(c.h2, tp, gathered), tp);
      ops.gelu_forward(c.f, c.g);
      return;
    }
    case 7:
      c.partial = tp.splits_sequence() ? row_parallel_forward_scatter(ops, fc2_, c.g, tp)
                                       : row_parallel_forward(ops, fc2_, c.g, tp);
      return;
    case 8:
      ops.add(c.partial, c.x2);
      c.y = std::move(c.partial);
      c.partial = Tensor();
      return;
    default:
      throw Error(Status::invalid_argument, name() + ": no forward kernel " + std::to_string(kernel));
  }
}

Tensor TransformerBlock::backward(Ops& ops, const Tensor& dy, const BlockCache& c, const TensorParallel& tp) const {
  expect_shape(dy, c.x.shape, "transformer block backward", "dy");
  BlockCache again;  // full recomputation: the forward's state, from a view of the input kept
  if (recompute_ == spec::Recompute::full) {
    again.x = Tensor(c.x.shape, c.x.data.view());
    recompute_forward(ops, again, tp);
  }
  BlockGrad g;
  g.dy = &dy;
  const BlockCache& saved = recompute_ == spec::Recompute::full ? again : c;
  for (int k = kKernels; k-- > 0;) backward_kernel(ops, k, saved, g, tp);
  return std::move(g.dx);
}

void TransformerBlock::backward_kernel(Ops& ops, int kernel, const BlockCache& c, BlockGrad& g,
                                       const TensorParallel& tp) const {
  if (!g.dy) throw Error(Status::invalid_argument, name() + ": a backward kernel needs grad.dy");
  const bool sp = tp.splits_sequence();
  switch (kernel) {
    case 8:  // the residual: dy flows to x2 as it is (kernel 5) and into fc2
    case 4:  // the same for the attention's residual (kernel 0)
      return;
    case 7: {  // under sequence parallelism the whole dy (the reduce-scatter's backward)
      Tensor gathered;
      g.dg = row_parallel_backward(ops, fc2_, c.g, whole_sequence(*g.dy, tp, gathered), tp);
      return;
    }
    case 6: {
      Tensor df;
      ops.gelu_backward(c.f, g.dg, df);
      g.dg = Tensor();
      Tensor gathered;
      g.dh2 = column_parallel_backward(ops, fc1_, whole_sequence(c.h2, tp, gathered), df, tp);
      // Each rank had the part through its ffn columns (and, split, keeps its positions).
      if (sp)
        g.dh2 = sequence_reduce_scatter(g.dh2, tp);
      else
        tp_allreduce(tp, g.dh2);
      return;
    }
    case 5:
      g.dx2 =
          sp ? layernorm_backward_summed(ops, ln2_, c.x2, c.ln2, g.dh2, tp) : ln2_.backward(ops, c.x2, c.ln2, g.dh2);
      g.dh2 = Tensor();
      ops.add(g.dx2, *g.dy);
      return;
    case 3: {  // dx2 also flows down the residual (kernel 0)
      Tensor gathered;
      g.dattn = row_parallel_backward(ops, out_, c.attn, whole_sequence(g.dx2, tp, gathered), tp);
      return;
    }
    case 2: {
      const AttentionOptions options{shape_.heads / tp.size, shape_.causal};
      AttentionSaved again;  // selective recomputation: the probabilities, by the forward's own op
      const AttentionSaved* saved = &c.attention;
      if (recompute_ == spec::Recompute::selective) {
        Tensor output;
        ops.attention_forward(c.q, c.k, c.v, options, output, again);
        saved = &again;
      }
      ops.attention_backward(c.q, c.k, c.v, options, *saved, g.dattn, g.dq, g.dk, g.dv);
      g.dattn = Tensor();
      return;
    }
    case 1: {
      Tensor gathered;
      const Tensor& input = whole_sequence(c.h1, tp, gathered);
      g.dh1 = column_parallel_backward(ops, q_, input, g.dq, tp);
      ops.add(g.dh1, column_parallel_backward(ops, k_, input, g.dk, tp));
      ops.add(g.dh1, column_parallel_backward(ops, v_, input, g.dv, tp));
      g.dq = g.dk = g.dv = Tensor();
      // Each rank had the part through its heads (and, split, keeps its positions).
      if (sp)
        g.dh1 = sequence_reduce_scatter(g.dh1, tp);
      else
        tp_allreduce(tp, g.dh1);
      return;
    }
    case 0:
      g.dx = sp ? layernorm_backward_summed(ops, ln1_, c.x, c.ln1, g.dh1, tp) : ln1_.backward(ops, c.x, c.ln1, g.dh1);
      g.dh1 = Tensor();
      ops.add(g.dx, g.dx2);
      g.dx2 = Tensor();
      return;
    default:
      throw Error(Status::invalid_argument, name() + ": no backward kernel " + std::to_string(kernel));
  }
}

void TransformerBlock::check_tensor_parallel(const TensorParallel& tp) const {
  nn::check_tensor_parallel(tp, name());
  if (shape_.heads % tp.size != 0)
    throw Error(Status::invalid_argument, name() + ": " + std::to_string(shape_.heads) + " heads do not split over " +
                                              std::to_string(tp.size) + " tensor-parallel ranks");
  if (shape_.ffn % tp.size != 0)
    throw Error(Status::invalid_argument, name() + ": ffn width " + std::to_string(shape_.ffn) +
                                              " does not split over " + std::to_string(tp.size) +
                                              " tensor-parallel ranks");
}

void TransformerBlock::add_tp_splits(std::vector<TpSplit>& splits) const {
  for (const Linear* column : {&q_, &k_, &v_, &fc1_}) add_column_parallel(splits, *column);
  for (const Linear* row : {&out_, &fc2_}) add_row_parallel(splits, *row);
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
  return forward_final_norm(ops, forward_blocks(ops, x, 0, layers(), cache), cache);
}

Tensor Transformer::backward(Ops& ops, const Tensor& dy, const TransformerCache& cache) const {
  if (cache.first != 0 || cache.blocks.size() != blocks_.size())
    throw Error(Status::invalid_argument, name() + ": backward needs the cache of this module's forward");
  return backward_blocks(ops, backward_final_norm(ops, dy, cache), cache);
}

namespace {

// (B, S, H) with S grown to `length` by zero positions at each sequence's end, or cut back
// (on host memory, where tp's tensors cross).
Tensor resize_sequences(const Tensor& x_any, int64_t length, const TensorParallel& tp) {
  Tensor scratch;
  const Tensor& x = host_view(tp, x_any, scratch);
  const int64_t b = x.dim(0), s = x.dim(1), h = x.dim(2), keep = std::min(s, length);
  Tensor out({b, length, h});
  for (int64_t i = 0; i < b; ++i)
    std::copy(x.ptr() + i * s * h, x.ptr() + (i * s + keep) * h, out.ptr() + i * length * h);
  return to_group_device(tp, std::move(out));
}

// The same group without sequence parallelism.
TensorParallel without_sequence_split(const TensorParallel& tp) {
  TensorParallel plain = tp;
  plain.sequence_parallel = false;
  return plain;
}

}  // namespace

Tensor Transformer::forward_blocks(Ops& ops, Tensor x, int first, int last, TransformerCache& cache,
                                   const TensorParallel& tp) const {
  if (first < 0 || first > last || last > layers())
    throw Error(Status::invalid_argument, name() + ": blocks [" + std::to_string(first) + ", " + std::to_string(last) +
                                              ") are not a range of its " + std::to_string(layers()) + " blocks");
  check_input(x, shape_.hidden, name());
  cache.first = first;
  cache.blocks.resize(static_cast<std::size_t>(last - first));
  cache.positions = x.dim(1);
  cache.padded = (x.dim(1) + tp.size - 1) / tp.size * tp.size;
  // Bidirectional attention would see padding: such sequences split only as they are.
  cache.split = tp.splits_sequence() && (shape_.causal || cache.padded == cache.positions);
  const TensorParallel group = cache.split ? tp : without_sequence_split(tp);
  Tensor h =
      cache.split
          ? sequence_shard(cache.padded == cache.positions ? std::move(x) : resize_sequences(x, cache.padded, tp), tp)
          : std::move(x);
  for (int l = first; l < last; ++l) {
    const TransformerBlock& b = blocks_[static_cast<std::size_t>(l)];
    if (hooks_) hooks_->before_block(b, false);
    h = b.forward(ops, std::move(h), cache.blocks[static_cast<std::size_t>(l - first)], group);
    if (hooks_) hooks_->after_block(b, false);
  }
  if (cache.split) h = resize_sequences(sequence_allgather(h, tp), cache.positions, tp);
  return h;
}

Tensor Transformer::backward_blocks(Ops& ops, Tensor dy, const TransformerCache& cache,
                                    const TensorParallel& tp) const {
  const int first = cache.first, last = first + static_cast<int>(cache.blocks.size());
  if (first < 0 || last > layers())
    throw Error(Status::invalid_argument, name() + ": backward needs the cache of this module's forward");
  const TensorParallel group = cache.split ? tp : without_sequence_split(tp);
  Tensor d = cache.split ? sequence_shard(resize_sequences(dy, cache.padded, tp), tp) : std::move(dy);
  for (int l = last; l-- > first;) {
    const TransformerBlock& b = blocks_[static_cast<std::size_t>(l)];
    if (hooks_) hooks_->before_block(b, true);
    d = b.backward(ops, d, cache.blocks[static_cast<std::size_t>(l - first)], group);
    if (hooks_) hooks_->after_block(b, true);
  }
  if (cache.split) d = resize_sequences(sequence_allgather(d, tp), cache.positions, tp);
  return d;
}

Tensor Transformer::forward_final_norm(Ops& ops, Tensor x, TransformerCache& cache) const {
  check_input(x, shape_.hidden, name());
  cache.last = std::move(x);
  return final_norm_.forward(ops, cache.last, cache.final_norm);
}

Tensor Transformer::backward_final_norm(Ops& ops, const Tensor& dy, const TransformerCache& cache) const {
  expect_shape(dy, cache.last.shape, "transformer final norm backward", "dy");
  return final_norm_.backward(ops, cache.last, cache.final_norm, dy);
}

void Transformer::add_tp_splits(std::vector<TpSplit>& splits, int first, int last) const {
  for (int l = first; l < last; ++l) block(l).add_tp_splits(splits);
}

void Transformer::check_tensor_parallel(const TensorParallel& tp) const {
  nn::check_tensor_parallel(tp, name());
  for (const auto& b : blocks_) b.check_tensor_parallel(tp);
}

std::vector<Parameter*> Transformer::part_parameters(int first, int last) const {
  std::vector<Parameter*> owned;
  auto take = [&](const Module& m) { owned.insert(owned.end(), m.parameters().begin(), m.parameters().end()); };
  for (int l = first; l < last; ++l) take(block(l));
  if (last == layers()) take(final_norm_);
  return owned;
}

}  // namespace braid::nn
