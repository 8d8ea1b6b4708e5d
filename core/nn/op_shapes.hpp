// The shapes of the ops' outputs from their inputs' shapes: the one rule DeviceOps allocates
// outputs by and the host device plugin checks a caller's outputs against before an op writes
// (an output of the right size but another shape is refused with nothing written). Inputs
// are assumed well-formed; the ops themselves check them.
#pragma once

#include <cstdint>

#include "core/common/error.hpp"
#include "core/nn/tensor.hpp"

namespace braid::nn {

// `shape` with its last dimension set to `last`.
inline Shape with_last(Shape shape, int64_t last) {
  if (shape.empty()) throw Error(Status::invalid_argument, "a tensor without axes has no features");
  shape.back() = last;
  return shape;
}

// linear_forward's y: x's shape with the weight's output features last.
inline Shape linear_output_shape(const Shape& x, const Shape& weight) { return with_last(x, weight.front()); }

// layernorm_forward's mean and rstd: one value per row of the last dimension.
inline Shape layernorm_stats_shape(const Shape& x) {
  const int64_t features = x.empty() ? 0 : x.back();
  return {features ? shape_numel(x) / features : 0};
}

// embedding_forward's out: one row of the table's width per id.
inline Shape embedding_output_shape(int64_t ids, const Shape& table) { return {ids, table.back()}; }

// patch_embedding_forward's out: (B,) patches x E from (B, C, H, W) or (C, H, W).
inline Shape patch_embedding_output_shape(const Shape& image, int64_t patch, const Shape& weight) {
  const int64_t patches = (image[image.size() - 2] / patch) * (image.back() / patch);
  return image.size() == 4 ? Shape{image.front(), patches, weight.front()} : Shape{patches, weight.front()};
}

}  // namespace braid::nn
