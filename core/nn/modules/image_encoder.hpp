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

#include "core/nn/modules/transformer.hpp"

namespace braid::nn {

struct ImageEncoderShape {
  TransformerShape transformer;
  int64_t patch = 0;
  int64_t channels = 3;
  int64_t max_image_size = 0;  // largest image side, pixels
};

struct ImageEncoderCache {
  Tensor images;  // (B, C, H, W)
  int64_t batch = 0, patches = 0;
  std::vector<int32_t> grid_rows, grid_cols;  // per token (B*N): its patch row and column
  std::vector<int32_t> samples;               // per token: its sample, for the pooling
  TransformerCache transformer;
};

class ImageEncoder : public Module {
 public:
  ImageEncoder(ParameterStore& store, std::string name, const ImageEncoderShape& shape, bool frozen);
  const ImageEncoderShape& shape() const { return shape_; }

  // images (B, C, H, W), H and W multiples of the patch, at most max_image_size:
  // tokens (B, N, hidden) with N = (H/P) * (W/P), row-major over the patch grid; pooled (B, hidden).
  EncoderOutput forward(Ops& ops, const Tensor& images, ImageEncoderCache& cache) const;
  // Gradients of the tokens and/or of the pooled output (null: none flows there). Adds the
  // parameter gradients; returns the images' gradient when `want_dimages`, else empty.
  Tensor backward(Ops& ops, const Tensor* d_tokens, const Tensor* d_pooled, const ImageEncoderCache& cache,
                  bool want_dimages = false) const;

 private:
  ImageEncoderShape shape_;
  Parameter* patch_weight_;
  Parameter* patch_bias_;
  Parameter* row_table_;
  Parameter* col_table_;
  Transformer transformer_;
};

}  // namespace braid::nn
