// The pre-LN transformer block (GPT-2, CLIP, ViT) and a stack of them with the final norm:
//   x2 = x + Wo attention(LN1(x) Wq, LN1(x) Wk, LN1(x) Wv)
//   y  = x2 + W2 GELU(W1 LN2(x2))
// every linear with a bias; attention bidirectional or causal. Separate Q, K and V
// projections (not one fused QKV GEMM) keep every step an op of the Ops interface, and
// are Megatron's column-parallel split by heads as they stand.
#pragma once

#include <string>
#include <vector>

#include "core/cost/transformer.hpp"
#include "core/nn/modules/layers.hpp"
#include "core/nn/modules/tensor_parallel_group.hpp"

namespace braid::nn {

// What a block's backward needs from its forward. Under tensor parallelism q, k, v, attn, f
// and g hold this rank's shard of the features.
struct BlockCache {
  Tensor x, h1, q, k, v, attn, x2, h2, f, g;  // inputs of each step, (B, S, ·)
  LayerNormSaved ln1, ln2;
  AttentionSaved attention;
  Tensor partial, y;  // between kernels: a row-parallel layer's output; the block's output
};

// The state of a block's backward between its kernels: dy in, dx out.
struct BlockGrad {
  const Tensor* dy = nullptr;  // the output's gradient; must outlive the backward kernels
  Tensor dg, dh2, dx2, dattn, dq, dk, dv, dh1;
  Tensor dx;
};

class TransformerBlock : public Module {
 public:
  // Weights ~ normal(0, 0.02); the two projections back into the residual stream
  // (attention output, second MLP layer) ~ normal(0, 0.02 / sqrt(2 * layers)), GPT-2's
  // scaling that keeps the residual's variance from growing with depth.
  TransformerBlock(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen);

  // x (B, S, hidden) -> (B, S, hidden). With tp.size > 1 (Megatron): q, k, v and fc1
  // column-parallel (q, k, v by heads), out and fc2 row-parallel; one all-reduce after each
  // row-parallel layer. tp.size == 1 is the plain block.
  // x becomes the cache's (what the backward reads): pass it moved where the caller is done with it.
  Tensor forward(Ops& ops, Tensor x, BlockCache& cache, const TensorParallel& tp = {}) const;
  // dy (B, S, hidden) -> dx; adds the parameter gradients (sharded ones into this rank's
  // slice). With tp.size > 1, one all-reduce of the MLP's and one of the attention's input
  // gradient.
  Tensor backward(Ops& ops, const Tensor& dy, const BlockCache& cache, const TensorParallel& tp = {}) const;

  // The same forward and backward cut into the cost model's layer kernels
  // (cost::transformer_layer_kernels, which the bubble scheduler's encoder tasks name), so a
  // colocated executor can run a layer kernel by kernel:
  //   0 ln1   1 q, k, v   2 attention   3 attention out (row parallel: its TP all-reduce
  //   included)   4 the attention's residual   5 ln2   6 fc1 + GELU   7 fc2 (row parallel)
  //   8 the MLP's residual
  // Forward kernels run in order over a cache whose x holds the input; kernel 8 leaves the
  // output in cache.y. Backward kernels run in reverse with grad.dy set; kernel 0 leaves d x
  // in grad.dx. forward() and backward() are exactly these kernels in sequence.
  static constexpr int kKernels = cost::kLayerKernels;
  void forward_kernel(Ops& ops, int kernel, BlockCache& cache, const TensorParallel& tp = {}) const;
  void backward_kernel(Ops& ops, int kernel, const BlockCache& cache, BlockGrad& grad,
                       const TensorParallel& tp = {}) const;

  // What the backward re-runs of the forward (cost::recomputed of the run): full keeps only the
  // block's input from its forward, and the backward runs the forward again from it first;
  // selective keeps no attention probabilities, and the attention's backward recomputes them.
  // Either gives the gradients of no recomputation, bit for bit.
  void set_recompute(spec::Recompute recompute) { recompute_ = recompute; }
  spec::Recompute recompute() const { return recompute_; }
  // For a run kernel by kernel under full recomputation: the forward kernels again over c.x
  // before the first backward kernel, and everything but c.x dropped after the forward's last
  // kernel and the backward's. Both do nothing unless the block recomputes fully.
  void recompute_forward(Ops& ops, BlockCache& c, const TensorParallel& tp = {}) const;
  void drop_recomputed(BlockCache& c) const;

