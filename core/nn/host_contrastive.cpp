// CLIP's contrastive loss (symmetric InfoNCE, learnable temperature) in the distributed
// form open_clip uses with local_loss=True and gather_with_grad=True.
//
// One rank holds n image/text pairs at rows [o, o + n) of the global batch of N. It
// all-gathers every rank's (L2-normalised) embeddings I_all, T_all (N, E) and computes only
// its own rows of the two N x N logit matrices:
//   image -> text: s * I_local T_all^T  (n x N),   text -> image: s * T_local I_all^T  (n x N),
// with s = exp(t), the label of local row i being column o + i. Its share of the loss is
//   (1 / 2N) * sum over its rows of [CE(image row) + CE(text row)],
// so the shares of all ranks add up to the single-device CLIP loss (the mean over all N
// rows of both directions). open_clip divides by n instead and lets DDP average gradients
// over the R ranks: with n = N / R that is the same gradient.
//
// Gradients: the local rows get d/d I_local and d/d T_local here; the gathered rows get
// d/d I_all and d/d T_all, which belong to the ranks that own those rows. gather_with_grad's
// backward (torch.distributed.nn.all_gather) sums them over ranks and hands each rank its
// rows; the caller does that reduce-scatter and adds the result to its local gradients.
// d/dt is a sum over ranks too. Cost per rank: two n x N x E GEMMs forward, four backward,
// instead of N x N x E each on every rank.
//
// The temperature: logit scale s = exp(t) is capped at 100 as open_clip caps it (there by
// clamping t to [0, ln 100] after each optimizer step, see clamp_logit_scale_param); above
// the cap s is constant and d/dt is zero.
#include <cmath>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/blas.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/optim.hpp"
#include "core/nn/parallel.hpp"
#include "core/nn/softmax_row.hpp"

namespace braid::nn {

float HostOps::contrastive_loss(const Tensor& local_image, const Tensor& local_text, const Tensor& all_image,
                                const Tensor& all_text, int64_t offset, float logit_scale_param,
                                ContrastiveGrads* grads) {
  if (local_image.rank() != 2 || all_image.rank() != 2)
    throw Error(Status::invalid_argument, "contrastive_loss: embeddings must be (rows, E), got " +
                                              shape_string(local_image.shape) + " and " +
                                              shape_string(all_image.shape));
  const int64_t n = local_image.dim(0), total = all_image.dim(0), e = local_image.dim(1);
  expect_shape(local_text, {n, e}, "contrastive_loss", "local_text");
  expect_shape(all_image, {total, e}, "contrastive_loss", "all_image");
  expect_shape(all_text, {total, e}, "contrastive_loss", "all_text");
  if (offset < 0 || offset + n > total)
    throw Error(Status::invalid_argument, "contrastive_loss: local rows [" + std::to_string(offset) + ", " +
                                              std::to_string(offset + n) + ") are not inside the " +
                                              std::to_string(total) + " gathered rows");
  if (grads) {
    reset(grads->local_image, {n, e});
    reset(grads->local_text, {n, e});
    reset(grads->all_image, {total, e});
    reset(grads->all_text, {total, e});
    grads->logit_scale_param = 0.0f;
  }
  if (n == 0) return 0.0f;

  const bool capped = logit_scale_param > kMaxLogitScaleParam;
  const auto s = static_cast<float>(std::exp(capped ? kMaxLogitScaleParam : logit_scale_param));
  // Rows 0..n-1: image -> text logits; rows n..2n-1: text -> image. Then, in place, the
  // gradient of this rank's share with respect to them.
  std::vector<float> logits(static_cast<std::size_t>(2 * n * total));
  std::vector<float> dlogits(grads ? logits.size() : 0);
  gemm(false, true, n, total, e, s, local_image.ptr(), e, all_text.ptr(), e, 0.0f, logits.data(), total);
  gemm(false, true, n, total, e, s, local_text.ptr(), e, all_image.ptr(), e, 0.0f, logits.data() + n * total, total);
  const auto share = static_cast<float>(1.0 / (2.0 * static_cast<double>(total)));
  std::vector<double> row_loss(static_cast<std::size_t>(2 * n));
  parallel_for(threads_, 2 * n, chunk_for(20.0 * total), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      row_loss[static_cast<std::size_t>(r)] = softmax_cross_entropy_row(
          logits.data() + r * total, total, offset + r % n, share, grads ? dlogits.data() + r * total : nullptr);
  });
  double sum = 0.0;
  for (double l : row_loss) sum += l;
  if (!grads) return static_cast<float>(sum * share);

  // logits = s * A B^T, so dA = s dL B, dB = s dL^T A, and d/dt = sum(dL * logits)
  // because d logits / dt = logits (s = exp(t)).
  const float* d_i2t = dlogits.data();
  const float* d_t2i = dlogits.data() + n * total;
  gemm(false, false, n, e, total, s, d_i2t, total, all_text.ptr(), e, 0.0f, grads->local_image.ptr(), e);
  gemm(true, false, total, e, n, s, d_i2t, total, local_image.ptr(), e, 0.0f, grads->all_text.ptr(), e);
  gemm(false, false, n, e, total, s, d_t2i, total, all_image.ptr(), e, 0.0f, grads->local_text.ptr(), e);
  gemm(true, false, total, e, n, s, d_t2i, total, local_text.ptr(), e, 0.0f, grads->all_image.ptr(), e);
  if (!capped) {
    double dt = 0.0;
    for (std::size_t i = 0; i < logits.size(); ++i) dt += static_cast<double>(dlogits[i]) * logits[i];
    grads->logit_scale_param = static_cast<float>(dt);
  }
  return static_cast<float>(sum * share);
}

}  // namespace braid::nn
