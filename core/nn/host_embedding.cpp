// Input embeddings: token lookup (backward = scatter-add) and image patches (a linear
// layer over flattened non-overlapping P x P patches, i.e. a stride-P convolution).
#include <algorithm>
#include <string>

#include "core/common/error.hpp"
#include "core/nn/float4.hpp"
#include "core/nn/host_ops.hpp"

namespace braid::nn {
namespace {

void check_ids(std::span<const int32_t> ids, int64_t vocab, const char* op) {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error(Status::invalid_argument, std::string(op) + ": id " + std::to_string(ids[i]) + " at position " +
                                                std::to_string(i) + " is outside the vocabulary of " +
                                                std::to_string(vocab));
}

struct PatchGrid {
  int64_t images, channels, height, width, patch, rows, cols;  // rows x cols patches per image
  int64_t patches() const { return rows * cols; }
  int64_t patch_features() const { return channels * patch * patch; }
};

PatchGrid patch_grid(const Tensor& image, int64_t patch, const Tensor& weight, const char* op) {
  const std::string name(op);
  if (image.rank() != 3 && image.rank() != 4)
    throw Error(Status::invalid_argument,
                name + ": image must be (C, H, W) or (B, C, H, W), got " + shape_string(image.shape));
  PatchGrid g{image.rank() == 4 ? image.dim(0) : 1, image.dim(-3), image.dim(-2), image.dim(-1), patch, 0, 0};
  if (patch < 1 || g.height % patch != 0 || g.width % patch != 0 || g.height == 0 || g.width == 0)
    throw Error(Status::invalid_argument, name + ": patch size " + std::to_string(patch) +
                                              " does not divide the image's height and width " +
                                              shape_string(image.shape));
  g.rows = g.height / patch;
  g.cols = g.width / patch;
  if (weight.rank() != 2 || weight.dim(1) != g.patch_features())
    throw Error(Status::invalid_argument, name + ": weight must be (E, C*P*P) = (E, " +
                                              std::to_string(g.patch_features()) + "), got " +
                                              shape_string(weight.shape));
  return g;
}

// Calls copy(image offset, patch-matrix offset) for each run of P pixels of one patch
// row; the patch matrix is (images * patches, C*P*P). Patches do not overlap, so the
// image's gradient is the same walk with the copy reversed.
template <typename Copy>
void for_each_patch_run(const PatchGrid& g, Copy copy) {
  const int64_t p = g.patch;
  for (int64_t b = 0; b < g.images; ++b)
    for (int64_t pr = 0; pr < g.rows; ++pr)
      for (int64_t pc = 0; pc < g.cols; ++pc) {
        const int64_t row = ((b * g.rows + pr) * g.cols + pc) * g.patch_features();
        for (int64_t c = 0; c < g.channels; ++c)
          for (int64_t i = 0; i < p; ++i)
            copy(((b * g.channels + c) * g.height + pr * p + i) * g.width + pc * p, row + (c * p + i) * p);
      }
}

Tensor patchify(const PatchGrid& g, const Tensor& image) {
  Tensor patches;  // every element is written below: no fill first
  prepare_output(patches, {g.images * g.patches(), g.patch_features()});
  for_each_patch_run(g, [&](int64_t at_image, int64_t at_patch) {
    std::copy(image.ptr() + at_image, image.ptr() + at_image + g.patch, patches.ptr() + at_patch);
  });
  return patches;
}

}  // namespace

void HostOps::embedding_forward(const Tensor& table, std::span<const int32_t> ids, Tensor& out) {
  if (table.rank() != 2)
    throw Error(Status::invalid_argument, "embedding_forward: table must be (V, E), got " + shape_string(table.shape));
  check_ids(ids, table.dim(0), "embedding_forward");
  const int64_t e = table.dim(1);
  prepare_output(out, {static_cast<int64_t>(ids.size()), e});
  for (std::size_t i = 0; i < ids.size(); ++i)
    std::copy(table.ptr() + ids[i] * e, table.ptr() + (ids[i] + 1) * e, out.ptr() + static_cast<int64_t>(i) * e);
}

void HostOps::embedding_backward(std::span<const int32_t> ids, const Tensor& dout, Tensor& dtable) {
  if (dtable.rank() != 2)
    throw Error(Status::invalid_argument,
                "embedding_backward: dtable must be (V, E), got " + shape_string(dtable.shape));
  const int64_t e = dtable.dim(1);
  if (dout.numel() != static_cast<int64_t>(ids.size()) * e || (dout.rank() > 0 && dout.dim(-1) != e))
    throw Error(Status::invalid_argument, "embedding_backward: dout " + shape_string(dout.shape) + " is not " +
                                              std::to_string(ids.size()) + " rows of " + std::to_string(e));
  check_ids(ids, dtable.dim(0), "embedding_backward");
  for (std::size_t i = 0; i < ids.size(); ++i) {  // in order: repeated ids add up in a fixed order
    f4::add_to(dtable.ptr() + ids[i] * e, dout.ptr() + static_cast<int64_t>(i) * e, e);
  }
}

void HostOps::patch_embedding_forward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor* bias,
                                      Tensor& out) {
  const PatchGrid g = patch_grid(image, patch, weight, "patch_embedding_forward");
  linear_forward(patchify(g, image), weight, bias, out);
  if (image.rank() == 4)
    out.reshape({g.images, g.patches(), weight.dim(0)});
  else
    out.reshape({g.patches(), weight.dim(0)});
}

void HostOps::patch_embedding_backward(const Tensor& image, int64_t patch, const Tensor& weight, const Tensor& dout,
                                       Tensor* dimage, Tensor* dweight, Tensor* dbias) {
  const PatchGrid g = patch_grid(image, patch, weight, "patch_embedding_backward");
  Shape out_shape = {g.patches(), weight.dim(0)};
  if (image.rank() == 4) out_shape.insert(out_shape.begin(), g.images);
  expect_shape(dout, out_shape, "patch_embedding_backward", "dout");
  // The patches take dout's leading shape (the same rows in the same order), so dout needs
  // no copy to be flattened.
  Tensor patches = patchify(g, image);
  out_shape.back() = g.patch_features();
  patches.reshape(out_shape);
  Tensor dpatches;
  linear_backward(patches, weight, dout, dimage ? &dpatches : nullptr, dweight, dbias);
  if (dimage) {
    reset(*dimage, image.shape);
    for_each_patch_run(g, [&](int64_t at_image, int64_t at_patch) {
      std::copy(dpatches.ptr() + at_patch, dpatches.ptr() + at_patch + g.patch, dimage->ptr() + at_image);
    });
  }
}

}  // namespace braid::nn