  // Throws Error(invalid_argument) naming this block unless tp is a valid group whose size
  // divides the heads and the ffn width.
  void check_tensor_parallel(const TensorParallel& tp) const;
  // What tensor parallelism splits: q, k, v and fc1 by rows (weight, bias), out and fc2 by
  // columns (weight; their biases are replicated).
  void add_tp_splits(std::vector<TpSplit>& splits) const;

 private:
  TransformerShape shape_;
  LayerNorm ln1_;
  Linear q_, k_, v_, out_;
  LayerNorm ln2_;
  Linear fc1_, fc2_;
  spec::Recompute recompute_ = spec::Recompute::none;
};

// Called around every transformer block a forward or backward runs: ZeRO-3 gathers a block's
// weights just before it runs and frees them after; ZeRO-2 and 3 reduce its gradients as soon
// as its backward is done. A kernel-by-kernel run calls before_block at the block's first
// kernel and after_block at its last, once per call of that kernel (so a hook counts).
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_block(const TransformerBlock& block, bool backward) = 0;
  virtual void after_block(const TransformerBlock& block, bool backward) = 0;
};

// What a range of blocks (and the final norm, when it ran) saved.
struct TransformerCache {
  int first = 0;                   // the first block that ran
  std::vector<BlockCache> blocks;  // blocks first, first + 1, ...
  Tensor last;                     // input of the final norm
  LayerNormSaved final_norm;
  int64_t positions = 0, padded = 0;  // the sequences' length, and padded to split over the TP ranks
  bool split = false;                 // the blocks ran on this rank's positions (sequence parallelism)
};

// `layers` blocks then the final layer norm. A pipeline stage runs a range of blocks, and the
// last stage the final norm too.
class Transformer : public Module {
 public:
  Transformer(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen);
  const TransformerShape& shape() const { return shape_; }
  int layers() const { return static_cast<int>(blocks_.size()); }
  const TransformerBlock& block(int layer) const { return blocks_.at(static_cast<std::size_t>(layer)); }
  const LayerNorm& final_norm() const { return final_norm_; }
  // The parameters of blocks [first, last), and of the final norm when last == layers(): what a
  // pipeline part of the model holds of its transformer, in the store's order.
  std::vector<Parameter*> part_parameters(int first, int last) const;
  // Hooks called around every block forward_blocks and backward_blocks run (null: none); the
  // hooks outlive their use.
  void set_block_hooks(BlockHooks* hooks) { hooks_ = hooks; }
  BlockHooks* block_hooks() const { return hooks_; }
  // Every block's recomputation (TransformerBlock::set_recompute).
  void set_recompute(spec::Recompute recompute) {
    for (auto& b : blocks_) b.set_recompute(recompute);
  }
  // The tensor-parallel splits of blocks [first, last) (see TransformerBlock::add_tp_splits).
  void add_tp_splits(std::vector<TpSplit>& splits, int first, int last) const;
  // Throws Error(invalid_argument) naming the first block whose heads or ffn width tp.size
  // does not divide, or when the group is malformed.
  void check_tensor_parallel(const TensorParallel& tp) const;

  // Every block, then the final norm.
  Tensor forward(Ops& ops, const Tensor& x, TransformerCache& cache) const;
  Tensor backward(Ops& ops, const Tensor& dy, const TransformerCache& cache) const;

  // Blocks [first, last) over x (B, S, hidden); the cache keeps their saved state (and
  // cache.first = first). Throws Error(invalid_argument) unless 0 <= first <= last <= layers.
  // Under sequence parallelism (tp.splits_sequence()) the blocks run on this rank's positions,
  // x and the result whole: causal sequences are padded at their end to a multiple of tp.size
  // (no earlier position sees the padding); bidirectional ones split only when they divide, and
  // otherwise run that call as plain tensor parallelism (every rank takes the same path).
  // x and dy are taken by value: a caller that hands them over saves a copy (on a device, a
  // launch and an allocation).
  Tensor forward_blocks(Ops& ops, Tensor x, int first, int last, TransformerCache& cache,
                        const TensorParallel& tp = {}) const;
  // Back through the blocks the cache's forward_blocks ran; returns d x.
  Tensor backward_blocks(Ops& ops, Tensor dy, const TransformerCache& cache, const TensorParallel& tp = {}) const;
  // The final norm alone (its input saved in cache.last).
  Tensor forward_final_norm(Ops& ops, Tensor x, TransformerCache& cache) const;
  Tensor backward_final_norm(Ops& ops, const Tensor& dy, const TransformerCache& cache) const;

 private:
  TransformerShape shape_;
  std::vector<TransformerBlock> blocks_;
  LayerNorm final_norm_;
  BlockHooks* hooks_ = nullptr;
};

}  // namespace braid::nn
