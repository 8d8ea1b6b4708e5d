// The pre-LN transformer block (GPT-2, CLIP, ViT) and a stack of them with the final norm:
//   x2 = x + Wo attention(LN1(x) Wq, LN1(x) Wk, LN1(x) Wv)
//   y  = x2 + W2 GELU(W1 LN2(x2))
// every linear with a bias; attention bidirectional or causal. Separate Q, K and V
// projections (not one fused QKV GEMM) keep every step an op of the Ops interface, and
// are Megatron's column-parallel split by heads as they stand.
#pragma once

#include <string>
#include <vector>

#include "core/nn/modules/layers.hpp"

namespace braid::nn {

// What a block's backward needs from its forward.
struct BlockCache {
  Tensor x, h1, q, k, v, attn, x2, h2, f, g;  // inputs of each step, (B, S, ·)
  LayerNormSaved ln1, ln2;
  AttentionSaved attention;
};

class TransformerBlock : public Module {
 public:
  // Weights ~ normal(0, 0.02); the two projections back into the residual stream
  // (attention output, second MLP layer) ~ normal(0, 0.02 / sqrt(2 * layers)), GPT-2's
  // scaling that keeps the residual's variance from growing with depth.
  TransformerBlock(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen);

  // x (B, S, hidden) -> (B, S, hidden).
  Tensor forward(Ops& ops, const Tensor& x, BlockCache& cache) const;
  // dy (B, S, hidden) -> dx; adds the parameter gradients.
  Tensor backward(Ops& ops, const Tensor& dy, const BlockCache& cache) const;

 private:
  TransformerShape shape_;
  LayerNorm ln1_;
  Linear q_, k_, v_, out_;
  LayerNorm ln2_;
  Linear fc1_, fc2_;
};

struct TransformerCache {
  std::vector<BlockCache> blocks;
  Tensor last;  // input of the final norm
  LayerNormSaved final_norm;
};

// `layers` blocks then the final layer norm.
class Transformer : public Module {
 public:
  Transformer(ParameterStore& store, std::string name, const TransformerShape& shape, bool frozen);
  const TransformerShape& shape() const { return shape_; }

  Tensor forward(Ops& ops, const Tensor& x, TransformerCache& cache) const;
  Tensor backward(Ops& ops, const Tensor& dy, const TransformerCache& cache) const;

 private:
  TransformerShape shape_;
  std::vector<TransformerBlock> blocks_;
  LayerNorm final_norm_;
};

}  // namespace braid::nn
