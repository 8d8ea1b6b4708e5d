// The ViT image encoder: P x P patches projected to the hidden width (a stride-P
// convolution), plus a position embedding, then pre-LN blocks and a final norm.
//
// Images of any side that P divides, up to max_image_size, go through the same weights:
// the number of patches follows the image. The position embedding is factorised into a
// learned row table and a learned column table (G = max_image_size / P rows each); patch
// (r, c) gets row[r] + col[c], as NaViT's factorised embeddings (Dehghani et al. 2023).
// Unlike one table over the flattened patch index, a row or column means the same place
// at every resolution and aspect ratio, and no resolution needs an interpolated table.
//
// Pooled output: the mean of the final tokens over the patches (global average pooling,
// as ViT's "GAP" variant, SigLIP's and open_clip's pool_type="avg"), not a CLS token: every
// patch receives the contrastive gradient, there is no extra token to prepend and strip, and
// the per-patch sequence handed to an MLLM projector is exactly the patch tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/modules/encoder_part.hpp"
#include "core/nn/modules/transformer.hpp"

namespace braid::nn {

struct ImageEncoderShape {
  TransformerShape transformer;
  int64_t patch = 0;
  int64_t channels = 3;
  int64_t max_image_size = 0;  // largest image side, pixels
};

// What a part's backward needs from its forward. Every part knows the batch and the tokens
// per image (from the images, or from the previous part's hidden); the patch grid only the
// first part (it embeds), the per-token samples only the last (it pools).
struct ImageEncoderCache {
  EncoderPart part;  // the part whose forward filled this cache
  Tensor images;     // (B, C, H, W), first part only
  int64_t batch = 0, patches = 0;
  std::vector<int32_t> grid_rows, grid_cols;  // per token (B*N): its patch row and column (first part)
  std::vector<int32_t> samples;               // per token: its sample, for the pooling (last part)
  TransformerCache transformer;               // the part's blocks (and the final norm for the last part)
};

// The state of a step-by-step forward and backward (ImageEncoder::forward_embed ...).
struct ImageEncoderSteps {
  ImageEncoderCache cache;
  Tensor h;        // forward: the hidden between blocks
  Tensor d;        // backward: its gradient between blocks
  BlockGrad grad;  // backward: inside a block
};

class ImageEncoder : public Module {
 public:
  ImageEncoder(ParameterStore& store, std::string name, const ImageEncoderShape& shape, bool frozen);
  const ImageEncoderShape& shape() const { return shape_; }
  int layers() const { return transformer_.layers(); }
  EncoderPart whole() const { return {0, layers()}; }

  // The whole encoder, i.e. forward_part / backward_part of whole().
  // images (B, C, H, W), H and W multiples of the patch, at most max_image_size:
  // tokens (B, N, hidden) with N = (H/P) * (W/P), row-major over the patch grid; pooled (B, hidden).
  EncoderOutput forward(Ops& ops, const Tensor& images, ImageEncoderCache& cache) const;
  // Gradients of the tokens and/or of the pooled output (null: none flows there). Adds the
  // parameter gradients; returns the images' gradient when `want_dimages`, else empty.
  Tensor backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const ImageEncoderCache& cache,
                  bool want_dimages = false) const;

  // First part: `images` (B, C, H, W), `hidden` ignored; other parts: `hidden` (B, N, hidden),
  // the previous part's output, `images` ignored. Returns in `tokens` the part's output hidden
  // (B, N, hidden): the final tokens for the last part, which alone also fills `pooled` (B,
  // hidden), the mean over the N tokens of each image. Throws Error(invalid_argument) unless
  // 0 <= first <= last <= layers and the input is there with the right shape.
  EncoderOutput forward_part(Ops& ops, const EncoderPart& part, const Tensor* images, const Tensor* hidden,
                             ImageEncoderCache& cache) const;
  // The last part takes the gradients of the tokens and/or of the pooled output, as backward;
  // other parts the gradient of their output hidden in `d_tokens` (`d_pooled` must be null).
  // Adds the part's parameter gradients; returns d hidden (B, N, hidden) for a non-first part,
  // for the first the images' gradient when `want_dimages`, else empty.
  Tensor backward_part(Ops& ops, const EncoderPart& part, const Tensor* d_tokens, const Tensor* d_pooled,
                       const ImageEncoderCache& cache, bool want_dimages = false) const;
  // The parameters a part owns (patch embedding and position tables with the first, the final
  // norm with the last), in the store's order.
  std::vector<Parameter*> part_parameters(const EncoderPart& part) const;

  // Megatron tensor parallelism of the blocks for every later forward and backward (default:
  // size 1, none); the patch embedding, position tables and norms stay replicated. Slices the parameters for this rank,
  // or gathers them whole when tp.size is 1 (collective over the old group). Throws Error(invalid_argument) naming the
  // block when tp.size does not divide the heads or the ffn width, or the group is
  // malformed; a refused group changes nothing.
  void set_tensor_parallel(TensorParallel tp);
  // Block `layer`, and the hooks called around every block it runs (ZeRO; null: none).
  const TransformerBlock& block(int layer) const { return transformer_.block(layer); }
  void set_block_hooks(BlockHooks* hooks) { transformer_.set_block_hooks(hooks); }
  void set_recompute(spec::Recompute recompute) { transformer_.set_recompute(recompute); }
  const TensorParallel& tensor_parallel() const { return tp_.group(); }
  // Forgets the group's callback (its owner is going away); the slices stay.
  void detach_tensor_parallel() { tp_.detach(); }

  // The whole encoder step by step, as a colocated executor runs the bubble scheduler's
  // encoder tasks: forward_embed, forward_kernel over every block's kernels in order
  // (TransformerBlock::kKernels per layer), forward_finish (final norm, pooling); then
  // backward_start, backward_kernel in reverse, backward_embed. The same arithmetic as
  // forward() and backward(), cut into pieces.
  void forward_embed(Ops& ops, const Tensor& images, ImageEncoderSteps& s) const;
  void forward_kernel(Ops& ops, int layer, int kernel, ImageEncoderSteps& s) const;
  EncoderOutput forward_finish(Ops& ops, ImageEncoderSteps& s) const;
  void backward_start(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, ImageEncoderSteps& s) const;
  void backward_kernel(Ops& ops, int layer, int kernel, ImageEncoderSteps& s) const;
  // Adds the embedding's parameter gradients; returns the images' gradient when `want_dimages`.
  Tensor backward_embed(Ops& ops, ImageEncoderSteps& s, bool want_dimages = false) const;

 private:
  // Patches and positions of the images into (B, N, hidden); fills the cache's grid.
  Tensor embed(Ops& ops, const Tensor& images, ImageEncoderCache& c) const;
  // The last part's end: final norm and the pooled mean.
  EncoderOutput finish(Ops& ops, Tensor h, ImageEncoderCache& c) const;
  // The last part's start of the backward: d of the final norm's input.
  Tensor head_gradient(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const ImageEncoderCache& c) const;
  Tensor embed_backward(Ops& ops, const Tensor& dx, const ImageEncoderCache& c, bool want_dimages) const;

  ImageEncoderShape shape_;
  Parameter* patch_weight_;
  Parameter* patch_bias_;
  Parameter* row_table_;
  Parameter* col_table_;
  Transformer transformer_;
  TensorParallelState tp_;
};

}  // namespace braid::nn
