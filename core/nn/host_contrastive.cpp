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
// One rank (n = N): the text -> image logits are the transpose of the image -> text ones, so
// one N x N matrix L serves both directions: a softmax over each row and one over each
// column. dL = (row softmax + column softmax - 2 I) / 2N, and the whole gradient is
// dI = s dL T, dT = s dL^T I: three GEMMs in all, as a single-device PyTorch CLIP loss runs.
// It goes to local_*; all_* stay zero (local and gathered rows are the same tensor, and the
// caller adds the two).
//
// The computation is the tiled kernel of the C ABI (contrastive_tiled.hpp): with one tile
// spanning all N columns it stores the logits once (n x N floats, twice for two directions
// when n < N) and never recomputes them, the trainer's fastest form at its batch sizes; past
// 2^26 logits it takes the kernel's default tiles (trainer_contrastive_tile): bounded memory
// for one more GEMM (the backward's recomputation of the logits).
//
// The temperature: logit scale s = exp(t) is capped at 100 as open_clip caps it (there by
// clamping t to [0, ln 100] after each optimizer step, see clamp_logit_scale_param); above
// the cap s is constant and d/dt is zero. Below it d/dt = s d/ds.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/common/error.hpp"
#include "core/nn/contrastive_tiled.hpp"
#include "core/nn/host_ops.hpp"
#include "core/nn/optim.hpp"

namespace braid::nn {
namespace {

RowsView<const float> rows_of(const Tensor& t) { return {t.ptr(), t.dim(0), t.dim(1), t.dim(1)}; }
RowsView<float> rows_of(Tensor& t) { return {t.ptr(), t.dim(0), t.dim(1), t.dim(1)}; }

}  // namespace

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

  const bool capped = logit_scale_capped(logit_scale_param);
  ContrastiveProblem problem;
  problem.local_image = rows_of(local_image);
  problem.local_text = rows_of(local_text);
  problem.all_image = rows_of(all_image);
  problem.all_text = rows_of(all_text);
  problem.row_offset = offset;
  problem.logit_scale = static_cast<float>(std::exp(capped ? kMaxLogitScaleParam : logit_scale_param));
  problem.tile = trainer_contrastive_tile(n, total);
  problem.threads = threads_;
  // This rank's share of the global loss: (1 / 2N) of its rows' cross-entropies.
  const double share = 1.0 / (2.0 * static_cast<double>(total));
  if (!grads) {
    std::vector<float> lse(static_cast<std::size_t>(2 * n));
    return static_cast<float>(contrastive_tiled_forward(problem, {lse.data(), lse.data() + n}) * share);
  }
  const ContrastiveGradViews views{rows_of(grads->local_image), rows_of(grads->local_text), rows_of(grads->all_image),
                                   rows_of(grads->all_text)};
  double d_scale = 0.0;
  const double sum = contrastive_tiled_loss(problem, share, views, &d_scale);
  if (!capped) grads->logit_scale_param = static_cast<float>(d_scale * problem.logit_scale);
  return static_cast<float>(sum * share);
}

}  // namespace braid::nn
