// CLIP's contrastive loss in its distributed local-loss form (see host_contrastive.cpp for
// the math), computed tile by tile as Inf-CL does (arXiv 2410.17243): the n x N logits are
// never stored whole. Per tile of columns, the logits come from one GEMM and feed an online
// log-sum-exp per row (running max and rescaled sum); the backward recomputes each tile from
// the embeddings and those log-sum-exps. Working memory: O(n * tile + N) floats besides the
// inputs and gradients, whatever N is.
//
// This is the op behind the C ABI's braid_contrastive_forward/backward and the trainer's
// HostOps::contrastive_loss. It sees only raw row-major views, so a caller's strided tensors
// need no copy, and links only OpenBLAS (libbraid.so carries it).
#pragma once

#include <cstdint>

namespace braid::nn {

// rows x cols floats, row r at data + r * stride (stride >= cols), owned by the caller.
template <class T>
struct RowsView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;
};

// Columns per tile when the caller gives 0: each GEMM is at least n x 512 x E, the tile
// buffers 2 x n x 512 floats (one tile of n x 512 when local and all rows are the same).
inline constexpr int64_t kDefaultContrastiveTile = 512;

// The trainer's tile for n local rows of N gathered ones: all N columns at once while the
// logits fit in 2^26 floats (256 MiB; its fastest form at its batch sizes), else the
// default tiles (bounded memory for one more GEMM, the backward's recomputation).
inline int64_t trainer_contrastive_tile(int64_t n, int64_t total) {
  return 2 * n * total <= (int64_t{1} << 26) ? total : 0;
}

// One rank's problem. local_* (n, E): its L2-normalised embeddings; all_* (N, E): every
// rank's, this rank's at rows [row_offset, row_offset + n). logits = logit_scale * I T^T.
// When local and all are the same memory (n == N, one process), the text -> image logits
// are the transpose of the image -> text ones and one GEMM per tile serves both directions.
struct ContrastiveProblem {
  RowsView<const float> local_image, local_text, all_image, all_text;
  int64_t row_offset = 0;
  float logit_scale = 1.0f;  // s, the exponentiated scale; finite
  int64_t tile = 0;          // columns per tile; 0: kDefaultContrastiveTile
  int threads = 0;           // threads of the passes between GEMMs (OpenBLAS runs its own); <= 0: all
};

// Log-sum-exp of each local row of both directions (n each): what the backward needs.
struct ContrastiveStats {
  float* image_to_text = nullptr;  // row i: LSE of s * I_local[i] T_all^T
  float* text_to_image = nullptr;  // row i: LSE of s * T_local[i] I_all^T
};

// Gradients, overwritten; a view with null data is not computed. all_* are the gathered
// rows' gradients (the caller reduce-scatters them to their owners, who add them to their
// local_*). Only that sum is defined: when local and all are the same memory, the whole
// gradient of each modality goes to local_* (or to all_* when local_* is not wanted) and the
// other is zeroed.
struct ContrastiveGradViews {
  RowsView<float> local_image, local_text, all_image, all_text;
};

// Throws invalid_argument naming the argument and the shapes unless the problem is well
// formed: E equal everywhere, local_text (n, E), all_text (N, E), n <= N, the local rows
// inside the gathered ones, tile >= 0, a finite scale, non-null data for non-empty views.
void check_contrastive_problem(const ContrastiveProblem& problem);

// Writes the 2n log-sum-exps and returns the sum over the local rows of both directions'
// cross-entropies, sum_i [LSE_i - logit(i, row_offset + i)] (the loss before its 1 / (2n)
// or 1 / (2N)).
double contrastive_tiled_forward(const ContrastiveProblem& problem, const ContrastiveStats& stats);

// The gradients of weight * (that sum) given the forward's stats: d logits = weight * (P -
// onehot), P = exp(logits - LSE). Returns d / d logit_scale.
double contrastive_tiled_backward(const ContrastiveProblem& problem, const ContrastiveStats& stats, double weight,
                                  const ContrastiveGradViews& grads);

// Both at once (the trainer's call): returns the sum of cross-entropies, writes the
// gradients of weight * it and *d_scale. When one tile spans all N columns the logits are
// computed once, not recomputed for the backward.
double contrastive_tiled_loss(const ContrastiveProblem& problem, double weight, const ContrastiveGradViews& grads,
                              double* d_scale);

// open_clip's local loss (ClipLoss(local_loss=True)), what the C ABI's contrastive op
// returns: the mean over the n local rows of both directions' cross-entropies, sum / 2n
// (0 for n = 0), and its backward from d loss = grad_loss. Returns d / d logit_scale.
double contrastive_local_mean_forward(const ContrastiveProblem& problem, const ContrastiveStats& stats);
double contrastive_local_mean_backward(const ContrastiveProblem& problem, const ContrastiveStats& stats,
                                       double grad_loss, const ContrastiveGradViews& grads);

}  // namespace braid::nn
