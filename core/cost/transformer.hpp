// Per-microbatch cost of the building blocks of every module kind: a transformer
// layer (attention incl. GQA + MLP), token and patch embeddings, LM head with its
// loss, and linear stacks (projectors). Megatron-style tensor parallelism. These price
// work and activations; the parameters a block holds come from spec::module_parameter_split
// (CostModel::module sets them), one count with the reference models.
#pragma once

#include <vector>

#include "core/cost/block.hpp"
#include "core/cost/comm.hpp"
#include "core/cost/device.hpp"
#include "core/spec/model.hpp"
#include "core/spec/run.hpp"

namespace braid::cost {

// What the backward pass of a block must produce.
struct GradNeeds {
  bool weights = true;  // the block trains
  bool inputs = true;   // something upstream trains, so gradients flow through
  bool any() const { return weights || inputs; }
};

// Whose kernels the blocks are priced as.
//  - megatron: Megatron-Core's, with the run's settings (what the planner plans for): q, k
//    and v in one GEMM, no position tables (rotary or none), an encoder's final norm and
//    pooling left to its head, the LM head over every position.
//  - reference: braid's own modules (core/nn/modules) as `braid train` runs them: q, k and v
//    as three GEMMs whose input gradients are added, learned position tables, each
//    encoder's final norm over all its tokens and its pooling, a decoder's head on its text
//    rows alone, an image's patches gathered before their GEMM, the gradients' norm and
//    zeroing once a step.
enum class Kernels { megatron, reference };

struct BlockContext {
  const DeviceModel* device;
  const CommModel* comm;
  const spec::TrainingSpec* training;
  int tp = 1;
  GroupShape tp_group;
  GradNeeds grads;
  Kernels kernels = Kernels::megatron;
};

// One kernel of a transformer layer (a GEMM, the attention core, a norm, a TP
// collective), for schedulers that place kernels one by one.
struct LayerKernel {
  const char* name = "";
  BlockCost cost;              // times and FLOPs; recomputation in recompute_s / comm_backward_s
  bool communication = false;  // a collective: never placed inside another collective's wait
};

// The kernels of one transformer layer, in forward order; they sum to transformer_layer's
// times and FLOPs (activations and parameters are the layer's). kLayerKernels of them:
// norm (attention), qkv, attention, attention out, TP all-reduce (attention), norm (mlp),
// mlp up, mlp down, TP all-reduce (mlp). nn::TransformerBlock runs the same nine steps in
// this order (its row-parallel kernels 3 and 7 include their all-reduce, so its kernels 4
// and 8 add the residual, and it applies GELU with mlp up).
inline constexpr int kLayerKernels = 9;
// What a layer's backward re-runs of its forward under `training`: full recomputation the whole
// layer, selective the attention core (its scores, which flash attention never keeps: none).
// The cost model prices it, and nn::TransformerBlock runs it.
spec::Recompute recomputed(const spec::TrainingSpec& training);
std::vector<LayerKernel> transformer_layer_kernels(const spec::ModuleSpec& m, double tokens, double samples,
                                                   const BlockContext& ctx);
// One transformer layer for a microbatch of `samples` sequences of `tokens`.
BlockCost transformer_layer(const spec::ModuleSpec& m, double tokens, double samples, const BlockContext& ctx);
// Token embedding lookup (vocab-parallel over TP).
BlockCost token_embedding(const spec::ModuleSpec& m, double tokens, double samples, const BlockContext& ctx);
// Patchify GEMM of an image encoder (or a generator's latent patchify).
BlockCost patch_embedding(const spec::ModuleSpec& m, double tokens, double samples, const BlockContext& ctx);
// Final norm + LM head GEMM (vocab-parallel) + softmax cross-entropy on fp32 logits, over
// every position (megatron) or over the `text` tokens of each sequence alone (reference).
BlockCost lm_head(const spec::ModuleSpec& m, double tokens, double text, double samples, const BlockContext& ctx);
// The pooled projection to the contrastive embedding (and, reference, its L2 normalisation).
BlockCost embedding_projection(const spec::ModuleSpec& m, double samples, const BlockContext& ctx);
// What braid's reference modules run around their blocks (Kernels::reference; zero for
// megatron). Position tables: `tables` lookups of a row per token, each added to the
// hidden, their gradients scattered back into the tables (an image's row and column tables
// are two, a text's one). An encoder's tail: its final norm over every token and the pooled
// row of each sample (an image's mean over its patches, a text's last token). A decoder's
// input: the prefix and the text's embeddings scattered into one sequence, and back.
BlockCost position_tables(double tables, double tokens, double samples, double hidden, const BlockContext& ctx);
BlockCost encoder_tail(const spec::ModuleSpec& m, double tokens, double samples, const BlockContext& ctx);
BlockCost decoder_input(double tokens, double text, double samples, double hidden, const BlockContext& ctx);
// A generator's unpatchify projection and its regression loss.
BlockCost generator_head(const spec::ModuleSpec& m, double tokens, double samples, const BlockContext& ctx);
// A stack of linear layers with GELU between them (projector): in -> ffn ... -> hidden.
BlockCost linear_stack(const spec::ModuleSpec& m, double in_width, double tokens, double samples,
                       const BlockContext& ctx);

// The kernels the blocks above are made of, each priced as they price it, for pricing one
// op call apart (braid train --profile-ops): an element-wise kernel charged `bytes` forward
// (and twice that backward); a residual add that streams `bytes`; the attention core over
// `heads` (batch x local heads) of `sq` queries and `sk` keys of size `d`.
BlockCost elementwise_op(double bytes, const BlockContext& ctx);
BlockCost residual_op(double bytes, const BlockContext& ctx);
// An embedding lookup of `rows` of `width` (a row gather) and its scatter-add: copies, which
// stream at the triad's rate (on a host the element-wise table is that of norms and GELU).
BlockCost embedding_op(double rows, double width, const BlockContext& ctx);
// A patch embedding's GEMM, `m` patches of `k` pixel values each to `n` features; its
// backward computes the weight's gradient alone (pixels need none). Reference: the patches
// are first copied out of the image, again in backward.
BlockCost patch_projection_op(double m, double n, double k, const BlockContext& ctx);
// `elements` zeroed or scaled in place: contiguous streams, at the streaming rate
// (DeviceModel::streaming_seconds: the measured add's, else the triad's). `rows` of `width`
// gathered or scattered, and `elements` read for a squared norm, at the triad's: a call per
// row, and a reduction, which the add's rate in the caches would price far short on a host.
double rows_copy_seconds(double rows, double width, const BlockContext& ctx);
double zero_seconds(double elements, const BlockContext& ctx);
double scale_seconds(double elements, const BlockContext& ctx);
double squared_norm_seconds(double elements, const BlockContext& ctx);
// The CLIP loss of `local` rows against `all` rows of `dim`: its logits and softmaxes
// (forward_s), then the gradients of both sides (backward_s). braid runs both in one call.
BlockCost contrastive_loss_op(double local, double all, double dim, const BlockContext& ctx);
BlockCost attention_core(double sq, double sk, double d, double heads, bool causal, bool dropout,
                         const BlockContext& ctx);
// Bytes those kernels are charged over `elements` of `E` bytes (a pass reads and writes):
// a layer norm; an activation (a gated one reads two inputs); a residual add (two read, one
// written); an embedding lookup or its scatter-add over `rows` of `width`; cross-entropy on
// fp32 logits (cast, max, exp-sum, normalise: Megatron's vocab-parallel loss).
inline double norm_bytes(double elements, double E) { return 2 * elements * E; }
inline double activation_bytes(double elements, bool gated, double E) { return (gated ? 3 : 2) * elements * E; }
inline double residual_bytes(double elements, double E) { return 3 * elements * E; }
inline double embedding_bytes(double rows, double width, double E) { return 2 * rows * width * E; }
inline double cross_entropy_bytes(double rows, double vocab, double E) { return rows * vocab * (E + 4 + 8); }

// FLOPs of one transformer layer's forward for `tokens` tokens of one sequence,
// unsharded (for reports and hand checks): GEMMs + attention scores and context.
double transformer_layer_forward_flops(const spec::ModuleSpec& m, double tokens, spec::Attention attention);

}  // namespace braid::cost
